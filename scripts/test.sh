#!/usr/bin/env bash
# Set up everything the tests need and run the whole suite (the README's test command;
# .ci/run calls exactly this). Safe to run again: it installs only what is missing.
#
# The run leaves the host as it found it, and proves it (issue 18): scripts/hostguard.py
# records what the suite could leave behind (mounts, cgroups, listening sockets, leaked
# processes, kernel-log lines, gpuguard's files, services enabled at boot) before
# anything else, and again at the end, whatever failed. Any difference fails the run,
# named one a line. See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || {
    echo "$python is missing: scripts/hostguard.py needs it before anything is installed" >&2
    exit 1
}
guard_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpuguard-hostguard.XXXXXX")
trap 'rm -rf "$guard_dir"' EXIT  # until finish (below) takes over
guard() { "$python" scripts/hostguard.py "$@"; }
guard snapshot "$guard_dir/before.json"

# --- leaked processes: a cgroup of the run's own ---------------------------------------
# Every process the run starts is born in it, and stays in it even when it double-forks,
# starts a new session or clears its environment; whatever is still in it at the end was
# left behind. cgroup v2 first (it tracks processes with no controller attached, so
# nothing is limited), else v1's pids hierarchy; an environment marker when neither can
# be written (a daemon that clears its environment then escapes).
run_id="gpuguard-test-run-$$-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
export GPUGUARD_TEST_RUN=$run_id
run_cgroup=""
home_cgroup=""

cgroup_mount() {  # TYPE [CONTROLLER] -> the first mount point of such a hierarchy
    awk -v type="$1" -v want="${2:-}" '{
        for (i = 7; i < NF && $i != "-"; i++) {}    # optional fields end at "-"
        if ($(i + 1) != type) next
        if (want != "" && index("," $(i + 3) ",", "," want ",") == 0) next
        print $5; exit }' /proc/self/mountinfo
}

enter_run_cgroup() {  # MOUNT POINT, KEY of its line in /proc/PID/cgroup ("0" or "pids")
    local mnt=$1 key=$2 home
    [ -n "$mnt" ] && mkdir "$mnt/$run_id" 2>/dev/null || return 1
    home=$(awk -F: -v k="$key" '$1 == k || index("," $2 ",", "," k ",") { print $3; exit }' \
        "/proc/$$/cgroup")
    if { echo $$ > "$mnt/$run_id/cgroup.procs"; } 2>/dev/null; then
        run_cgroup=$mnt/$run_id
        home_cgroup=$mnt$home
        return 0
    fi
    rmdir "$mnt/$run_id"
    return 1
}

if enter_run_cgroup "$(cgroup_mount cgroup2)" 0 \
        || enter_run_cgroup "$(cgroup_mount cgroup pids)" pids; then
    track=(--run-cgroup "$run_cgroup")
else
    echo "hostguard: no writable cgroup hierarchy: leaked processes are found by" \
         "GPUGUARD_TEST_RUN=$run_id in their environment (one that clears it escapes)" >&2
    track=(--run-marker "GPUGUARD_TEST_RUN=$run_id")
fi

# --- the end, whatever happened: the "after" snapshot and the comparison ---------------
policy_rc_d=/usr/sbin/policy-rc.d
policy_saved=""  # "none" or a copy of the one there was, while ours is in place

restore_policy_rc_d() {
    case "$policy_saved" in
    "") return 0 ;;
    none) rm -f "$policy_rc_d" ;;
    *) mv -f "$policy_saved" "$policy_rc_d" ;;
    esac
    policy_saved=""
}

finish() {
    local rc=$? guard_rc=0
    set +e
    restore_policy_rc_d
    if [ -n "$run_cgroup" ]; then
        # out of the run's cgroup first: what is still in it is what the run left behind
        echo $$ > "$home_cgroup/cgroup.procs" || echo "hostguard: cannot leave $run_cgroup" >&2
    fi
    echo "== hostguard"
    guard snapshot "$guard_dir/after.json" "${track[@]}"
    if [ -n "$run_cgroup" ] && ! rmdir "$run_cgroup" 2>/dev/null; then
        echo "hostguard: $run_cgroup is left in place: it holds the processes below" >&2
    fi
    if guard compare "$guard_dir/before.json" "$guard_dir/after.json"; then
        echo "the host is as the run found it"
    else
        echo "the run changed the host (+ left behind, - gone): see above" >&2
        guard_rc=1
    fi
    rm -rf "$guard_dir"
    # pytest's (or ruff's, mypy's) own failure comes first; else the guard's
    exit $((rc != 0 ? rc : guard_rc))
}
trap finish EXIT

# --- what the tests need ---------------------------------------------------------------
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
command -v pgrep >/dev/null 2>&1 || need_apt+=(procps)             # tests/test_cli.py: no worker left
command -v git >/dev/null 2>&1 || need_apt+=(git)                  # mutate_rules.py: git diff
command -v umount >/dev/null 2>&1 || need_apt+=(mount)             # tmpfs mounts of the tests
# a real Slurm cluster on loopback (tests/slurm): the controller, the node daemon, sinfo,
# scontrol, srun and sbatch, and munge for their authentication; started by the tests
# with private ports and state in a temp folder, stopped at the end (never as services)
[ -x /usr/sbin/slurmctld ] || need_apt+=(slurmctld)
[ -x /usr/sbin/slurmd ] || need_apt+=(slurmd)
command -v sinfo >/dev/null 2>&1 || need_apt+=(slurm-client)
[ -x /usr/sbin/munged ] || need_apt+=(munge)
command -v dash >/dev/null 2>&1 || need_apt+=(dash)                # the NPD plugin's shell
[ -x /usr/bin/chromium ] || need_apt+=(chromium)                   # tests/browser: the status page
command -v npm >/dev/null 2>&1 || need_apt+=(npm)                  # axe-core for tests/browser
# man pages and shell completion (issue 34): man --warnings -l and lexgrog read each page,
# groff -ww checks it; real bash, zsh and fish complete with our scripts. man-db enables
# man-db.timer at boot: restore_boot_state (below) turns it off again, as it does for the rest
command -v man >/dev/null 2>&1 && command -v lexgrog >/dev/null 2>&1 || need_apt+=(man-db)
command -v groff >/dev/null 2>&1 || need_apt+=(groff-base)
command -v zsh >/dev/null 2>&1 || need_apt+=(zsh)
command -v fish >/dev/null 2>&1 || need_apt+=(fish)
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import ensurepip' 2>/dev/null \
    || need_apt+=(python3-venv)                                    # the .deb's own venv

# Packages' maintainer scripts start their services and enable them at boot. Starts are
# refused for the install's length by a policy-rc.d that says 101 (invoke-rc.d and
# deb-systemd-invoke ask it); the one there was before, if any, is put back.
block_service_starts() {
    policy_saved=none
    if [ -e "$policy_rc_d" ] || [ -L "$policy_rc_d" ]; then
        policy_saved=$guard_dir/policy-rc.d.saved
        cp -a "$policy_rc_d" "$policy_saved"
    fi
    printf '#!/bin/sh\n# scripts/test.sh of gpuguard, during its apt-get install only\nexit 101\n' \
        > "$policy_rc_d.tmp"
    chmod 755 "$policy_rc_d.tmp"
    mv -f "$policy_rc_d.tmp" "$policy_rc_d"
}

# The enabled state the install changed goes back to the "before" snapshot's, with
# Debian's own tools, which work without a running systemd: `update-rc.d NAME disable`
# turns a SysV script's S links into K links and disables NAME.service with it;
# `systemctl --root=/ disable` (offline: files only) removes the systemd links left.
# The guard then checks that the boot state is the one before the install.
restore_boot_state() {
    local added link name
    guard snapshot "$guard_dir/installed.json"
    added=$(guard compare --only boot "$guard_dir/before.json" "$guard_dir/installed.json" \
        | sed -n 's/^+ boot: \([^ ]*\) -> .*/\1/p') || true
    for name in $(printf '%s\n' $added | sed -n 's|^/etc/rc[S2-5]\.d/S[0-9][0-9]||p' | sort -u); do
        update-rc.d "$name" disable
    done
    for link in $added; do
        case $link in
        /etc/systemd/system/*)
            [ -L "$link" ] && SYSTEMCTL_SKIP_SYSV=1 systemctl --root=/ --quiet disable "${link##*/}"
            ;;
        esac
    done
    guard snapshot "$guard_dir/installed.json"
    if ! guard compare --only boot "$guard_dir/before.json" "$guard_dir/installed.json"; then
        echo "the install changed what starts at boot (above) and it could not be put back" >&2
        exit 1
    fi
}

if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "missing: ${need_apt[*]}; run as root or: sudo apt-get install ${need_apt[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    block_service_starts
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    restore_policy_rc_d
    restore_boot_state
fi

if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
# axe-core for tests/browser, the version and checksum package-lock.json pins, into the
# checkout's node_modules/ (gitignored; nothing global, npm's cache in the run's temp dir)
axe_pinned=$(sed -n 's/.*"axe-core": "\(.*\)".*/\1/p' package.json)
if ! grep -qs "\"version\": \"$axe_pinned\"" node_modules/axe-core/package.json; then
    npm ci --no-audit --no-fund --ignore-scripts --loglevel=error \
        --cache "$guard_dir/npm-cache" >/dev/null
fi

echo "== ruff"; .venv/bin/ruff check gpuguard tests scripts bench
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; .venv/bin/python -m pytest "$@"
# Again, on a host whose kernel log is full of Xids (issue 18): the guard's switch points
# the default kernel log at a file of them (nothing is written to the real one). A test
# that passes only on a host with a clean log fails here. The container, image and package
# tests are left out: they run gpuguard in their own machine, not on this host's paths;
# so is the Slurm cluster (about 5 minutes, docs/slurm.md): every command it runs names
# its kernel log.
echo "== pytest, on a host whose kernel log is full of Xids"
GPUGUARD_FORBID_HOST="kmsg=$PWD/tests/fixtures/kmsg/host-with-xids.log" \
    .venv/bin/python -m pytest -q -p no:cacheprovider --ignore tests/systemd_pid1 \
    --ignore tests/image --ignore tests/slurm "$@"
