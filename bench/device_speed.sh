export PYTHONUNBUFFERED=1
python3 -m venv /tmp/gv && /tmp/gv/bin/pip install -q --no-index --find-links .device/wheels gpuguard
for i in 1 2 3 4 5 6 7 8 9 10 11; do GPUGUARD_TIMING=1 /tmp/gv/bin/gpuguard check --format json > /dev/null; done 2>&1 | tee $OUT/timing-idle.txt
/tmp/gv/bin/python bench/check_vs_nvidia_smi.py --runs 31 --gpuguard /tmp/gv/bin/gpuguard --out $OUT/bench-idle-final.json | grep -A7 median_ms
python3 bench/gpu_load.py --seconds 75 > /dev/null 2>&1 & L=$!
sleep 8
for i in 1 2 3 4 5; do GPUGUARD_TIMING=1 /tmp/gv/bin/gpuguard check --format json > /dev/null; done 2>&1 | tee $OUT/timing-busy.txt
/tmp/gv/bin/python bench/check_vs_nvidia_smi.py --runs 31 --gpuguard /tmp/gv/bin/gpuguard --out $OUT/bench-busy-final.json | grep -A7 median_ms
wait $L
