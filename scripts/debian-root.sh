#!/usr/bin/env bash
# Print the path of a cached Debian bookworm root (a tarball for `docker import`) of one
# kind; build it when missing. The cache is keyed by the debootstrap arguments, so
# changing them builds a new root (and each kind has a key of its own).
#   scripts/debian-root.sh systemd     -> boots systemd as PID 1, installs gpuguard's .deb
#                                         (tests/systemd_pid1; scripts/systemd-root.sh)
#   scripts/debian-root.sh image-base  -> python3 and its venv, nothing else: the base
#                                         packaging/docker/Dockerfile is built on in the
#                                         tests (tests/image), where python:3.11-slim
#                                         cannot be pulled
# Prints /var/cache/gpuguard-tests/<name>-<key>.tar. Needs root and debootstrap, and
# reaches Debian's registry only when building.
set -euo pipefail

kind=${1:?systemd|image-base}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
case "$kind" in
systemd)
    # python3-venv: the .deb builds its venv at install time with /usr/bin/python3;
    # procps: /bin/kill, which the unit's ExecReload= runs (every real host has it).
    packages=systemd,systemd-sysv,python3,python3-venv,procps
    name=debian-root
    ;;
image-base)
    # python3-venv: the Dockerfile makes /opt/gpuguard/venv with `python3 -m venv`, as on
    # python:3.11-slim (whose python is in /usr/local/bin; Debian's is in /usr/bin).
    packages=python3,python3-venv
    name=debian-image-base
    ;;
*)
    echo "unknown kind $kind (systemd or image-base)" >&2
    exit 2
    ;;
esac
args=(--variant=minbase "--include=$packages" "$suite")
cache=${GPUGUARD_TEST_CACHE:-/var/cache/gpuguard-tests}
key=$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-16)
tarball="$cache/$name-$key.tar"

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
# Apt's package lists and downloaded .debs are not needed to run; the root stays small.
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
case "$kind" in
systemd)
    # A container has no console to log in on and no udev or clock to manage. Measured on
    # bookworm: it reaches `running` without these masks too (the units skip themselves
    # in a container); they keep a unit that a later point release starts here out of
    # the way.
    chroot "$work/root" systemctl mask getty@tty1.service console-getty.service \
        systemd-udevd.service systemd-udev-trigger.service systemd-timesyncd.service \
        >/dev/null 2>&1 || true
    ;;
image-base)
    # What python:3.11-slim leaves out too: documentation, manual pages, translations.
    rm -rf "$work/root/usr/share/doc/"* "$work/root/usr/share/man/"* \
        "$work/root/usr/share/locale/"* "$work/root/usr/share/info/"*
    ;;
esac
tar -C "$work/root" --numeric-owner -cf "$work/root.tar" .
mv "$work/root.tar" "$tarball"
echo "$tarball"
