"""Entry point of the daemon's NVML worker: `python -m gpuguard.sources.nvml_worker
PROGRESS_FILE PROCFS [--no-xid-events]`. Reads commands on stdin, writes JSON lines."""

from __future__ import annotations

import sys

from gpuguard.sources.nvml import serve


def main() -> None:
    progress, procfs = sys.argv[1], sys.argv[2]
    serve(sys.stdin, sys.stdout, progress, procfs, xid_events="--no-xid-events" not in sys.argv)


if __name__ == "__main__":
    main()
