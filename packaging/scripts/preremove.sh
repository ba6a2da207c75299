#!/bin/sh
# Stop what runs from the venv before it goes (an upgrade starts it again).
if [ -d /run/systemd/system ]; then
    systemctl stop gpuguard.service gpuguard-textfile.timer 2>/dev/null || true
fi
exit 0
