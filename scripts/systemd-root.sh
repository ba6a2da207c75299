#!/usr/bin/env bash
# Print the path of a cached Debian bookworm root (a tarball for `docker import`) that
# boots systemd as PID 1 and can install gpuguard's .deb; build it when missing
# (scripts/debian-root.sh, which the image tests' base root shares).
#   scripts/systemd-root.sh            -> prints /var/cache/gpuguard-tests/debian-root-<key>.tar
exec "$(dirname "$0")/debian-root.sh" systemd
