#!/usr/bin/env python3
"""Mutation check of the rule checks: can tests/checks/ fail when a check is wrong?

For every module gpuguard/checks/<family>.py (the package's __init__ holds only the
helpers) this makes small wrong versions of the code, one at a time, and runs that
family's tests (tests/checks/test_<family>.py plus tests/test_ruleset.py). A mutant the
tests reject is *killed*; one they pass *survived*: a behaviour no test pins down.

The mutations (all read from the module's `ast`, so the decorator's exact form does not
matter):

  compare    < <=, > >=, == !=, in / not in, is / is not (each operator of a chain)
  boolop     and <-> or
  negate     the test of an `if`/`elif`, `while`, conditional expression or
             comprehension filter becomes `not (...)`
  bool       True <-> False; in a function declared `-> bool` each returned value is negated
  number     each int/float literal n -> n + 1 (so 0 -> 1)
  status     the finding's status: ok() -> ctx.fail(), ctx.fail() -> ok() and -> warning(),
             warning() -> ok() and -> ctx.fail(), critical() -> warning(),
             skipped()/unknown() -> ok() and -> each other
  threshold  ctx.threshold("x") (and ruleset.rules["id"].thresholds["x"]) -> the default of
             x hard-coded from rules/<family>.yaml: only a test that changes the threshold
             (an override) can tell; it is the "threshold hard-coded in the check" bug

Each mutant runs in a private copy of gpuguard/, tests/ and rules/ (one copy per job, at
most --jobs at a time), so concurrent mutants never see each other and the working tree is
never written; the copy's module is restored in a `finally` after each mutant, and at the
end the working tree's gpuguard/ is checked to be as it was.

Mutants that cannot change behaviour are listed in EQUIVALENT with the reason; a listed
mutant that survives counts as equivalent, one that is killed is reported as a stale entry.

Run it with the project's environment (it reads the rule pack through gpuguard's loader):

    .venv/bin/python scripts/mutate_rules.py --out mutants.json
    .venv/bin/python scripts/mutate_rules.py --modules pcie power --list

Exit status: 0 when every non-equivalent mutant is killed, 1 when some survived, 2 when
the tests fail without any mutant (nothing can be judged) or the tree was changed.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CHECKS_DIR = REPO / "gpuguard" / "checks"
# What a private copy needs to run a family's tests: the package, the tests with their
# fixtures, the rule pack (found next to the package), the docs and scripts that
# tests/test_ruleset.py compares with the pack, and pytest's configuration.
COPIED = ("gpuguard", "tests", "rules", "docs", "scripts", "pyproject.toml")

# Surviving mutants that cannot change what a check returns, by key (see Mutant.key):
# key -> why. Keys name the function and the code, not the line, so that edits elsewhere
# in the module do not invalidate them.
EQUIVALENT: dict[str, str] = {
    "pcie.<module>: number `5` -> `6` in `{1: 2500000000.0, 2: 5000000000.0, 3: 8000000000.0, "
    "4: 16000000000....`":
        "Gen5 is also the fallback rate for a generation the table lacks: without its key "
        "Gen5 still gets 32 GT/s",
    "pcie.replays: number `3` -> `4` in `round(limit, 3)`":
        "DCGM's limit is 0.15/min x width x 2^k: for any integer width it has at most two "
        "decimals, so 3 or 4 give the same number",
    "power.limit: number `0` -> `1` in `gpu.clock_event_reasons.get_or(0)`":
        "the value is only masked with SW_POWER_CAP (0x4): 1 & 0x4 is 0 as 0 & 0x4 is",
    "nvlink.expected_links: number `0` -> `1`":
        "both callers (nvlink.state after get(), the metric after links_up) pass a GPU whose "
        "own links were read, so counts holds it and is never empty",
    "xid._incidents: number `1` -> `2` in `-1`":
        "the sort key of a line without a time: any negative number sorts it before every "
        "time stamp (>= 0), so -1 and -2 order the lines alike",
}

COMPARE_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
STATUS_HELPERS = ("ok", "warning", "critical", "skipped", "unknown")
FAIL = "ctx.fail"
# The mutated module imports the helpers under this name (appended at its end), so that a
# status swap works whatever the module itself imports.
HELPERS_ALIAS = "_mutant_checks"
STATUS_SWAPS: dict[str, tuple[str, ...]] = {
    "ok": (FAIL,),
    FAIL: ("ok", "warning"),
    "warning": ("ok", FAIL),
    "critical": ("warning",),
    "skipped": ("ok", "unknown"),
    "unknown": ("ok", "skipped"),
}


@dataclass
class Mutant:
    module: str        # the family, e.g. "pcie"
    line: int
    col: int
    function: str      # the top-level function (or "<module>")
    kind: str
    description: str
    key: str = ""
    outcome: str = "not run"   # killed, survived, equivalent
    detail: str = ""
    # Where the replacement goes in the original source (byte offsets) and what it is.
    start: int = field(default=0, repr=False)
    end: int = field(default=0, repr=False)
    replacement: str = field(default="", repr=False)

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        for private in ("start", "end", "replacement"):
            del data[private]
        return data


def short(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Scope:
    function: str
    has_ctx: bool
    rule: str | None
    returns_bool: bool


class Collector:
    """Walks one module's AST and lists its mutants (not applied: offsets and text)."""

    def __init__(self, family: str, source: str, thresholds: dict[str, dict[str, Any]],
                 severities: dict[str, str]):
        self.family = family
        self.source = source
        self.data = source.encode()
        starts = [0]
        for line in self.data.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        self.line_starts = starts
        self.thresholds = thresholds      # rule id -> its default thresholds
        self.severities = severities      # rule id -> severity in the pack
        self.imported_helpers: set[str] = set()
        family_rules = [r for r in thresholds if r.startswith(f"{family}.")]
        # A helper outside any decorated function belongs to the family's one rule, if
        # it has only one.
        self.only_rule = family_rules[0] if len(family_rules) == 1 else None
        self.mutants: list[Mutant] = []
        self.skipped_sites = 0

    # -- positions -------------------------------------------------------------------
    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = self.line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end

    def segment(self, node: ast.AST) -> str | None:
        """The node's own source text; None where the AST's offsets do not point at it
        (expressions inside f-strings on older Pythons)."""
        start, end = self.span(node)
        text = self.data[start:end].decode(errors="replace")
        try:
            parsed = ast.parse(f"(\n{text}\n)", mode="eval").body
        except SyntaxError:
            return None
        return text if ast.dump(parsed) == ast.dump(node) else None

    def add(self, node: ast.AST, scope: Scope | None, kind: str, replacement: str,
            description: str, target: ast.AST | None = None) -> None:
        where = target or node
        if self.segment(where) is None:
            self.skipped_sites += 1
            return
        start, end = self.span(where)
        self.mutants.append(Mutant(
            module=self.family, line=where.lineno, col=where.col_offset,  # type: ignore[attr-defined]
            function=scope.function if scope else "<module>", kind=kind,
            description=description, start=start, end=end, replacement=replacement))

    # -- the walk --------------------------------------------------------------------
    def collect(self) -> list[Mutant]:
        tree = ast.parse(self.source)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "gpuguard.judge.registry":
                self.imported_helpers |= {a.asname or a.name for a in node.names}
        for node in tree.body:
            self.walk(node, None, None)
        seen: dict[str, int] = {}
        for mutant in self.mutants:
            base = f"{mutant.module}.{mutant.function}: {mutant.kind} {mutant.description}"
            seen[base] = seen.get(base, 0) + 1
            mutant.key = base if seen[base] == 1 else f"{base} #{seen[base]}"
        return self.mutants

    def rule_of(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
        # Any rule id written in a decorator: @gpu_check("pcie.aer"), @gpu_check(rule_id=
        # "pcie.aer", thresholds=...), a registry call... the form does not matter.
        for decorator in node.decorator_list:
            for sub in ast.walk(decorator):
                if isinstance(sub, ast.Constant) and sub.value in self.thresholds:
                    return str(sub.value)
        return None

    def walk(self, node: ast.AST, scope: Scope | None, parent: ast.AST | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            inner = Scope(
                function=scope.function if scope else node.name,
                has_ctx="ctx" in names or bool(scope and scope.has_ctx),
                rule=self.rule_of(node) or (scope.rule if scope else self.only_rule),
                returns_bool=isinstance(node.returns, ast.Name) and node.returns.id == "bool")
            # Decorators (the registration) and annotations are not behaviour to mutate.
            for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
                self.walk(default, scope, node)
            for statement in node.body:
                self.walk(statement, inner, node)
            return
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                self.walk(statement, scope, node)
            return
        if isinstance(node, ast.ImportFrom | ast.Import):
            return
        self.mutate(node, scope, parent)
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "type_comment"):
                continue
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, ast.AST):
                    self.walk(child, scope, node)

    # -- the mutations ---------------------------------------------------------------
    def mutate(self, node: ast.AST, scope: Scope | None, parent: ast.AST | None) -> None:
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                swap = COMPARE_SWAP.get(type(op))
                if swap is None:
                    continue
                new = copy.deepcopy(node)
                new.ops[i] = swap()
                after = ast.unparse(new)
                self.add(node, scope, "compare", f"({after})",
                         f"`{short(ast.unparse(node))}` -> `{short(after)}`")
        elif isinstance(node, ast.BoolOp):
            new = copy.deepcopy(node)
            new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            after = ast.unparse(new)
            self.add(node, scope, "boolop", f"({after})",
                     f"`{short(ast.unparse(node))}` -> `{short(after)}`")
        elif isinstance(node, ast.If | ast.While | ast.IfExp):
            self.negate(node.test, scope, "negate")
        elif isinstance(node, ast.comprehension):
            for test in node.ifs:
                self.negate(test, scope, "negate")
        elif isinstance(node, ast.Return) and node.value is not None and scope \
                and scope.returns_bool and not isinstance(node.value, ast.Constant):
            self.negate(node.value, scope, "bool")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            self.add(node, scope, "bool", repr(not node.value),
                     f"`{node.value!r}` -> `{not node.value!r}`{self.inside(parent)}")
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            bumped = node.value + 1
            self.add(node, scope, "number", repr(bumped),
                     f"`{node.value!r}` -> `{bumped!r}`{self.inside(parent)}")
        elif isinstance(node, ast.Call):
            self.mutate_call(node, scope)
        elif isinstance(node, ast.Subscript):
            self.mutate_threshold_lookup(node, scope)

    def inside(self, parent: ast.AST | None) -> str:
        return f" in `{short(ast.unparse(parent))}`" if isinstance(parent, ast.expr) else ""

    def negate(self, test: ast.expr, scope: Scope | None, kind: str) -> None:
        self.add(test, scope, kind, f"(not ({ast.unparse(test)}))",
                 f"`{short(ast.unparse(test))}` -> `not (...)`")

    def status_of(self, call: ast.Call) -> str | None:
        func = call.func
        if isinstance(func, ast.Name) and func.id in STATUS_HELPERS \
                and func.id in self.imported_helpers:
            return func.id
        if isinstance(func, ast.Attribute) and func.attr == "fail" \
                and isinstance(func.value, ast.Name) and func.value.id == "ctx":
            return FAIL
        return None

    def mutate_call(self, call: ast.Call, scope: Scope | None) -> None:
        status = self.status_of(call)
        if status is not None:
            severity = self.severities.get(scope.rule) if scope and scope.rule else None
            for target in STATUS_SWAPS[status]:
                if target == FAIL and not (scope and scope.has_ctx):
                    continue
                # ctx.fail() is the rule's severity: swapping it with that same helper
                # changes nothing by construction, so it is not made at all.
                if {status, target} == {FAIL, severity}:
                    continue
                text = FAIL if target == FAIL else f"{HELPERS_ALIAS}.{target}"
                self.add(call, scope, "status", text, f"`{short(ast.unparse(call), 50)}`: "
                         f"{status}() -> {target}()", target=call.func)
            return
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "threshold" \
                and len(call.args) == 1 and isinstance(call.args[0], ast.Constant) \
                and isinstance(call.args[0].value, str):
            self.hard_code(call, scope, call.args[0].value, scope.rule if scope else None)

    def mutate_threshold_lookup(self, node: ast.Subscript, scope: Scope | None) -> None:
        # ctx.ruleset.rules["power.limit"].thresholds["tolerance_w"]
        owner = node.value
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                and isinstance(owner, ast.Attribute) and owner.attr == "thresholds" \
                and isinstance(owner.value, ast.Subscript) \
                and isinstance(owner.value.slice, ast.Constant) \
                and owner.value.slice.value in self.thresholds:
            self.hard_code(node, scope, node.slice.value, str(owner.value.slice.value))

    def hard_code(self, node: ast.expr, scope: Scope | None, name: str,
                  rule: str | None) -> None:
        if rule is not None:
            candidates = {rule}
        else:  # a helper shared by several rules: each default it could stand for
            candidates = {r for r in self.thresholds if r.startswith(f"{self.family}.")}
        values = sorted({repr(self.thresholds[r][name]) for r in candidates
                         if name in self.thresholds.get(r, {})})
        for value in values:
            self.add(node, scope, "threshold", f"({value})",
                     f"`{short(ast.unparse(node))}` -> `{value}` (the default, hard-coded)")


def load_pack() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each pack rule's default thresholds and severity, read by gpuguard's own loader."""
    sys.path.insert(0, str(REPO))
    from gpuguard.config.ruleset import load_ruleset

    ruleset = load_ruleset(pack_dir=REPO / "rules")
    return ({r.id: dict(r.thresholds) for r in ruleset.rules.values()},
            {r.id: str(r.severity) for r in ruleset.rules.values()})


def families() -> list[str]:
    return sorted(p.stem for p in CHECKS_DIR.glob("*.py") if p.stem != "__init__")


def mutants_of(family: str, thresholds: dict[str, dict[str, Any]],
               severities: dict[str, str]) -> tuple[list[Mutant], int]:
    source = (CHECKS_DIR / f"{family}.py").read_text()
    collector = Collector(family, source, thresholds, severities)
    return collector.collect(), collector.skipped_sites


def mutated_source(original: bytes, mutant: Mutant) -> bytes:
    spliced = original[: mutant.start] + mutant.replacement.encode() + original[mutant.end:]
    return spliced + f"\n\nimport gpuguard.judge.registry as {HELPERS_ALIAS}  # noqa\n".encode()


def tests_for(family: str, override: list[str] | None) -> list[str]:
    return override or [f"tests/checks/test_{family}.py", "tests/test_ruleset.py"]


def run_tests(copy_root: Path, tests: list[str], timeout: float) -> tuple[int | None, str]:
    """pytest in the copy: its own package first on the path, and no bytecode written, so
    that a mutant of the same size written in the same second never runs from a stale .pyc."""
    env = {**os.environ, "PYTHONPATH": str(copy_root), "PYTHONDONTWRITEBYTECODE": "1",
           "NO_COLOR": "1"}
    command = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"]
    try:
        done = subprocess.run(command, cwd=copy_root, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"timeout after {timeout:g} s"
    tail = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, tail[-1] if tail else ""


def make_copy(into: Path) -> Path:
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            # symlinks=True: the sysfs fixture trees are made of links, as /sys is.
            shutil.copytree(source, into / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
        else:
            shutil.copy2(source, into / name)
    return into


def tree_state() -> tuple[str, dict[str, str]]:
    """The working tree's gpuguard/ as git sees it (its diff, which may be non-empty before
    the run) and the hash of each check module."""
    diff = subprocess.run(["git", "diff", "--", "gpuguard/"], cwd=REPO, capture_output=True,
                          text=True, check=False).stdout
    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted(CHECKS_DIR.glob("*.py"))}
    return diff, hashes


def run_all(mutants: list[Mutant], jobs: int, timeout: float,
            test_override: list[str] | None, progress: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuguard-mutants-") as tmp:
        copies: queue.Queue[Path] = queue.Queue()
        for i in range(jobs):
            root = Path(tmp) / f"copy{i}"
            root.mkdir()
            copies.put(make_copy(root))
        baseline = Path(tmp) / "copy0"
        for family in sorted({m.module for m in mutants}):
            rc, last = run_tests(baseline, tests_for(family, test_override), timeout)
            if rc != 0:
                raise SystemExit(f"the tests of {family} fail without any mutant ({last}): "
                                 "fix them first, nothing can be judged")
        done = 0

        def one(mutant: Mutant) -> None:
            nonlocal done
            root = copies.get()
            module = root / "gpuguard" / "checks" / f"{mutant.module}.py"
            original = module.read_bytes()
            try:
                module.write_bytes(mutated_source(original, mutant))
                rc, last = run_tests(root, tests_for(mutant.module, test_override), timeout)
            finally:
                module.write_bytes(original)
                copies.put(root)
            if rc == 0:
                mutant.outcome = "equivalent" if mutant.key in EQUIVALENT else "survived"
                mutant.detail = EQUIVALENT.get(mutant.key, "")
            else:
                mutant.outcome = "killed"
                mutant.detail = last if rc is not None else "timeout"
                if mutant.key in EQUIVALENT:
                    mutant.detail += " (listed as equivalent: a stale EQUIVALENT entry)"
            done += 1
            if progress:
                print(f"\r{done}/{len(mutants)} mutants run", end="", file=sys.stderr,
                      flush=True)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, mutants))
        if progress:
            print(file=sys.stderr)


def summary(mutants: list[Mutant]) -> dict[str, dict[str, int]]:
    per: dict[str, dict[str, int]] = {}
    for m in mutants:
        counts = per.setdefault(m.module, {"mutants": 0, "killed": 0, "survived": 0,
                                           "equivalent": 0})
        counts["mutants"] += 1
        if m.outcome in counts:
            counts[m.outcome] += 1
    return per


def table(per: dict[str, dict[str, int]]) -> Iterator[str]:
    yield f"{'module':<14}{'mutants':>8}{'killed':>8}{'survived':>9}{'equiv.':>8}{'score':>8}"
    total = {"mutants": 0, "killed": 0, "survived": 0, "equivalent": 0}
    for module, counts in sorted(per.items()):
        for k in total:
            total[k] += counts[k]
        yield row(module, counts)
    yield row("total", total)


def row(name: str, counts: dict[str, int]) -> str:
    judged = counts["mutants"] - counts["equivalent"]
    score = f"{100 * counts['killed'] / judged:.1f}%" if judged else "-"
    return (f"{name:<14}{counts['mutants']:>8}{counts['killed']:>8}{counts['survived']:>9}"
            f"{counts['equivalent']:>8}{score:>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", metavar="FAMILY",
                        help="only these modules of gpuguard/checks (default: all)")
    parser.add_argument("--kinds", nargs="+", metavar="KIND",
                        help="only these mutations (compare, boolop, negate, bool, number, "
                             "status, threshold)")
    parser.add_argument("--max", type=int, metavar="N", help="only the first N mutants")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at a time (default 2)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds one mutant's tests may take (default 120)")
    parser.add_argument("--tests", nargs="+", metavar="PATH",
                        help="run these tests for every mutant instead of the family's")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = parser.parse_args(argv)

    known = families()
    unknown_modules = sorted(set(args.modules or []) - set(known))
    if unknown_modules:
        parser.error(f"no module gpuguard/checks/{unknown_modules[0]}.py "
                     f"(there are: {', '.join(known)})")
    thresholds, severities = load_pack()
    mutants: list[Mutant] = []
    unplaceable = 0
    for family in args.modules or known:
        found, skipped_sites = mutants_of(family, thresholds, severities)
        mutants += found
        unplaceable += skipped_sites
    if args.kinds:
        mutants = [m for m in mutants if m.kind in args.kinds]
    if args.max is not None:
        mutants = mutants[: args.max]
    if args.list:
        for m in mutants:
            print(f"gpuguard/checks/{m.module}.py:{m.line}: {m.kind} {m.description}")
        print(f"{len(mutants)} mutants", file=sys.stderr)
        return 0

    before = tree_state()
    started = time.monotonic()
    try:
        run_all(mutants, max(1, args.jobs), args.timeout, args.tests,
                progress=sys.stderr.isatty())
    finally:
        untouched = tree_state() == before
    seconds = time.monotonic() - started
    per = summary(mutants)
    for line in table(per):
        print(line)
    survivors = [m for m in mutants if m.outcome == "survived"]
    stale = [m for m in mutants if m.outcome == "killed" and m.key in EQUIVALENT]
    if survivors:
        print("\nsurvivors:")
        for m in survivors:
            print(f"  gpuguard/checks/{m.module}.py:{m.line}: {m.kind} {m.description}")
            print(f"      key: {m.key}")
    for m in stale:
        print(f"stale EQUIVALENT entry (the tests kill it): {m.key}")
    if unplaceable:
        print(f"{unplaceable} site(s) not mutated: the AST offsets did not point at their code")
    cpus = os.cpu_count()
    print(f"\n{len(mutants)} mutants in {seconds:.0f} s, {args.jobs} at a time, on {cpus} CPU(s)")
    if args.out:
        args.out.write_text(json.dumps({
            "machine": {"cpus": cpus, "python": platform.python_version(),
                        "platform": platform.platform()},
            "jobs": args.jobs, "seconds": round(seconds, 1),
            "modules": per, "survivors": [m.public() for m in survivors],
            "equivalent": [m.public() for m in mutants if m.outcome == "equivalent"],
            "mutants": [m.public() for m in mutants],
        }, indent=2) + "\n")
    if not untouched:
        print("the working tree's gpuguard/ changed during the run", file=sys.stderr)
        return 2
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
