#!/usr/bin/env bash
# Start or stop a private Docker engine for the tests: its own socket, data and exec
# roots, vfs storage, no iptables, no bridge (containers use the host network).
# Its config names an extra runtime `nvidia` (pointing at runc), as the NVIDIA
# Container Toolkit writes it, so toolkit.docker has something real to report.
#   scripts/dockerd-private.sh start DIR   -> prints the DOCKER_HOST to use
#   scripts/dockerd-private.sh stop DIR
set -euo pipefail
cmd=${1:?start|stop}; dir=${2:?state directory}
case "$cmd" in
start)
    mkdir -p "$dir"
    cat > "$dir/daemon.json" <<JSON
{"runtimes": {"nvidia": {"path": "$(command -v runc)"}}}
JSON
    dockerd --host "unix://$dir/docker.sock" --data-root "$dir/data" --exec-root "$dir/exec" \
        --pidfile "$dir/docker.pid" --config-file "$dir/daemon.json" \
        --storage-driver=vfs --iptables=false --ip-masq=false --bridge=none \
        > "$dir/dockerd.log" 2>&1 &
    for _ in $(seq 1 100); do
        if docker -H "unix://$dir/docker.sock" version >/dev/null 2>&1; then
            echo "unix://$dir/docker.sock"
            exit 0
        fi
        sleep 0.2
    done
    echo "dockerd did not start; its log:" >&2
    tail -20 "$dir/dockerd.log" >&2
    exit 1
    ;;
stop)
    if [ -f "$dir/docker.pid" ]; then
        pid=$(cat "$dir/docker.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    # dockerd leaves its network namespace mount behind: unmount what lies under $dir
    awk -v d="$dir" '$2 ~ "^"d {print $2}' /proc/mounts | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    ;;
esac
