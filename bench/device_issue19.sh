# Issue 19, item 7: cold `gpuguard check` against `nvidia-smi -q` on one H200, idle and
# under a bf16 matmul, interleaved; where the spread comes from (each run's timing line,
# the NVML phases, Python's own start, the imports). One device call; results in $OUT.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
set -x
nvidia-smi -L; nproc; python3 --version
python3 -m venv /tmp/gv && /tmp/gv/bin/pip install -q --no-index --find-links .device/wheels gpuguard
G=/tmp/gv/bin/gpuguard
$G check > $OUT/check-idle.txt; echo "exit $?"
/tmp/gv/bin/python -X importtime -m gpuguard check --format json 2> $OUT/importtime.txt > /dev/null
/tmp/gv/bin/python bench/nvml_phases.py --runs 15 > $OUT/nvml-phases.json 2>&1
/tmp/gv/bin/python bench/check_vs_nvidia_smi.py --runs 31 --gpuguard $G --out $OUT/bench-idle.json | grep -A8 '"median_ms\|p90_ms\|ratio'
python3 bench/gpu_load.py --seconds 70 > /dev/null 2>&1 & L=$!
sleep 8
/tmp/gv/bin/python bench/check_vs_nvidia_smi.py --runs 21 --gpuguard $G --out $OUT/bench-busy.json | grep -A8 '"median_ms\|p90_ms\|ratio'
$G check > $OUT/check-busy.txt; echo "exit $?"
wait $L
