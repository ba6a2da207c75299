# Issue 19, item 7, third run: after starting the host sources before the configuration
# again (their profile settings handed over later), the new and the old gpuguard against
# one nvidia-smi -q, interleaved, idle and under a bf16 matmul.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m venv /tmp/new && /tmp/new/bin/pip install -q --no-index --find-links .device/wheels gpuguard
python3 -m venv /tmp/old && /tmp/old/bin/pip install -q --no-index --find-links .device/wheels .device/before/gpuguard-0.1.0-py3-none-any.whl
/tmp/new/bin/gpuguard check > $OUT/check-idle.txt; echo "check exit $?"
V=(--variant "new=/tmp/new/bin/gpuguard check --format json"
   --variant "old=/tmp/old/bin/gpuguard check --format json"
   --variant "new_table=/tmp/new/bin/gpuguard check")
python3 bench/check_variants.py --runs 41 "${V[@]}" --out $OUT/variants-idle.json
python3 bench/gpu_load.py --seconds 60 > /dev/null 2>&1 & L=$!
sleep 8
python3 bench/check_variants.py --runs 21 "${V[@]}" --out $OUT/variants-busy.json
/tmp/new/bin/gpuguard check > $OUT/check-busy.txt; echo "check exit $?"
wait $L
