#!/bin/sh
# The venv was made by postinstall, so the package manager does not know its files.
rm -rf /opt/gpuguard/venv
rmdir /opt/gpuguard 2>/dev/null || true
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
exit 0
