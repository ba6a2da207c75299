# Issue 19, item 7, second run: the new and the old gpuguard (main before issue 19) against
# one nvidia-smi -q, interleaved; the NVML child kept off its parent's CPU; everything on
# one CPU (taskset) to test whether the slow runs are the two processes sharing one.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m venv /tmp/new && /tmp/new/bin/pip install -q --no-index --find-links .device/wheels gpuguard
python3 -m venv /tmp/old && /tmp/old/bin/pip install -q --no-index --find-links .device/wheels .device/before/gpuguard-0.1.0-py3-none-any.whl
V=(--variant "new=/tmp/new/bin/gpuguard check --format json"
   --variant "old=/tmp/old/bin/gpuguard check --format json"
   --variant "new_apart=GPUGUARD_CHILD_APART=1 /tmp/new/bin/gpuguard check --format json"
   --variant "new_one_cpu=taskset -c 5 /tmp/new/bin/gpuguard check --format json")
python3 bench/check_variants.py --runs 31 "${V[@]}" --out $OUT/variants-idle.json
python3 bench/gpu_load.py --seconds 60 > /dev/null 2>&1 & L=$!
sleep 8
python3 bench/check_variants.py --runs 15 "${V[@]}" --out $OUT/variants-busy.json
wait $L
