"""What is generated stays current: the docs' samples are what the commands print today,
and scripts/generate.sh (docs/adding-a-rule.md) runs every generator there is."""

from __future__ import annotations

import re
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


def _gen_rules_doc():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gen_rules_doc
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return gen_rules_doc


def test_supervisor_md_lists_every_failover_rule_of_the_pack():
    """docs/supervisor.md's list of the rules the supervisor counts is the rule pack's
    (issue 28: it missed fabric.state, gpu.lost, gpu.compute and nvlink.state)."""
    from gpuguard.config.ruleset import load_ruleset

    text = (REPO / "docs" / "supervisor.md").read_text()
    block = _gen_rules_doc().FAILOVER_TABLE.search(text)
    assert block is not None, "docs/supervisor.md has no generated table of failover rules"
    listed = set(re.findall(r"^\| `([\w.]+)` \|", block["body"], re.M))
    assert listed == set(load_ruleset().failover_rules())
    assert {"fabric.state", "gpu.lost", "gpu.compute", "nvlink.state"} <= listed


def test_a_stale_failover_table_is_caught(tmp_path, monkeypatch):
    gen = _gen_rules_doc()
    doc = tmp_path / "supervisor.md"
    fresh = gen.render_supervisor((REPO / "docs" / "supervisor.md").read_text())
    doc.write_text(re.sub(r"^\| `gpu\.lost` \|.*\n", "", fresh, flags=re.M))
    monkeypatch.setattr(gen, "SUPERVISOR_DOC", doc)
    monkeypatch.setattr(sys, "argv", ["gen_rules_doc.py", "--check"])
    assert gen.main() == 1
