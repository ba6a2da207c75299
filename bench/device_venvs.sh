# Sourced by the device scripts (bench/device_issue32h.sh, 32i, 36_bus), after they set
# `repo`: the venvs they run gpuguard from, installed with --no-index from the wheels
# carried in .device/ (the lent machine has no index to reach).
#   wheel_venvs TAG: /tmp/gvTAG-before and /tmp/gvTAG-after, each with gpuguard's wheel of
#     .device/gg-before or .device/gg-after and its dependencies from .device/wheels
#   deps_venv DIR: a venv with gpuguard's dependencies alone (a tree on PYTHONPATH runs)
DEVICE_DEPS="nvidia-ml-py psutil pyudev prometheus-client click pyyaml structlog docker simpleeval msgspec"

wheel_venvs() {
    local who
    for who in before after; do
        python3 -m venv "/tmp/gv$1-$who" && "/tmp/gv$1-$who/bin/pip" install -q --no-index \
            --find-links "$repo/.device/wheels" --find-links "$repo/.device/gg-$who" \
            $DEVICE_DEPS gpuguard || { echo "the $who wheel did not install"; return 1; }
    done
}

deps_venv() {
    python3 -m venv "$1" && "$1/bin/pip" install -q --no-index \
        --find-links "$repo/.device/wheels" $DEVICE_DEPS || { echo "deps did not install"; return 1; }
}
