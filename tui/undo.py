"""Undo for reversible actions: pause, resume and a prefetch-depth change.

The decision this module protects: only an action whose inverse is itself a command can be undone
(cancel and drain cannot: cancelled work is gone), and only for a short while, because an undo
long after the fact would surprise more than it helps.
"""

from __future__ import annotations

from dataclasses import dataclass

from warpdeck.engine.api import Command

__all__ = ["UNDO_WINDOW_S", "UndoSlot", "Undoable"]

UNDO_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class Undoable:
    """What was done (in words), the command that reverses it, and when."""

    label: str
    inverse: Command
    at: float


class UndoSlot:
    """Holds the last reversible action; ``take`` hands it out once, within the window."""

    def __init__(self, window_s: float = UNDO_WINDOW_S) -> None:
        self.window_s = window_s
        self._last: Undoable | None = None

    def push(self, label: str, inverse: Command, now: float) -> None:
        self._last = Undoable(label, inverse, now)

    def clear(self) -> None:
        self._last = None

    def take(self, now: float) -> Undoable | None:
        last, self._last = self._last, None
        if last is None or now - last.at > self.window_s:
            return None
        return last
