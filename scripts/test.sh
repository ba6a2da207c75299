#!/usr/bin/env bash
# Set up everything the tests need and run the whole suite (the README's test command;
# .ci/run calls exactly this). Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)        # builds the fake libnvidia-ml
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)      # promtool checks our metrics
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)        # a real engine for toolkit.docker
command -v busybox >/dev/null 2>&1 || need_apt+=(busybox-static)   # test images via docker import
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)  # verify the unit files
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)  # the router
[ -x /usr/bin/prometheus-alertmanager ] || need_apt+=(prometheus-alertmanager)  # fleet test
command -v make >/dev/null 2>&1 || need_apt+=(make)                # make package
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)  # systemd as PID 1 (tests/systemd_pid1)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null \
    || need_apt+=(python3-venv)                                    # the .deb's own venv
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing: ${need_apt[*]}; run as root or: sudo apt-get install ${need_apt[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'

echo "== ruff"; .venv/bin/ruff check gpuguard tests scripts bench
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest "$@"
