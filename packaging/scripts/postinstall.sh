#!/bin/sh
# Build gpuguard's own virtual environment from the wheels the package carries.
set -e
rm -rf /opt/gpuguard/venv
/usr/bin/python3 -m venv /opt/gpuguard/venv
/opt/gpuguard/venv/bin/pip install --quiet --no-index --find-links /opt/gpuguard/wheels gpuguard
# who besides root may read the daemon's verdict (`gpuguard status`, its status socket);
# made here only if missing, and then removed again with the package (the marker)
if ! getent group gpuguard >/dev/null 2>&1 && groupadd --system gpuguard; then
    touch /opt/gpuguard/group-created
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
