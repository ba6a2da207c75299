#!/bin/sh
# The gpuguard group goes only if postinstall made it, and not on an upgrade
# (deb: remove or purge; rpm: 0 packages left)
case "${1:-}" in
remove | purge | 0)
    if [ -f /opt/gpuguard/group-created ]; then
        groupdel gpuguard 2>/dev/null || true
        rm -f /opt/gpuguard/group-created
    fi
    ;;
esac
# The venv was made by postinstall, so the package manager does not know its files.
rm -rf /opt/gpuguard/venv
rmdir /opt/gpuguard 2>/dev/null || true
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
exit 0
