"""An image's NVIDIA_REQUIRE_* as the NVIDIA Container Toolkit judges them (issue 24).

Written after the toolkit's own code (docs/image-cuda.md cites each file):

- which variables count (nvidia-container-toolkit, internal/config/image/cuda_image.go,
  GetRequirements): every variable whose name starts with `NVIDIA_REQUIRE_`
  (strings.HasPrefix: `NVIDIA_REQUIRE_CUDA.OLD` is one) but `NVIDIA_REQUIRE_JETPACK*`, none
  when `NVIDIA_DISABLE_REQUIRE` parses as true (Go's strconv.ParseBool), and
  `cuda>=MAJOR.MINOR` from `CUDA_VERSION` for a "legacy" image (CUDA_VERSION set,
  NVIDIA_REQUIRE_CUDA not), whose major and minor must parse as uint32
  (parseMajorMinorVersion: strconv.ParseUint(..., 10, 32)) or the hook cannot get the
  requirements; the hook passes each as one `--require=` (cmd/nvidia-container-runtime-hook,
  main.go), and nvidia-container-cli takes at most 32 (src/cli/cli.h `reqs[32]`,
  configure.c: "too many requirements");
- the numbers (src/cli/dsl.c, dsl_compare_version): each is read with strtoumax into a
  uintmax_t; one it cannot hold (strtoumax gives UINTMAX_MAX) makes the condition -1,
  "invalid expression", which refuses the container;
- the grammar (libnvidia-container, src/cli/dsl.c): a space separates alternatives (or),
  a comma separates conditions that must all hold (and); `NAME OP VALUE` with the
  operators `= != < <= > >=`; evaluated left to right, stopping at the first alternative
  that holds; an empty alternative (",") ends the evaluation with the last value;
- the names (src/cli/configure.c): `cuda` (the driver's CUDA version) and `driver` (its
  version) compared as dotted numbers, `arch` (the GPU's compute capability) likewise,
  `brand` compared as text without regard to case (= and != only); anything else is
  "invalid expression", which refuses the container as an unmet condition does;
- every requirement is evaluated on each GPU the container gets, and once without a
  device (arch and brand then hold) when it gets none;
- the driver capabilities (the toolkit's cmd/nvidia-container-runtime-hook
  container_config.go and internal/config/image/capabilities.go): NVIDIA_DRIVER_CAPABILITIES
  split at commas and trimmed; unset or empty, `utility,compute` (every capability for a
  legacy image); `all`, every one; a word it does not know stops the hook. Without
  `compute` no CUDA driver library is mounted into the container.

A fact gpuguard could not read (the brand of a replayed GPU, say) makes the conditions
that use it unknown: a verdict is ok or refused only when it holds whatever that fact is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# The toolkit's message when a requirement fails (src/cli/dsl.c), after
# "nvidia-container-cli: requirement error: ".
CUDA_HINT = ", please update your driver to a newer version, or use an earlier cuda container"
_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
_OP_CHARS = "<>=!"
_UINTMAX = 2**64 - 1
_UINT32 = 2**32 - 1
MAX_REQUIREMENTS = 32  # nvidia-container-cli's reqs[32] (src/cli/cli.h)
EXPR_MAX = 128  # src/cli/dsl.c: the buffer a failed condition is quoted into
CAPABILITIES = frozenset({"compute", "compat32", "graphics", "utility", "video", "display",
                          "ngx"})
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
# Masterminds semver's loose form (the toolkit parses CUDA_VERSION with it)
_LOOSE_SEMVER = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?"
                           r"(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")

Truth = bool | None  # None: depends on a fact gpuguard does not know


class Invalid(Exception):
    """A condition the toolkit cannot evaluate: "invalid expression"."""


class TooLarge(Invalid):
    """A number past the toolkit's integer type: "invalid expression" too, and why."""


@dataclass(frozen=True)
class Device:
    """One GPU the container gets, as the toolkit sees it: the name it gives the brand
    (None: not known here) and the compute capability ("9.0"; None: not known here)."""

    index: int
    brand: str | None
    arch: str | None


@dataclass(frozen=True)
class Outcome:
    state: str  # ok | refused | unknown
    message: str = ""
    device: int | None = None
    requirement: str = ""
    variable: str = ""  # the image's variable the requirement came from
    detail: str = ""  # why, where the toolkit's own words do not say (a number too large)


def driver_capabilities(env: Mapping[str, str]) -> frozenset[str]:
    """The capabilities the runtime hook gives the container; raises Invalid naming the
    words it does not support (the hook stops: the container does not start)."""
    raw = env.get("NVIDIA_DRIVER_CAPABILITIES")
    if raw is None and _legacy(env):
        return CAPABILITIES
    wanted = frozenset(c.strip() for c in (raw or "").split(",") if c.strip())
    if not raw:
        return frozenset({"utility", "compute"})
    if "all" in wanted:
        return CAPABILITIES
    if wanted - CAPABILITIES:
        raise Invalid(f"unsupported capabilities found in '{','.join(sorted(wanted))}' "
                      f"(allowed '{','.join(sorted(wanted & CAPABILITIES))}')")
    return wanted


def disabled(env: Mapping[str, str]) -> bool:
    """NVIDIA_DISABLE_REQUIRE as Go's strconv.ParseBool reads it; not a boolean: false."""
    return env.get("NVIDIA_DISABLE_REQUIRE", "") in _TRUE


def requirements(env: Mapping[str, str]) -> list[str]:
    """The requirements the runtime hook passes on (`--require=`), in name order; raises
    Invalid for a legacy image whose CUDA_VERSION is no version (the hook stops there)."""
    return [value for _, value in named_requirements(env)]


def named_requirements(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """requirements() with the variable each came from (CUDA_VERSION for a legacy image's)."""
    if disabled(env):
        return []
    found = [(name, env[name]) for name in sorted(env) if name.startswith("NVIDIA_REQUIRE_")
             and not name.startswith("NVIDIA_REQUIRE_JETPACK")]
    if _legacy(env):
        found.append(("CUDA_VERSION", f"cuda>={legacy_version(env['CUDA_VERSION'])}"))
    return found


def _legacy(env: Mapping[str, str]) -> bool:
    """A "legacy" CUDA image: CUDA_VERSION set, NVIDIA_REQUIRE_CUDA empty or unset."""
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def legacy_version(text: str) -> str:
    match = _LOOSE_SEMVER.fullmatch(text)
    if match is None:
        raise Invalid(f"invalid CUDA version {shorten(text)}: invalid version string")
    major, minor = match.group(1), match.group(2) or "0"
    for part, digits in (("major", major), ("minor", minor)):
        if _past(digits, _UINT32):  # strconv.ParseUint(part, 10, 32) fails
            raise TooLarge(f"invalid CUDA version {shorten(text)}: invalid {part} version "
                           f"(a number of {len(digits)} digits; the toolkit reads it as a "
                           "32-bit unsigned integer)")
    return f"{int(major.lstrip('0') or '0')}.{int(minor.lstrip('0') or '0')}"


def _past(digits: str, most: int) -> bool:
    """Whether a run of digits is a number above `most`, without converting one of
    thousands of digits (Python refuses those; the toolkit's integers overflow far sooner)."""
    number = digits.lstrip("0")
    return len(number) > len(str(most)) or int(number or "0") > most


def shorten(text: str, most: int = 40) -> str:
    """A value as a message names it: whole when short, else its start and its length."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def compare_version(v1: str, op: str, v2: str) -> bool:
    """dsl_compare_version: numbers between dots, compared one by one; trailing zeros
    and dots do not count ("12.0" = "12"). Anything but digits and dots: Invalid."""
    if v1.strip("0123456789.") or v2.strip("0123456789."):
        raise Invalid(f"{v1!r} or {v2!r} is not a dotted version")
    a, b = v1, v2
    while a and b:
        n1, a = _leading_number(a)
        n2, b = _leading_number(b)
        if n1 != n2:
            return {"=": False, "!=": True, "<": n1 < n2, "<=": n1 < n2,
                    ">": n1 > n2, ">=": n1 > n2}[op]
    a, b = a.lstrip(".0"), b.lstrip(".0")
    if op == "!=":
        return bool(a or b)
    if op in ("=", "<=", ">=") and not a and not b:
        return True
    if op == "=":
        return False
    if op in ("<", "<="):
        return not a and bool(b)
    return bool(a) and not b


def _leading_number(text: str) -> tuple[int, str]:
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0:  # strtoumax found no number
        raise Invalid(f"{shorten(text)!r} does not start with a number")
    if _past(text[:digits], _UINTMAX - 1):  # strtoumax gave UINTMAX_MAX: overflowed
        raise TooLarge(f"a number of {digits} digits, more than the toolkit's 64-bit "
                       "integers hold (dsl_compare_version's strtoumax overflows)")
    return int(text[:digits].lstrip("0") or "0"), text[digits:].lstrip(".")


def _split(condition: str) -> tuple[str, str, str]:
    """NAME, OP, VALUE as evaluate_rule cuts them: the operator is the run of <>=! after
    the name, matched against the list in its order by its first characters (so a lone
    "!" reads as "!=")."""
    name_end = next((i for i, c in enumerate(condition) if c in _OP_CHARS), len(condition))
    rest = condition[name_end:]
    run = rest[:len(rest) - len(rest.lstrip(_OP_CHARS))]
    if name_end == 0 or not run:
        raise Invalid(condition)
    op = next((o for o in _OPERATORS if len(o) >= len(run) and o[:len(run)] == run), None)
    value = rest[len(run):]
    if op is None or not value:
        raise Invalid(condition)
    return condition[:name_end], op, value


def condition_holds(condition: str, cuda: str | None, driver: str | None,
                    device: Device | None) -> Truth:
    """One condition against the driver's CUDA and driver versions and one GPU (None:
    no GPU). None: it depends on a fact not known here. Raises Invalid, also for one that
    fails and is too long to quote: evaluate_rule formats a failed condition as "NAME OP
    VALUE" into a buffer of EXPR_MAX (128) bytes and gives -1 when it does not fit, so the
    whole requirement is "invalid expression", whatever the alternatives after it say."""
    name, op, value = _split(condition)
    holds = _holds(name.lower(), op, value, condition, cuda, driver, device)
    if holds is False and len(f"{name} {op} {value}".encode()) >= EXPR_MAX:
        raise Invalid(condition)
    return holds


def _holds(name: str, op: str, value: str, condition: str, cuda: str | None,
           driver: str | None, device: Device | None) -> Truth:
    if name in ("cuda", "driver"):
        have = cuda if name == "cuda" else driver
        return None if have is None else compare_version(have, op, value)
    if name not in ("arch", "brand"):
        raise Invalid(condition)
    if device is None:  # no device visible: the toolkit assumes arch and brand are fine
        return True
    if name == "arch":
        return None if device.arch is None else compare_version(device.arch, op, value)
    if op not in ("=", "!="):
        raise Invalid(condition)
    if device.brand is None:
        return None
    return (device.brand.lower() == value.lower()) == (op == "=")


def evaluate(predicate: str, cuda: str | None, driver: str | None,
             device: Device | None) -> Outcome:
    """dsl_evaluate on one requirement: ok, refused (with the toolkit's message), or
    unknown (naming the condition that needs a fact not known here)."""
    walk = _Walk(cuda, driver, device)
    try:
        for alternative in (a for a in predicate.split(" ") if a):
            if walk.holds(alternative):  # the toolkit stops at the first that holds
                return walk.outcome(predicate, stopped=True)
    except Invalid as exc:
        if walk.maybe:  # reached only if what is not known went one way
            return Outcome("unknown", f"{walk.maybe} is not known here")
        return Outcome("refused", "invalid expression", requirement=predicate,
                       detail=str(exc) if isinstance(exc, TooLarge) else "")
    return walk.outcome(predicate, stopped=False)


class _Walk:
    """What dsl_evaluate has seen: whether any condition was evaluated (its `ret` is true
    before any), and `maybe`, the first condition whose value depends on a fact not
    known here."""

    def __init__(self, cuda: str | None, driver: str | None, device: Device | None) -> None:
        self.facts = (cuda, driver, device)
        self.evaluated = False
        self.conditions = 0  # in the alternative walked last
        self.maybe: str | None = None

    def holds(self, alternative: str) -> bool:
        """Whether the toolkit stops here: every condition held (or there was none). One
        that fails goes on to the next alternative; one not known goes on as well (the
        world where it failed), remembered."""
        unsure: str | None = None
        self.conditions = 0
        for condition in (c for c in alternative.split(",") if c):
            try:
                value = condition_holds(condition, *self.facts)
            except Invalid:
                self.maybe = self.maybe or unsure
                raise
            self.evaluated = True
            self.conditions += 1
            if value is False:
                return False
            unsure = unsure or (None if value else condition)
        if unsure is not None:
            self.maybe = self.maybe or unsure
            return False
        return True

    def outcome(self, predicate: str, stopped: bool) -> Outcome:
        """Where the toolkit stopped: at an alternative whose conditions all held (ok), or
        with the value it carried (an empty alternative, or the end): true only when
        nothing was evaluated, else the failure of every alternative before, unless one
        of them depended on a fact not known here."""
        if stopped and self.conditions:
            return Outcome("ok")
        if self.maybe is not None:
            return Outcome("unknown", f"{self.maybe} is not known here")
        return _refused(predicate) if self.evaluated else Outcome("ok")


def _refused(predicate: str) -> Outcome:
    """The toolkit names the requirement's first alternative, with a hint when it is a
    `cuda>=` condition."""
    first = predicate.split(" ", 1)[0]
    hint = CUDA_HINT if first.startswith("cuda>=") else ""
    return Outcome("refused", f"unsatisfied condition: {first}{hint}", requirement=predicate)


def check(env: Mapping[str, str], cuda: str | None, driver: str | None,
          devices: Iterable[Device]) -> Outcome:
    """Every requirement of an image's environment on every GPU it gets (once without a
    GPU when it gets none): the first refusal, else unknown if any is unknown, else ok."""
    try:
        wanted = named_requirements(env)
    except Invalid as exc:
        return Outcome("refused", f"failed to get requirements: {exc}", variable="CUDA_VERSION")
    if len(wanted) > MAX_REQUIREMENTS:
        return Outcome("refused", "input error: too many requirements",
                       detail=f"{len(wanted)} requirements; nvidia-container-cli takes at "
                              f"most {MAX_REQUIREMENTS}")
    unknown: Outcome | None = None
    visible: list[Device | None] = [*devices] or [None]
    for device in visible:
        for name, requirement in wanted:
            outcome = evaluate(requirement, cuda, driver, device)
            index = device.index if device is not None else None
            if outcome.state == "refused":
                return Outcome("refused", outcome.message, index, requirement, name,
                               outcome.detail)
            if outcome.state == "unknown" and unknown is None:
                unknown = Outcome("unknown", outcome.message, index, requirement, name)
    return unknown or Outcome("ok")
