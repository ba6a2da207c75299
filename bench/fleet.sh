#!/usr/bin/env bash
# The fleet test with its measurements: 20 daemons (8 replayed H200 GPUs each), a real
# Prometheus and Alertmanager on loopback. Prints series per host, scrape durations and
# Prometheus' memory (docs/benchmarks.md records them).
set -euo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp)
GPUGUARD_FLEET_REPORT=$report .venv/bin/python -m pytest -q tests/fleet >&2
cat "$report"
