#!/usr/bin/env bash
# Issue 24 on the H200 test host (driver 580, CUDA 13.0, PyTorch installed): image.cuda
# judges PyTorch's own CUDA build as installed there, read from its files (torch/version.py,
# its dist-info) without importing torch, against NVML's driver and CUDA versions and the
# GPUs' brand and compute capability; printed beside what torch says of itself once
# imported. Reads only: nothing is installed outside /tmp, no GPU setting is changed, no
# image is pulled. Results in $OUT/issue24; the summary on stdout.
#   bash bench/device_issue24.sh          (from the checkout; gpuguard's wheel and its
#                                          dependencies in .device/wheels, else an
#                                          importable checkout)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-./out}; R=$OUT/issue24; mkdir -p "$R"
py=${PYTHON:-python3}
if [ -d .device/wheels ]; then
    $py -m venv /tmp/gv24 && /tmp/gv24/bin/pip install -q --no-index --find-links .device/wheels gpuguard
    G=/tmp/gv24/bin/gpuguard
else
    G="$py -m gpuguard"
fi
echo "== the host"
nvidia-smi --query-gpu=index,name,driver_version,compute_cap --format=csv | tee "$R/gpus.csv"
$G --version

echo "== where pip put torch (found, not imported)"
origin=$($py -c 'import importlib.util; print(importlib.util.find_spec("torch").origin)')
site=$(dirname "$(dirname "$origin")")
prefix=$($py -c 'import sys; print(sys.prefix)')
echo "torch: $origin"; echo "site-packages: $site"; echo "prefix: $prefix"
grep -E '^(__version__|cuda|hip)\b' "$site/torch/version.py" | tee "$R/torch-version-lines.txt"
ls -d "$site"/torch-*.dist-info 2>&1 | tee "$R/dist-info.txt"

echo "== gpuguard check --python-env (the site-packages folder, then the prefix)"
$G check --python-env "$site" --only 'image.*' | tee "$R/check-site.txt"
echo "exit ${PIPESTATUS[0]}"
$G check --python-env "$site" --only 'image.*' --format json > "$R/check-site.json"
echo "json exit $?"
$py - "$R/check-site.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
[r] = doc["results"]
print("status:", r["status"]); print("message:", r["message"])
print("host:", doc["host"]["driver_version"], "CUDA", doc["host"]["cuda_driver_version"])
EOF
$G check --python-env "$prefix" --only 'image.*' -q; echo "prefix exit $?"

echo "== what NVML gives gpuguard for brand= and arch= (snapshot)"
$G snapshot --no-docker -o "$R/snapshot.json"; echo "snapshot exit $?"
$py - "$R/snapshot.json" <<'EOF'
import json, sys
snap = json.load(open(sys.argv[1]))
print("driver", snap["host"]["driver_version"], "CUDA", snap["host"]["cuda_driver_version"])
for g in snap["gpus"]:
    print("GPU", g["index"], g["name"], "brand", g.get("brand"), "compute", g.get("compute_capability"))
EOF

echo "== the cost: the check with and without the environment (5 runs each, wall seconds)"
TIMEFORMAT=%R
set -f  # the words below are options, never file globs
for args in "--only image.*" "--only image.* --python-env $site"; do
    for _ in 1 2 3 4 5; do { time $G check $args > /dev/null; } 2>> "$R/timing-$(echo "$args" | wc -w).txt"; done
    echo "$args: $(sort -n "$R/timing-$(echo "$args" | wc -w).txt" | tr '\n' ' ')"
done
set +f

echo "== torch's own answer (imports torch and initialises CUDA: for comparison only)"
$py -c 'import torch; ok = torch.cuda.is_available(); print("torch", torch.__version__, "| built for CUDA", torch.version.cuda, "| cuda available", ok, "| capability", torch.cuda.get_device_capability(0) if ok else None, "| arch list", torch.cuda.get_arch_list() if ok else None)' 2>&1 | tee "$R/torch-itself.txt"

echo "== images already on this host, if a Docker engine answers (never pulled)"
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    for image in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep -v '<none>' | head -5); do
        $G check --image "$image" --only 'image.*' -q; echo "$image exit $?"
    done
else
    echo "no Docker engine answers here: --image not tried"
fi
