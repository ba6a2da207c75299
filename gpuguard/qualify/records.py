"""What the event store says about qualifications (issue 30): the one reader that Slurm's
resume and the supervisor's failback ask "has each of these GPUs passed a qualification
of this level that started after T?". A GPU is named by its UUID and serial (a board that
was swapped keeps its slot's index, never its serial)."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

LEVEL_RANK = {"quick": 0, "standard": 1, "long": 2}
RECENT = 2000  # qualify events read back (newest first): months of runs on 8 GPUs


@dataclass(frozen=True)
class Board:
    """A GPU as a drain record or a service names it."""

    uuid: str | None
    serial: str | None

    def matches(self, uuid: str | None, serial: str | None) -> bool:
        if self.uuid and uuid:
            return self.uuid == uuid and (not self.serial or not serial or
                                          self.serial == serial)
        return bool(self.serial and serial and self.serial == serial)

    def describe(self) -> str:
        return self.uuid or (f"serial {self.serial}" if self.serial else "a GPU")


@dataclass(frozen=True)
class Qualification:
    """One GPU's qualify run, as its event recorded it."""

    time: float            # when it was recorded (its end), wall clock
    started_at: float      # when the run began, wall clock
    uuid: str | None
    serial: str | None
    index: int | None
    level: str
    passed: bool
    drill: bool
    status: str            # pass, or the worst qualify rule's status
    action: str
    message: str
    purpose: str = ""          # what it decided (qualify --purpose)
    bundle: str | None = None  # where its bundle was written (qualify --bundle)
    boot_id: str | None = None  # the boot it ran in (a reboot since a drain: only later ones)
    results: tuple[tuple[str, str], ...] = ()  # (qualify rule, status) as it judged them


def qualifications(state_dir: Path, since: float | None = None) -> list[Qualification]:
    """Every recorded qualification (newest first) since the wall time `since`; none when
    the store does not exist or cannot be read (nothing passed, which keeps a GPU out)."""
    from gpuguard.events import store
    from gpuguard.events.store import StoreUnreadable

    try:
        conn = store.open_reader(store.path_in(state_dir))
    except StoreUnreadable:
        return []
    try:
        found = store.query(conn, since=since, kinds=("qualify",), limit=RECENT)
    except Exception:  # a damaged store: no pass can be read from it
        return []
    finally:
        conn.close()
    out = []
    for e in found:
        data = e.data
        started = data.get("started_at")
        out.append(Qualification(
            time=e.time,
            started_at=float(started) if isinstance(started, int | float) else e.time,
            uuid=e.gpu_uuid, serial=e.gpu_serial, index=e.gpu_index,
            level=str(data.get("level") or ""), passed=data.get("passed") is True,
            drill=data.get("drill") is True, status=e.status or "unknown",
            action=e.action or "none", message=e.message,
            purpose=str(data.get("purpose") or ""),
            bundle=data.get("bundle") if isinstance(data.get("bundle"), str) else None,
            boot_id=e.boot_id, results=_results(data.get("results"))))
    return out


def _results(raw: object) -> tuple[tuple[str, str], ...]:
    """The event's [[rule, status], ...], the pairs of two strings only."""
    if not isinstance(raw, list):
        return ()
    return tuple((str(r[0]), str(r[1])) for r in raw
                 if isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r))


def latest(found: list[Qualification], board: Board, level: str,
           after: float) -> Qualification | None:
    """The newest qualification of this board at `level` or above that started after the
    wall time `after` (the drain, the clearing evidence), passed or not."""
    for q in found:   # newest first
        if q.started_at >= after and board.matches(q.uuid, q.serial) and \
                LEVEL_RANK.get(q.level, -1) >= LEVEL_RANK[level]:
            return q
    return None


def passed_after(state_dir: Path, boards: Iterable[Board], after: float,
                 level: str = "standard") -> tuple[bool, str]:
    """Whether every board's newest qualification since `after` passed; and why not:
    the first board with no qualification, or with a failed one (its finding)."""
    found = qualifications(state_dir, since=after)
    for board in boards:
        q = latest(found, board, level, after)
        if q is None:
            return False, f"no {level} qualification of {board.describe()} since the drain"
        if not q.passed:
            return False, f"the {q.level} qualification of {board.describe()} did not pass: " \
                          f"{q.message}"
    return True, "every GPU passed"
