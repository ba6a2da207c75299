"""What the docs cite is what the repository holds (issue 28: a newcomer tripped on a file
that was not there, `driver.yaml:20` where the output says `:22`, slurm.conf lines missing
one the example has, and "0.9 s" for `--timeout 1` without a word why)."""

from __future__ import annotations

import re

from gpuguard.sources.nvml import deadline_for
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The folders of the repository a citation starts with.
CITED = re.compile(r"(?<![\w/.$-])((?:gpuguard|tests|bench|scripts|packaging|rules)/"
                   r"[\w./*{}<>$,-]*)")
# Templates the docs spell out on purpose ("the logic of rule family.name is in
# gpuguard/checks/family.py").
TEMPLATES = ("family.py", "family.yaml", "test_family.py")


def _exists(path: str) -> bool:
    if (REPO / path).exists():
        return True
    # gpuguard/assess/once.judge: a name in a module
    return (REPO / f"{path.rsplit('.', 1)[0]}.py").exists()


def cited_paths_missing(texts: dict[str, str]) -> list[str]:
    """`where: path` for every path of the repository a text cites that it does not hold
    (a glob or brace pattern, `bench/results/issue19-*`, is left alone)."""
    missing = []
    for where, text in texts.items():
        for n, line in enumerate(text.splitlines(), 1):
            for m in CITED.finditer(line):
                path = m.group(1).rstrip("/.,-")
                if any(c in path for c in "*{}<>$,") or path.endswith(TEMPLATES) \
                        or _exists(path):
                    continue
                missing.append(f"{where}:{n}: {path}")
    return missing


def test_every_path_the_docs_and_the_code_cite_exists():
    texts = {str(p.relative_to(REPO)): p.read_text() for p in DOCS}
    # the code's comments and the rule pack's cite files too (gpuguard/daemon/service_engine.py
    # and rules/engines/log-errors.yaml named a gpuguard/checks/service_engine.py never there)
    for pattern in ("gpuguard/**/*.py", "rules/**/*.yaml"):
        texts.update({str(p.relative_to(REPO)): p.read_text() for p in REPO.glob(pattern)})
    assert cited_paths_missing(texts) == []


def test_a_citation_of_a_missing_file_is_caught():
    assert cited_paths_missing({"t.md": "see `gpuguard/checks/service_engine.py` and\n"
                                        "gpuguard/checks/service.py, tests/checks/test_*.py"}) \
        == ["t.md:1: gpuguard/checks/service_engine.py"]


def test_every_test_the_docs_cite_by_name_exists():
    """`tests/x.py::test_name` and the `::test_other` that follows it in the same breath."""
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"(tests/[\w/]+\.py)((?:::\w+|[`,\s(]+::\w+)+)", text):
            source = REPO / m[1]
            body = source.read_text() if source.exists() else ""
            for name in re.findall(r"::(\w+)", m[2]):
                if not re.search(rf"^\s*(?:async )?def {name}\(|^class {name}\b", body, re.M):
                    missing.append(f"{doc.name}: {m[1]}::{name}")
    assert missing == []


def test_a_rules_action_line_the_docs_show_is_its_action_key():
    """`(the rule's action: key, driver.yaml:22)`: that line of the rule file is `action:`."""
    cited = [(doc.name, m[1], int(m[2])) for doc in DOCS
             for m in re.finditer(r"action: key, ([\w-]+\.yaml):(\d+)\)", doc.read_text())]
    assert cited, "no doc shows a rule's action line (docs/check.md's wedged-GPU sample did)"
    wrong = [f"{doc}: {name}:{line}" for doc, name, line in cited
             if not (REPO / "rules" / name).read_text().splitlines()[line - 1].strip()
             .startswith("action:")]
    assert wrong == []


def test_the_deadlines_the_docs_give_for_a_timeout_are_nvmls():
    """docs/check.md says why `--timeout 1` reports 0.9 s, with numbers that are the code's."""
    text = " ".join((REPO / "docs" / "check.md").read_text().split())
    pairs = re.findall(r"`--timeout (\d+)`(?: gives NVML)? ([\d.]+) s", text)
    assert ("1", "0.9") in pairs, "docs/check.md does not say why --timeout 1 gives 0.9 s"
    assert [(t, s) for t, s in pairs if deadline_for(float(t)) != float(s)] == []


def test_the_slurm_conf_lines_of_the_docs_are_the_examples():
    example = [line for line in
               (REPO / "packaging" / "slurm" / "slurm.conf.example").read_text().splitlines()
               if line and not line.startswith("#")]
    setup = (REPO / "docs" / "slurm.md").read_text().split("## Setting it up", 1)[1]
    shown = re.findall(r"^    (\w+=\S*)$", setup.split("\n## ", 1)[0], re.M)
    assert "HealthCheckNodeState=ANY" in example
    assert shown == example
