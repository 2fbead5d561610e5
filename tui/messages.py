"""Messages from the link to the app.

``SnapshotArrived`` replaces any undelivered one, so a busy app skips straight to the newest
state instead of replaying a backlog; the engine never waits on the UI.
"""

from __future__ import annotations

from textual.message import Message

from warpdeck.engine.api import EngineSnapshot, RunReport

__all__ = ["EngineStopped", "SnapshotArrived"]


class SnapshotArrived(Message):
    """A newer engine snapshot."""

    def __init__(self, snapshot: EngineSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotArrived)


class EngineStopped(Message):
    """The engine has finished (``report``) or died (``error``)."""

    def __init__(self, report: RunReport | None, error: str = "") -> None:
        super().__init__()
        self.report = report
        self.error = error
