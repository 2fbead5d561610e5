"""The snapshot builder: the whole run as one immutable ``EngineSnapshot``.

The decision this module protects: a snapshot is cheap enough to make at 10 Hz with a million
tasks (the table's state columns are copied, keys are shared because they are append-only) and
self-contained, so the UI, telemetry and the report read only snapshots and never the engine.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.control.views import merge_workers
from warpdeck.engine.edges.outage import Outage
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.run.run_state import RunState
from warpdeck.engine.state.part_views import WorkerState
from warpdeck.engine.state.snapshot import (
    ControlView,
    Counts,
    EngineSnapshot,
    EngineStatus,
    FeederView,
    LaneView,
    StalledTask,
    TaskView,
    WorkerView,
)
from warpdeck.engine.state.task_states import RUN_PHASES, StallReason, State

if TYPE_CHECKING:
    from warpdeck.engine.control.plane import ControlPlane

__all__ = ["HOST", "ActorRows", "SnapshotBuilder"]

HOST = socket.gethostname()


class ActorRows(Protocol):
    """Where the batches run in other processes (the Ray executor, ``engine/scaleout/``): each
    worker's row, before the monitor adds what it heard."""

    def view(self, worker: str, state: WorkerState, lanes: int, lanes_busy: int, done: int,
             failed: int) -> WorkerView: ...


class SnapshotBuilder:
    """Builds snapshots of one run. ``control`` and ``epoch_of`` are read at each snapshot (the
    control plane joins after the run starts)."""

    def __init__(self, state: RunState, *, backend: Backend, source: Source, outage: Outage,
                 executor: ActorRows | None, control: Callable[[], ControlPlane | None],
                 epoch_of: Callable[[str], int]) -> None:
        self.s = state
        self._backend = backend
        self._source = source
        self._outage = outage
        self._executor = executor
        self._control = control
        self._epoch_of = epoch_of
        self._seq = 0

    def build(self, status: EngineStatus, t0: float) -> EngineSnapshot:
        """The run as of now; ``status`` is the engine's, ``t0`` its start (``time.perf_counter``)."""
        s = self.s
        self._seq += 1
        t = s.table
        n = len(t)
        now = time.perf_counter()
        c = t.counts()
        stall_col = t.stall[:n]
        stalled_rows = np.flatnonzero(stall_col)
        by_reason = np.bincount(stall_col[stalled_rows], minlength=len(StallReason)) if len(stalled_rows) else None
        counts = Counts(
            queued=int(c[State.QUEUED].sum()),
            running={p.label: int(c[State.RUNNING, p]) for p in RUN_PHASES},
            done=int(c[State.DONE].sum()), failed=int(c[State.FAILED].sum()),
            cancelled=int(c[State.CANCELLED].sum()),
            stalled={r.label: int(by_reason[r]) if by_reason is not None else 0 for r in StallReason if r},
            total=n, expected=self._source.total, earlier=getattr(self._source, "finished_before", 0),
        )
        mono = time.monotonic()
        stalled = tuple(
            StalledTask(t.keys[r], StallReason(int(t.stall[r])).label, mono - float(t.stall_since[r]),
                        t.state_of(r).label, t.phase_of(r).label, t.stall_note(r))
            for r in stalled_rows[:500].tolist())
        view = TaskView(t.keys, _frozen(t.state[:n]), _frozen(t.phase[:n]), _frozen(stall_col),
                        _frozen(t.attempt[:n]))
        lanes = tuple(lane.view() for lane in s.lanes)
        feeder = FeederView(s.feeder.state if status == "running" else status,
                            len(s.ready), s.feeder.low, s.feeder.high, n, s.feeder.exhausted,
                            s.auto_depth, len(s.tuner.decisions))
        figures = s.metrics.figures(now, t0, counts.done, counts.failed, s.ready.divergence, s.ready.max_divergence,
                                    s.tuner.threads(s.lanes), s.tuner.machine_cores,
                                    finished=status not in ("starting", "running"))
        plane = self._control()
        control: ControlView | None = plane.view() if plane is not None else None
        backend = self._backend
        return EngineSnapshot(
            seq=self._seq, t=now - t0, t0=t0, pipeline=s.spec.name, status=status,
            backend=backend.name, backend_reason=backend.reason, device=backend.device_name,
            counts=counts, tasks=view, stalled=stalled, lanes=lanes, feeder=feeder,
            timeline=tuple(s.timeline)[-512:], figures=figures, failures=tuple(s.failures),
            workers=self._workers(lanes, counts, plane), control=control, outage=self._outage.view(),
        )

    def _workers(self, lanes: tuple[LaneView, ...], counts: Counts,
                 plane: ControlPlane | None) -> tuple[WorkerView, ...]:
        s = self.s
        local = [self._local_worker(wid, tuple(ln for ln in lanes if s.lane_worker[ln.id] == wid), counts)
                 for wid in s.worker_ids]
        if plane is None:
            return tuple(local)
        return merge_workers(local, plane.workers, s.quarantined, plane.heard())

    def _local_worker(self, wid: str, lanes: tuple[LaneView, ...], counts: Counts) -> WorkerView:
        """An in-process worker: some of this engine's lanes on its backend's device. Task counts
        are the engine's (a task is not tied to one worker across its attempts)."""
        s = self.s
        busy = sum(any(h >= 0 for sl in lane.slots for h in sl.holders) for lane in lanes)
        state = (WorkerState.QUARANTINED if wid in s.quarantined else WorkerState.DEAD if s.leases.held(wid)
                 else WorkerState.ONLINE)
        if self._executor is not None:
            return self._executor.view(wid, state, len(lanes), busy, counts.done, counts.failed)
        return WorkerView(id=wid, state=state, host=HOST, pid=os.getpid(), device=self._backend.device_name,
                          epoch=self._epoch_of(wid), lanes=len(lanes), lanes_busy=busy,
                          progress=sum(lane.batches_done for lane in lanes), tasks_done=counts.done,
                          tasks_failed=counts.failed)


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out = a.copy()
    out.setflags(write=False)
    return out
