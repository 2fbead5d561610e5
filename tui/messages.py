"""Messages from the link to the app.

``SnapshotArrived`` replaces an undelivered one, so a busy app skips straight to the newest state
instead of replaying a backlog; the engine never waits on the UI. It does not replace one whose
workers read differently (``same_workers``): the room tells every loss, wait and return by comparing
each snapshot with the one before it, and a skipped snapshot that showed one hid it (a loss followed
by the wait for a restart was told as the wait alone).
"""

from __future__ import annotations

from textual.message import Message

from warpdeck.engine.api import EngineSnapshot, GateAsk, RunReport
from warpdeck.tui.worker_changes import same_workers

__all__ = ["EngineStopped", "GateAsked", "SnapshotArrived", "StepStarted", "StreamEnded"]


class SnapshotArrived(Message):
    """A newer engine snapshot."""

    def __init__(self, snapshot: EngineSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        """Whether the newer ``message`` may be delivered in this one's place: nothing a worker change
        reads differs between the two (see the module's docstring)."""
        return isinstance(message, SnapshotArrived) and same_workers(self.snapshot.workers, message.snapshot.workers)


class EngineStopped(Message):
    """The engine has finished (``report``) or died (``error``)."""

    def __init__(self, report: RunReport | None, error: str = "") -> None:
        super().__init__()
        self.report = report
        self.error = error


class StreamEnded(Message):
    """A stream of snapshots (a replayed recording) has played to its end: nothing more will come."""


class GateAsked(Message):
    """A run of steps waits at a gate for an answer (``ask``), or no longer does (None)."""

    def __init__(self, ask: GateAsk | None) -> None:
        super().__init__()
        self.ask = ask


class StepStarted(Message):
    """A run of steps began a step (``words``: which, and who waits for it at a barrier)."""

    def __init__(self, words: str) -> None:
        super().__init__()
        self.words = words
