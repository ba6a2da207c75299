#!/usr/bin/env bash
# Start or stop a private Docker engine for the tests: its own socket, data and exec
# roots, vfs storage, no iptables, no bridge (containers use the host network).
# Its config names an extra runtime `nvidia` (pointing at runc), as the NVIDIA
# Container Toolkit writes it, so toolkit.docker has something real to report.
#   scripts/dockerd-private.sh start DIR   -> prints the DOCKER_HOST to use
#   scripts/dockerd-private.sh stop DIR
#
# Its containers' cgroups go under a cgroup parent of this engine alone (not Docker's
# shared /docker, which would outlive the engine in every hierarchy of the host), and
# `stop` removes that parent: the host's cgroup tree is left as it was found.
set -euo pipefail
cmd=${1:?start|stop}; dir=${2:?state directory}

# Every mounted cgroup hierarchy (v1 and v2): field 5 of mountinfo is the mount point,
# and the file system type follows the " - " separator.
cgroup_mounts() {
    awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break;
           if ($(i + 1) == "cgroup" || $(i + 1) == "cgroup2") print $5 }' /proc/self/mountinfo
}

case "$cmd" in
start)
    mkdir -p "$dir"
    # Unique per engine: two runs of the suite at once (two pytest dirs named dockerd0)
    # must not share, or remove, each other's parent.
    parent="gpuguard-test-$(basename "$dir")-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
    echo "$parent" > "$dir/cgroup-parent"
    cat > "$dir/daemon.json" <<JSON
{"runtimes": {"nvidia": {"path": "$(command -v runc)"}}}
JSON
    dockerd --host "unix://$dir/docker.sock" --data-root "$dir/data" --exec-root "$dir/exec" \
        --pidfile "$dir/docker.pid" --config-file "$dir/daemon.json" \
        --storage-driver=vfs --iptables=false --ip-masq=false --bridge=none \
        --cgroup-parent "/$parent" \
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
    # The engine's cgroup parent, in every hierarchy: deepest first, and nothing but
    # directories below the parent (rmdir refuses a cgroup that still has processes).
    if [ -s "$dir/cgroup-parent" ]; then
        parent=$(cat "$dir/cgroup-parent")
        left=0
        while read -r mnt; do
            [ -d "$mnt/$parent" ] || continue
            find "$mnt/$parent" -depth -type d -exec rmdir {} + 2>/dev/null \
                || { echo "cgroup $mnt/$parent is still in use" >&2; left=1; }
        done < <(cgroup_mounts)
        exit "$left"
    fi
    ;;
esac
