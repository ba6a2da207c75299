#!/usr/bin/env python3
"""Write rules/compiled.json and rules/compiled-ruleset.json.

compiled.json: the rule pack's YAML files parsed ahead of time, each with its SHA-256,
so that a full load need not import PyYAML or parse them (about 30 ms of a start on an
H200 host). compiled-ruleset.json: the pack loaded the full way (schema, every check),
as rules, with the SHA-256 of the files it came from, so that `gpuguard check` need not
import msgspec and the schema either (config/pack_cache.py). A stale file costs speed,
never correctness: where a hash no longer matches, the YAML is read the full way at run
time. --check: exit 1 when either is out of date (tests/test_ruleset.py runs it)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuguard.config import pack_cache, ruleset, yamlfile  # noqa: E402

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


def render_ruleset() -> str:
    from gpuguard.judge import registry

    registry.load_all()
    paths = sorted(p for p in PACK.iterdir() if p.suffix in (".yaml", ".yml"))
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    loaded = ruleset.load_pack_in_full(PACK, paths)
    return pack_cache.render(loaded, PACK, digests)


def main() -> int:
    outputs = {PACK / yamlfile.COMPILED: render(),
               PACK / pack_cache.COMPILED_RULESET: render_ruleset()}
    if "--check" in sys.argv:
        stale = [out for out, text in outputs.items()
                 if not out.exists() or out.read_text() != text]
        for out in stale:
            print(f"out of date: {out}: run scripts/gen_pack_cache.py", file=sys.stderr)
        return 1 if stale else 0
    for out, text in outputs.items():
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
