#!/usr/bin/env bash
# Failover under load (loopback, bounded): requests without pause through the nginx
# router while the service fails over to CPU and back, and the same switch without a
# router. Needs what ./scripts/test.sh installs (docker.io, busybox-static, nginx-light).
# Prints one JSON line per case; docs/benchmarks.md records them.
set -euo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp)
GPUGUARD_LOAD_REPORT=$report .venv/bin/python -m pytest -q tests/supervisor/test_load.py >&2
cat "$report"
