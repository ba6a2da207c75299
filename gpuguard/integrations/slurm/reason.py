"""The one grammar of the drain reasons gpuguard writes (docs/slurm.md#gpuguards-reason):
the writer (`Reason.of(...).text()`) and the parser (`parse`) are built from the same
pieces, so every reason gpuguard can write reads back as its own, with its action, rule
and GPU, and nothing else does.

    gpuguard: <word>: <rule>[ GPU <n>][ (+<k> more)]        at most 80 characters
    gpuguard: <word>: <start of a rule>~[ GPU <n>][ (+<k> more)]   exactly 80

- <word>: an action of judge/actions.py but `none`, or `failover` (a failover rule's
  finding that suggests no action);
- <rule>: a rule id as config/shapes.py RULE_ID_PATTERN has it (site rules included);
  one too long for 80 characters is cut and marked `~` (never in a rule id), and only
  then: a cut reason is exactly 80 characters, a shorter one with `~` is not gpuguard's;
- <n>: the GPU's NVML index, <k> how many other findings: decimal, no leading zero, at
  most 10 digits (NVML's index is 32 bits), never cut (a cut "GPU 12" would name GPU 1).

Matched whole, ASCII only (`\\d` would take other scripts' digits): an administrator's
"gpuguard: ... RMA-4711 keep out" is theirs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuguard.config.shapes import RULE_ID_PATTERN
from gpuguard.judge.actions import Action

PREFIX = "gpuguard:"
REASON_MAX = 80
CUT_MARK = "~"
FAILOVER = "failover"
# every word a reason may name, the most severe action last (as judge/actions.py orders)
WORDS = (*(a.value for a in Action if a is not Action.NONE), FAILOVER)
NUMBER_DIGITS = 10
FALLBACK_RULE = "unnamed.rule"  # a rule id outside the grammar (never one of gpuguard's)

_RULE = RULE_ID_PATTERN.removeprefix("^").removesuffix("$")
# a start of a rule id: its first segment or more, maybe up to a dot (the cut falls anywhere)
_RULE_START = r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*\.?"
_COUNT = rf"[1-9][0-9]{{0,{NUMBER_DIGITS - 1}}}"
_NUMBER = rf"(?:0|{_COUNT})"
_GRAMMAR = re.compile(
    rf"{re.escape(PREFIX)} (?P<word>{'|'.join(map(re.escape, WORDS))}): "
    rf"(?:(?P<rule>{_RULE})|(?P<start>{_RULE_START}){re.escape(CUT_MARK)})"
    rf"(?: GPU (?P<gpu>{_NUMBER}))?(?: \(\+(?P<more>{_COUNT}) more\))?", re.ASCII)
_RULE_ONLY = re.compile(_RULE, re.ASCII)


@dataclass(frozen=True)
class Reason:
    word: str  # one of WORDS
    rule: str  # as written: the whole rule id, or its start when cut
    cut: bool
    gpu: int | None
    more: int  # how many other findings (0: none)

    @classmethod
    def of(cls, word: str, rule: str, gpu: int | None, more: int) -> Reason:
        """The reason for these: the rule id is what gives way to fit 80 characters.
        A word, GPU or count outside the grammar is never written (a word not known is
        `failover`, an index that is no NVML index is left out, the count capped)."""
        word = word if word in WORDS else FAILOVER
        rule = rule if _RULE_ONLY.fullmatch(rule) else FALLBACK_RULE
        limit = 10 ** NUMBER_DIGITS - 1
        gpu = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) \
            and 0 <= gpu <= limit else None
        whole = cls(word, rule, False, gpu, max(0, min(more, limit)))
        over = len(whole.text()) - REASON_MAX
        if over <= 0:
            return whole
        # room: the longest head and tail leave 80 - 28 - 34 = 18 characters for the rule
        return cls(word, rule[:len(rule) - over - len(CUT_MARK)], True, gpu, whole.more)

    def text(self) -> str:
        return (f"{PREFIX} {self.word}: {self.rule}{CUT_MARK if self.cut else ''}"
                + (f" GPU {self.gpu}" if self.gpu is not None else "")
                + (f" (+{self.more} more)" if self.more else ""))


def parse(text: str) -> Reason | None:
    """The reason gpuguard wrote, or None for any other text (see the module's doc)."""
    found = _GRAMMAR.fullmatch(text)
    if found is None:
        return None
    cut = found["start"] is not None
    fits = len(text) == REASON_MAX if cut else len(text) <= REASON_MAX
    if not fits:
        return None
    return Reason(found["word"], found["start"] if cut else found["rule"], cut,
                  int(found["gpu"]) if found["gpu"] is not None else None,
                  int(found["more"]) if found["more"] else 0)


def ours(text: str) -> bool:
    """Exactly gpuguard's grammar, nothing before or after it."""
    return parse(text) is not None
