#!/usr/bin/env bash
# Print the path of a cached Debian bookworm root (a tarball for `docker import`) that
# boots systemd as PID 1 and can install gpuguard's .deb; build it when missing.
# The cache is keyed by the debootstrap arguments, so changing them builds a new root.
#   scripts/systemd-root.sh            -> prints /var/cache/gpuguard-tests/debian-root-<key>.tar
# Needs root and debootstrap, and reaches Debian's registry only when building.
set -euo pipefail

suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-venv: the .deb builds its venv at install time with /usr/bin/python3;
# procps: /bin/kill, which the unit's ExecReload= runs (every real host has it).
packages=systemd,systemd-sysv,python3,python3-venv,procps
args=(--variant=minbase "--include=$packages" "$suite")
cache=${GPUGUARD_TEST_CACHE:-/var/cache/gpuguard-tests}
key=$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-16)
tarball="$cache/debian-root-$key.tar"

if [ -s "$tarball" ]; then
    echo "$tarball"
    exit 0
fi

command -v debootstrap >/dev/null || { echo "debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
# A failed or interrupted build leaves nothing behind, not even a half-written tarball.
trap 'rm -rf "$work"' EXIT
debootstrap "${args[@]}" "$work/root" "$mirror" > "$work/debootstrap.log" 2>&1 || {
    echo "debootstrap failed; the end of its log:" >&2
    tail -20 "$work/debootstrap.log" >&2
    tail -20 "$work/root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    exit 1
}
# Apt's package lists and downloaded .debs are not needed to boot; the root stays small.
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
# A container has no console to log in on and no udev or clock to manage. Measured on
# bookworm: it reaches `running` without these masks too (the units skip themselves in a
# container); they keep a unit that a later point release starts here out of the way.
chroot "$work/root" systemctl mask getty@tty1.service console-getty.service \
    systemd-udevd.service systemd-udev-trigger.service systemd-timesyncd.service \
    >/dev/null 2>&1 || true
tar -C "$work/root" --numeric-owner -cf "$work/root.tar" .
mv "$work/root.tar" "$tarball"
echo "$tarball"
