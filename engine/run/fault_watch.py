"""The engine's side of faults from outside: outages held and released, and when to stop.

The decisions this module protects: the writers (engine/edges/outage.py) only hold their writes; what
the run does about it is decided here, on the engine's loop, once per tick. While an outage lasts
the feeder admits nothing, no batch starts, and every live task is control-stalled with the
outage's reason (``sink: no space left on device (outputs/)``); when it passes, those stalls are
cleared and the run carries on by itself. An outage past ``[faults] outage_timeout_s``, or a
journal that failed for good, stops the run (``stopped_by``) with nothing marked failed.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.outage import Outage
from warpdeck.engine.run.feeder import Feeder
from warpdeck.engine.state.part_views import OutageView
from warpdeck.engine.state.run_events import RunEvents, StallEvent
from warpdeck.engine.state.task_states import StallReason, State
from warpdeck.engine.state.tasks import TaskTable

__all__ = ["FaultWatch"]


class FaultWatch:
    """Outages and journal failures as the engine acts on them (on its loop)."""

    def __init__(self, timeout_s: float, events: RunEvents | None = None) -> None:
        self._events = events
        """Where an outage's hold is told as a stall of every live task (its start, then its length)."""
        self.outage = Outage(timeout_s)
        """Writes held by a full, read-only or failing disk (outputs or journal)."""
        self.stopped_by = ""
        """Why the engine stopped itself before the end: ``outage`` or ``journal`` ("" otherwise)."""
        self.stop = asyncio.Event()
        """Set when the run is to stop (the engine waits on it beside its lanes)."""
        self._seen: OutageView | None = None
        self._rows: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._held_since = 0.0

    def stop_run(self, why: str) -> None:
        """Stop the run now, leaving what is in flight to a resume; held writes give up."""
        if not self.stopped_by:
            self.stopped_by = why
            self.outage.abandon()
            self.stop.set()

    def check(self, table: TaskTable, feeder: Feeder, t0: float, journal_failed: bool) -> bool:
        """Act on what changed since the last tick; True when an outage just ended (the engine
        wakes its lanes and feeder)."""
        if journal_failed:
            self.stop_run("journal")
        view = self.outage.view()
        was, self._seen = self._seen, view
        ended = False
        if view is not None and was is None:
            feeder.held = True
            rows = np.flatnonzero(table.state[: len(table)] <= State.RUNNING)
            table.set_stall(rows, StallReason.CONTROL, view.reason)
            self._rows = rows
            self._held_since = t0 + view.since  # when the outage began, not when this tick saw it
            if self._events is not None:
                self._events.emit(StallEvent(self._held_since, StallReason.CONTROL.label, len(rows), True,
                                             note=view.reason))
        elif view is None and was is not None:
            feeder.held = False
            rows = self._rows
            live = (table.state[rows] <= State.RUNNING) & (table.stall[rows] == StallReason.CONTROL)
            table.clear_stall(rows[live])
            self._rows = rows[:0]
            if self._events is not None:
                now = time.perf_counter()
                self._events.emit(StallEvent(now, StallReason.CONTROL.label, int(live.sum()), False,
                                             note=was.reason, lasted_s=now - self._held_since))
            ended = True
        if view is not None and time.perf_counter() - t0 - view.since >= view.timeout_s:
            self.stop_run("outage")
        return ended
