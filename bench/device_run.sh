#!/usr/bin/env bash
# One combined run on a lent GPU host (device time is scarce): each issue's device script
# in turn, each with its own output folder and log, everything tarred into one file (only
# a few files come back). Usage: bash bench/device_run.sh 22 24 21 [23]
set -u
FINAL=${OUT:-./out}; mkdir -p "$FINAL"
W=/tmp/gg-run; rm -rf "$W"; mkdir -p "$W"
export NCCL_NVLS_ENABLE=0
nvidia-smi -L > "$W/gpus.txt" 2>&1; python3 --version >> "$W/gpus.txt" 2>&1
for n in "$@"; do
    start=$(date +%s)
    OUT="$W/i$n" timeout 400 bash "bench/device_issue$n.sh" > "$W/i$n.log" 2>&1
    echo "issue $n: exit $? in $(( $(date +%s) - start )) s" | tee -a "$W/summary.txt"
    tail -40 "$W/i$n.log"
done
tar czf "$FINAL/device-run.tgz" -C "$W" .
cp "$W/summary.txt" "$FINAL/"
