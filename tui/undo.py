"""Undo for reversible actions: pause, resume, a slot-depth change, quarantine and release.

The decision this module protects: only an action whose inverse is itself a command can be undone
(cancel and drain cannot: cancelled work is gone), and the undo says what it restored, in the
words of the state it went back to ("depth back to 16"), not of the change it reverses. Undo is a
stack, so ``u`` pressed again goes one step further back; it is bounded, because an undo of
something done long before would surprise more than help.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from warpdeck.engine.api import Command

__all__ = ["UNDO_DEPTH", "UndoStack", "Undoable"]

UNDO_DEPTH = 16


@dataclass(frozen=True, slots=True)
class Undoable:
    """The command that reverses an action, and what undoing it restores (in words)."""

    inverse: Command
    restores: str


class UndoStack:
    """The last ``depth`` reversible actions, newest on top; ``pop`` hands each out once."""

    def __init__(self, depth: int = UNDO_DEPTH) -> None:
        self._stack: deque[Undoable] = deque(maxlen=depth)

    def __len__(self) -> int:
        return len(self._stack)

    def push(self, inverse: Command, restores: str) -> None:
        self._stack.append(Undoable(inverse, restores))

    def pop(self) -> Undoable | None:
        return self._stack.pop() if self._stack else None

    def peek(self) -> Undoable | None:
        return self._stack[-1] if self._stack else None
