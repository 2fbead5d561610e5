"""One run's shared state: what the dispatcher, the command handler and the snapshot builder read
and change, in one small object.

The decision this module protects: the parts of a run are separate classes that can each be
built and tested without the others (and without an event loop), yet they change one table, one
ready queue and one set of leases. They share them through ``RunState``, which holds data and the
few rules that are the state's own (how a task fails for good, how the lanes are woken), and no
policy. Everything here is touched on the engine's loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.run.autotune import Autotuner
from warpdeck.engine.run.batching import ReadyQueue
from warpdeck.engine.run.feeder import Feeder
from warpdeck.engine.run.lane_protocols import LaneLike
from warpdeck.engine.run.task_keys import TaskKeys
from warpdeck.engine.state.batch_log import BatchLog
from warpdeck.engine.state.leases import LeaseBook
from warpdeck.engine.state.metrics import MetricsAccumulator
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.run_events import RunEvents
from warpdeck.engine.state.snapshot import TaskFailure
from warpdeck.engine.state.task_states import State
from warpdeck.engine.state.tasks import TaskTable

__all__ = ["RunState"]

_RUNNING = int(State.RUNNING)


@dataclass(eq=False)
class RunState:
    """The table, ready queue, feeder, leases, lanes and figures of one run."""

    spec: PipelineSpec
    table: TaskTable
    ready: ReadyQueue
    feeder: Feeder
    leases: LeaseBook
    metrics: MetricsAccumulator
    task_keys: TaskKeys
    tuner: Autotuner
    worker_ids: list[str]
    """The workers' ids (in process, or the actors), and the worker each lane belongs to."""
    lane_worker: list[str]
    lanes: Sequence[LaneLike] = ()
    auto_depth: bool = True
    """Whether the tuner may change the lanes' slot depth (an operator's depth turns it off)."""
    quarantined: set[str] = field(default_factory=set)
    """Workers an operator quarantined; the local one among them gets no new batches."""
    failures: deque[TaskFailure] = field(default_factory=lambda: deque(maxlen=200))
    """The last failures (for the snapshot), and the last batch records (for the timeline)."""
    timeline: deque[BatchRecord] = field(default_factory=lambda: deque(maxlen=2048))
    events: RunEvents = field(default_factory=RunEvents)
    """What happens, for the exporters (every batch, stall, command, conviction)."""
    inflight: int = 0
    """Batches handed to lanes and not yet back."""
    cancelled_all: bool = False
    """An operator cancelled the whole run."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def batches(self) -> BatchLog:
        """Where and when each recent batch ran and what stalled (the task keys' log: a detail's story)."""
        return self.task_keys.batches

    @property
    def wake(self) -> asyncio.Event:
        """Set (and replaced) whenever a lane waiting for a batch should look again."""
        return self._wake

    def kick(self) -> None:
        """Wake every lane that waits for a batch."""
        ev, self._wake = self._wake, asyncio.Event()
        ev.set()

    def fail(self, rows: npt.NDArray[np.int64], reason: str, tb: str = "") -> None:
        """Fail ``rows`` for good, keeping each in the snapshot's failures."""
        if len(rows) == 0:
            return
        self.table.fail(rows, reason, tb)
        for r in rows.tolist():
            self.failures.append(TaskFailure(self.table.keys[r], reason, int(self.table.attempt[r])))

    def live(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Those of ``rows`` still running (an operator may have cancelled some on the way)."""
        if len(rows) == 1:  # a batch of one (engine overhead at batch 1)
            return rows if self.table.state[rows[0]] == _RUNNING else rows[:0]
        out: npt.NDArray[np.int64] = rows[self.table.state[rows] == _RUNNING]
        return out
