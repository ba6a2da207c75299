"""A reading: a value, `not_supported` (the GPU or driver does not offer it: never a
failure), or `error` (the call failed; the rule becomes unknown). In JSON a successful
reading is its plain value; the other two are objects with a `state` key, so a saved
snapshot stays readable by eye. And the fields that hold readings: each declares what a
valid value of it is, checked whenever one is set (Validated)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from gpuguard.model.readings import Validator

T = TypeVar("T")
D = TypeVar("D")
ReadingState = Literal["ok", "not_supported", "error", "absent"]


class Unavailable(Exception):
    """Raised by `Reading.get()` so that a check need not test every reading it uses."""

    def __init__(self, field_name: str, reading: Reading[Any]) -> None:
        self.field_name = field_name
        self.reading = reading
        super().__init__(f"{field_name}: {reading.describe()}")


@dataclass(frozen=True)
class Reading(Generic[T]):
    value: T | None = None
    state: ReadingState = "absent"
    error: str | None = None
    # Set by the owning snapshot so that Unavailable can name the field.
    name: str = field(default="", compare=False, repr=False)

    @classmethod
    def ok(cls, value: T) -> Reading[T]:
        return cls(value=value, state="ok")

    @classmethod
    def not_supported(cls, detail: str | None = None) -> Reading[T]:
        return cls(state="not_supported", error=detail)

    @classmethod
    def failed(cls, error: str) -> Reading[T]:
        return cls(state="error", error=error)

    @property
    def is_ok(self) -> bool:
        return self.state == "ok"

    def get(self) -> T:
        if self.state != "ok":
            raise Unavailable(self.name, self)
        return self.value  # type: ignore[return-value]

    def get_or(self, default: D) -> T | D:
        return self.value if self.state == "ok" else default  # type: ignore[return-value]

    def describe(self) -> str:
        if self.state == "ok":
            return repr(self.value)
        if self.state == "not_supported":
            return "not supported" + (f" ({self.error})" if self.error else "")
        if self.state == "absent":
            return "not collected by this source"
        return f"error: {self.error}"

    def to_json(self) -> Any:
        if self.state == "ok":
            return self.value
        out: dict[str, Any] = {"state": self.state}
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Reading[Any]:
        if isinstance(raw, dict) and "state" in raw:
            state = raw["state"]
            if state not in ("not_supported", "error", "absent"):
                raise ValueError(f"unknown reading state {state!r}")
            error = raw.get("error")
            if error is not None and not isinstance(error, str):
                raise ValueError(f"a reading's error must be text, not {error!r}")
            return cls(state=state, error=error)
        return cls(value=raw, state="ok")


def _absent() -> Reading[Any]:
    return Reading()


def reading_field(valid: Validator) -> Any:
    """A snapshot field holding a Reading, declared with what a valid value of it is (a
    validator of gpuguard/model/readings.py): the one place that says it."""
    return field(default_factory=_absent, metadata={"valid": valid})


class Validated:
    """A dataclass whose readings are checked against their field's declaration whenever
    one is set (built, replayed, merged or changed by a test): a value that is not valid
    for its field becomes an error reading naming what was wrong, so no source, replay or
    worker line can hand a rule a wrong value. Each reading is also named after its field,
    so that Unavailable can say which one a check wanted."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Reading) and value.name != name:
            value = _checked(type(self), name, value)
        object.__setattr__(self, name, value)


_VALIDATORS: dict[type, dict[str, Validator]] = {}


def _checked(cls: type, name: str, reading: Reading[Any]) -> Reading[Any]:
    table = _VALIDATORS.get(cls)
    if table is None:
        table = _VALIDATORS[cls] = {f.name: f.metadata["valid"]
                                    for f in dataclasses.fields(cls)
                                    if "valid" in f.metadata}
    valid = table.get(name)
    if reading.state == "ok" and valid is not None:
        wrong = valid(reading.value)
        if wrong is not None:
            return Reading(state="error", error=f"invalid {name} ({wrong})", name=name)
    if reading.name:  # named after another field: a copy, never a rename under its owner
        return dataclasses.replace(reading, name=name)
    object.__setattr__(reading, "name", name)
    return reading
