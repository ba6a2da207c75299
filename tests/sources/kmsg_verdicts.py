"""The verdict each kernel-log fixture gives, as a user gets it (issue 28, item 1): what
`gpuguard check --input <the live H200 snapshot> --kmsg-file <fixture> --format json` says
(its exit status and every result's rule, GPU, status and message) and what the kernel-log
source keeps of it (the summary without its path).

tests/fixtures/kmsg/expected-verdicts.json was written by the code before the driver-prefix
rule (commit 087a9c7), so that test_kmsg_fixture_verdicts.py holds the new code to the old
verdicts on every fixture:

    git archive 087a9c7 | tar -x -C /tmp/before-kmsg
    cd /tmp && PYTHONPATH=/tmp/before-kmsg /work/wt/kmsg28/.venv/bin/python \
        /work/wt/kmsg28/tests/sources/kmsg_verdicts.py

The command runs the gpuguard this process imports (its tree is the child's working
directory), so the same function runs the old code or this tree's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
KMSG = REPO / "tests" / "fixtures" / "kmsg"
SNAPSHOT = REPO / "tests" / "fixtures" / "h200-live" / "idle-snapshot.json"
EXPECTED = KMSG / "expected-verdicts.json"
# fixtures added after the expected file was written, for lines the old code misread: not
# compared with it (their own tests say what they hold)
NEW_SHAPES = ("fallen-off-probe.log", "api-mismatch-575.log", "lost-single-line.log",
              "lost-short-form.log", "lost-multi-line.log", "lost-multi-line.kmsg",
              "lost-probe-failed.log", "lost-init-failed.log", "lost-init-failed-old.log",
              "lost-start-failed.log", "lost-private-state-old.log", "lost-unsupported.log",
              "lost-unsupported-old.log", "lost-xid-and-fallen.log", "lost-unsupported.kmsg",
              "lost-unsupported-gsp.log", "lost-unsupported-upgrade.log",
              "lost-unsupported-upgrade-notime.log")


def fixtures() -> list[Path]:
    return sorted(p for p in KMSG.iterdir()
                  if p.suffix in (".log", ".kmsg") and p.name not in NEW_SHAPES)


def verdict(fixture: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The check's verdict on the fixture, run in a child process of the Python on the path
    (PYTHONPATH picks the code: the old tree, or this one)."""
    import gpuguard

    tree = Path(gpuguard.__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="kmsg-verdict-") as state:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuguard", "check", "--input", str(SNAPSHOT),
             "--kmsg-file", str(fixture), "--state-dir", state, "--format", "json"],
            capture_output=True, text=True, timeout=120, cwd=tree, check=False,
            env={**os.environ, "NO_COLOR": "1", **(env or {})})
    doc = json.loads(proc.stdout)
    results = sorted(
        ([r["rule"], (r.get("gpu") or {}).get("index"), r["status"], r["message"]]
         for r in doc["results"] if r["rule"] not in _NOT_KERNEL_LOG
         and not r["rule"].startswith(_LATER_FAMILIES)),
        key=lambda r: (r[0], -1 if r[1] is None else r[1]))
    return {"exit": proc.returncode, "results": results, "summary": summary(fixture)}


def summary(fixture: Path) -> dict[str, Any]:
    from gpuguard.sources import kmsg

    reading = kmsg.read_file(fixture)
    if not reading.is_ok:
        return {"error": reading.describe()}
    return {k: v for k, v in reading.get().items() if k not in ("source", "records")}


def ranked(found: dict[str, Any]) -> dict[str, Any]:
    """The verdict with each event's `n` (its place among the driver's lines, which only
    orders a repair against the lines before it) replaced by its rank: a line no longer
    counted among the driver's (`NVRM objClInit...`, no colon, in no pattern) moves every
    later `n` by one and changes nothing a rule reads."""
    summary = found.get("summary", {})
    places = sorted({e["n"] for name in ("xids", "gsp", "repairs")
                     for e in summary.get(name) or [] if e.get("n") is not None})
    rank = {n: i for i, n in enumerate(places)}
    out = {**summary}
    for name in ("xids", "gsp", "repairs"):
        if summary.get(name):
            out[name] = [{**e, "n": rank.get(e.get("n"), e.get("n"))} for e in summary[name]]
    return {**found, "summary": out}


# rules that read nothing of the kernel log: their results say nothing of this change, and
# one of them (driver.responsive) times the run
_NOT_KERNEL_LOG = ("driver.responsive",)
# rule families added after the expected file was written, none of which reads the kernel
# log (qualify.*: skipped in every `check`, issue 29)
_LATER_FAMILIES = ("qualify.",)


def main() -> None:
    import gpuguard

    print(f"the code judged: {gpuguard.__file__}")
    out = {p.name: verdict(p) for p in fixtures()}
    EXPECTED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {EXPECTED} ({len(out)} fixtures)")


if __name__ == "__main__":
    main()
