"""What is generated stays current: the docs' samples are what the commands print today,
and scripts/generate.sh (docs/adding-a-rule.md) runs every generator there is."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_the_docs_samples_are_what_the_commands_print():
    done = subprocess.run([sys.executable, "scripts/gen_samples.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def test_generate_runs_every_generator():
    script = (REPO / "scripts" / "generate.sh").read_text()
    generators = sorted(p.name for p in (REPO / "scripts").glob("gen_*.py"))
    assert generators and [g for g in generators if g not in script] == []


def test_a_stale_sample_is_caught(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_samples
    finally:
        sys.path.remove(str(REPO / "scripts"))
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- sample: gpuguard rules fields -->\n```text\nold words\n```\n")
    monkeypatch.setattr(gen_samples, "DOCS", [doc])
    monkeypatch.setattr(sys, "argv", ["gen_samples.py", "--check"])
    assert gen_samples.main() == 1
    monkeypatch.setattr(sys, "argv", ["gen_samples.py"])
    assert gen_samples.main() == 0
    assert "gpu scope:" in doc.read_text() and "old words" not in doc.read_text()
    monkeypatch.setattr(sys, "argv", ["gen_samples.py", "--check"])
    assert gen_samples.main() == 0
