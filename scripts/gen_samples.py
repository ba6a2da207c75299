#!/usr/bin/env python3
"""Write the generated samples of the docs: each ```text block preceded by a marker

    <!-- sample: gpuguard check --input tests/fixtures/h200-live/idle-snapshot.json -->

holds exactly what that command prints today (120 columns, no colour, on the recordings
of the repository, under the tests' host guard: a sample never shows the machine it was
made on). A new rule then changes the sample by running this, not by hand. A command that
starts with FAKE_NVML_* variables runs on the tests' fake NVML under them (built with gcc
into a new folder, shown in the sample as `$fake`, as the README names it), on an empty
host of its own (--path.procfs, --path.sysfs, --path.rootfs, --kmsg-file and --state-dir
naming new empty folders and files, added at the end; the host guard stays on), and this
machine's name in the header shown as `$HOSTNAME`:

    <!-- sample: FAKE_NVML_GPUS=4 gpuguard check --only gpu.count -->

    python scripts/gen_samples.py           # rewrite the samples
    python scripts/gen_samples.py --check   # exit 1 if one is out of date (the tests do this)
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- sample: (?P<command>(?:FAKE_NVML_\w+=\S+ )*gpuguard [^>]*?) -->\n"
                    r"```text\n"
                    r"(?P<body>.*?)^```$", re.M | re.S)


def output_of(command: str) -> str:
    """What the command prints: the checkout's gpuguard, on nothing of this host's."""
    args = shlex.split(command)
    fake_vars = dict(a.split("=", 1) for a in args if a.startswith("FAKE_NVML_"))
    args = args[len(fake_vars):]
    with tempfile.TemporaryDirectory() as etc, tempfile.TemporaryDirectory() as fake:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FAKE_NVML_") and k != "LD_LIBRARY_PATH"}
        env.update(COLUMNS="120", NO_COLOR="1", GPUGUARD_FORBID_HOST=f"1,etc={etc}")
        if fake_vars:
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", f"{fake}/libnvidia-ml.so.1",
                            str(REPO / "tests/fake_nvml/fake_nvml.c")], check=True)
            env.update(fake_vars, LD_LIBRARY_PATH=fake)
            args += _empty_host(Path(etc))
        done = subprocess.run([sys.executable, "-m", "gpuguard", *args[1:]], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=120,
                              check=False)
    if done.returncode not in (0, 1, 2, 3):
        raise SystemExit(f"{command}: exit {done.returncode}: {done.stderr.strip()}")
    out = done.stdout.replace(os.path.realpath(fake), "$fake")
    if fake_vars:  # a live sweep names this machine: the sample must not
        out = out.replace(f"gpuguard check: {socket.gethostname()} ",
                          "gpuguard check: $HOSTNAME ", 1)
    return out


def _empty_host(root: Path) -> list[str]:
    """Options for a host with nothing on it but a boot id (as tests/conftest.py's own_host)."""
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("00000000-0000-4000-8000-000000000000\n")
    for folder in ("sys", "rootfs"):
        (root / folder).mkdir()
    (root / "kmsg.log").write_text("")
    return ["--path.procfs", str(root / "proc"), "--path.sysfs", str(root / "sys"),
            "--path.rootfs", str(root / "rootfs"), "--kmsg-file", str(root / "kmsg.log"),
            "--state-dir", str(root / "state")]


def render(text: str) -> str:
    return MARKER.sub(lambda m: f"<!-- sample: {m['command']} -->\n```text\n"
                                f"{output_of(m['command'])}```", text)


def main() -> int:
    stale = []
    for path in DOCS:
        text = path.read_text()
        if not MARKER.search(text):
            continue
        new = render(text)
        if new == text:
            continue
        if "--check" in sys.argv:
            stale.append(path)
        else:
            path.write_text(new)
    for path in stale:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"out of date: {shown}: run scripts/gen_samples.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
