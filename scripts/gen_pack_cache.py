#!/usr/bin/env python3
"""Write rules/compiled.json: the rule pack's YAML files parsed ahead of time, each with
its SHA-256, so that `gpuguard check` need not import PyYAML or parse them (about 30 ms of
its start on an H200 host). A file whose hash no longer matches is parsed as YAML at run
time, so a stale cache costs speed, never correctness. --check: exit 1 when out of date
(tests/test_ruleset.py runs it)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.config import yamlfile  # noqa: E402

PACK = REPO / "rules"


def render() -> str:
    files = {}
    for path in sorted(PACK.glob("*.yaml")):
        raw = path.read_bytes()
        doc = yamlfile.parse(raw.decode("utf-8"), path)
        files[path.name] = {"sha256": hashlib.sha256(raw).hexdigest(),
                            "doc": yamlfile.encode(doc)}
    return json.dumps({"generated_by": "scripts/gen_pack_cache.py", "files": files},
                      separators=(",", ":")) + "\n"


def main() -> int:
    text = render()
    out = PACK / yamlfile.COMPILED
    if "--check" in sys.argv:
        if not out.exists() or out.read_text() != text:
            print(f"out of date: {out}: run scripts/gen_pack_cache.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
