"""What happened to the workers between two snapshots, in the words the headless display prints.

The decision this module protects: the control room tells a lost worker as it happens, without an
event stream of its own. Snapshots carry every worker's state, epoch and note, locally and over the
wire alike, so comparing two of them finds each loss, wait and return wherever the room runs
(attached or not), and the app notifies each once: when it starts, not while it lasts.
- A notification goes away; what it said does not. ``WorkerLog`` keeps each line with the run's time
  of the snapshot that showed it (``t``, as the status bar counts it: the same in a live, an attached
  and a replayed room), and the workers screen lists the latest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from warpdeck.engine.api import RunEvent, WorkerReborn, WorkerState, WorkerView, WorkerWaiting, worker_line

__all__ = ["WorkerChange", "WorkerLog", "same_workers", "worker_changes"]

Severity = Literal["information", "warning", "error"]

_DOWN = frozenset({WorkerState.DEAD, WorkerState.HUNG, WorkerState.STALE})
"""States a worker is not working in: one that leaves them under a newer epoch is back."""


def worker_changes(before: Sequence[WorkerView], after: Sequence[WorkerView]) -> list[tuple[str, Severity]]:
    """Each worker that was lost, hung, waits to be restarted or is back since ``before``: (line,
    severity). Workers new in ``after`` (the run starting) say nothing."""
    was = {w.id: w for w in before}
    lines: list[tuple[str, Severity]] = []
    for w in after:
        p = was.get(w.id)
        if p is None:
            continue
        if w.state != p.state and w.state in (WorkerState.DEAD, WorkerState.HUNG):
            lines.append((f"worker {w.id} {'lost' if w.state == WorkerState.DEAD else 'hung'}: its batches "
                          "are requeued", "error"))
        # A wait and a return in the words of the engine's own events (the headless lines').
        if w.note != p.note and "waiting" in w.note:
            lines.append((_said(WorkerWaiting(0.0, w.id, w.note)), "warning"))
        if w.epoch > p.epoch and (p.state in _DOWN or p.note) and w.state not in _DOWN:
            lines.append((_said(WorkerReborn(0.0, w.id, w.epoch, w.pid)), "information"))
    return lines


def same_workers(a: Sequence[WorkerView], b: Sequence[WorkerView]) -> bool:
    """Whether ``worker_changes`` reads the same in ``a`` as in ``b`` (each worker's id, state, epoch,
    note and pid, in order): a snapshot between two others may then be skipped, and no change it showed
    goes untold."""
    return len(a) == len(b) and all(
        x.id == y.id and x.state == y.state and x.epoch == y.epoch and x.note == y.note and x.pid == y.pid
        for x, y in zip(a, b, strict=True))


def _said(event: RunEvent) -> str:
    return worker_line(event) or ""  # a worker's event always has its line


@dataclass(frozen=True, slots=True)
class WorkerChange:
    """One line ``worker_changes`` said, at the run's time ``t`` of the snapshot that showed it."""

    t: float
    line: str
    severity: Severity

    def text(self) -> str:
        return f"t {self.t:,.1f}s  {self.line}"


class WorkerLog:
    """The worker changes said in this room, the newest ``keep`` of them, oldest first."""

    def __init__(self, keep: int = 200) -> None:
        self._changes: deque[WorkerChange] = deque(maxlen=keep)
        self.said = 0
        """Changes added so far, the forgotten ones included (grows by one with each)."""

    def add(self, t: float, line: str, severity: Severity) -> WorkerChange:
        change = WorkerChange(t, line, severity)
        self._changes.append(change)
        self.said += 1
        return change

    def latest(self, n: int) -> list[WorkerChange]:
        """The newest ``n`` changes, oldest first."""
        return list(self._changes)[-n:] if n > 0 else []

    def __len__(self) -> int:
        return len(self._changes)
