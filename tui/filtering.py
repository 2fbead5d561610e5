"""The task filter typed after ``/``: regex on the key, ``!`` to invert, ``field:value`` terms.

The decision this module protects: filtering a million tasks at 10 Hz must not cost a million
regex calls per snapshot. Keys are append-only, so the key-regex result is cached per filter and
extended only over keys that are new since the last snapshot; field terms are numpy comparisons
on the snapshot's state columns.

Grammar: whitespace-separated terms, all of which must hold. A term is ``[!]field:value`` with
field one of state, phase, stall, attempt (at least that many), key; or ``[!]regex`` on the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from warpdeck.engine.api import Phase, StallReason, State, TaskView

__all__ = ["FilterError", "TaskFilter"]

_FIELDS = ("state", "phase", "stall", "attempt", "key")


class FilterError(ValueError):
    """A filter that cannot be used; ``term`` is the offending part."""

    def __init__(self, term: str, why: str) -> None:
        super().__init__(f"{term!r}: {why}")
        self.term = term
        self.why = why


@dataclass(slots=True)
class _KeyMatch:
    """A regex over keys, remembered for the keys already seen."""

    pattern: re.Pattern[str]
    matched: list[bool] = field(default_factory=list)

    def mask(self, keys: list[str], n: int) -> npt.NDArray[np.bool_]:
        search = self.pattern.search
        if len(self.matched) < n:
            self.matched.extend(search(k) is not None for k in keys[len(self.matched):n])
        return np.fromiter(self.matched[:n], bool, n)


@dataclass(slots=True)
class _Term:
    invert: bool
    field: str
    value: str
    keys: _KeyMatch | None = None

    def mask(self, view: TaskView) -> npt.NDArray[np.bool_]:
        n = len(view)
        if self.keys is not None:
            m = self.keys.mask(view.keys, n)
        elif self.field == "state":
            if self.value == "stalled":
                m = view.stall != 0
            else:
                m = view.state == State[self.value.upper()]
        elif self.field == "phase":
            m = (view.state == State.RUNNING) & (view.phase == Phase[self.value.upper()])
        elif self.field == "stall":
            m = view.stall != 0 if self.value == "any" else view.stall == StallReason[self.value.upper()]
        else:  # attempt
            m = view.attempt >= int(self.value)
        return ~m if self.invert else m


class TaskFilter:
    """A parsed filter; ``mask(view)`` says which rows pass. Empty text passes everything."""

    def __init__(self, text: str = "") -> None:
        self.text = text.strip()
        self._terms = [self._parse(t) for t in self.text.split()]

    def __bool__(self) -> bool:
        return bool(self._terms)

    @staticmethod
    def _parse(raw: str) -> _Term:
        invert = raw.startswith("!")
        body = raw[1:] if invert else raw
        if not body:
            raise FilterError(raw, "nothing after '!'")
        name, sep, value = body.partition(":")
        if sep and name in _FIELDS:
            return TaskFilter._field_term(raw, invert, name, value)
        return _Term(invert, "key", body, _KeyMatch(_compile(raw, body)))

    @staticmethod
    def _field_term(raw: str, invert: bool, name: str, value: str) -> _Term:
        value = value.lower()
        choices = {
            "state": [s.name.lower() for s in State] + ["stalled"],
            "phase": [p.name.lower() for p in Phase if p],
            "stall": [r.name.lower() for r in StallReason if r] + ["any"],
        }
        if name == "key":
            return _Term(invert, "key", value, _KeyMatch(_compile(raw, value)))
        if name == "attempt":
            if not value.isdigit():
                raise FilterError(raw, "attempt takes a whole number (tasks with at least that many attempts)")
            return _Term(invert, name, value)
        if value not in choices[name]:
            raise FilterError(raw, f"{name} is one of {', '.join(choices[name])}")
        return _Term(invert, name, value)

    def mask(self, view: TaskView) -> npt.NDArray[np.bool_] | None:
        """Rows that pass, or None when there is no filter (everything passes)."""
        if not self._terms:
            return None
        out = np.ones(len(view), bool)
        for term in self._terms:
            out &= term.mask(view)
        return out


def _compile(raw: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise FilterError(raw, f"not a regular expression: {exc}") from None
