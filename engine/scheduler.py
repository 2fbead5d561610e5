"""The scheduler: one engine run, owning the task table, feeder, ready queue, lanes and figures.

The decisions this module protects:
- Only the scheduler changes the task table, always on the event loop; lanes and the feeder
  report to it. So every transition is checked in one place and snapshots are consistent.
- The engine is an async context manager owning a TaskGroup of named tasks (feeder, lanes,
  publisher); leaving it stops and awaits every one of them; nothing is fire-and-forget.
- A failed attempt is retried per policy (one task per batch when ``isolate``), and the failure
  keeps its reason and traceback; an input that cannot be loaded fails at once (retrying cannot
  fix a corrupt file).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends import Backend, NumpyBackend, select_backend
from warpdeck.engine.batching import Batch, ReadyQueue
from warpdeck.engine.commands import (
    Cancel,
    Command,
    CommandResult,
    Drain,
    Pause,
    Quarantine,
    Release,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
)
from warpdeck.engine.config import PipelineSpec, resolve_target
from warpdeck.engine.control.heartbeat import NvmlSampler, WorkerInfo, WorkerProbe
from warpdeck.engine.control.monitor import Verdict
from warpdeck.engine.control.plane import ControlPlane, ControlSettings
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.views import local_worker_id, merge_workers
from warpdeck.engine.feeder import DepthTuner, Feeder
from warpdeck.engine.input_errors import retryable
from warpdeck.engine.journal import Journal, JournaledTable, ResumeState, spec_identity
from warpdeck.engine.lanes import BatchRecord, Lane, NonFiniteOutput, StagePlan, format_exception, plan_stages
from warpdeck.engine.leases import LeaseBook
from warpdeck.engine.metrics import MetricsAccumulator
from warpdeck.engine.report import RunReport, make_report
from warpdeck.engine.resume import ResumingSource
from warpdeck.engine.sinks import DurableSink, Sink, open_sink
from warpdeck.engine.snapshot import (
    Counts,
    EngineSnapshot,
    FeederView,
    LaneView,
    SlotView,
    SnapshotPublisher,
    StalledTask,
    TaskDetail,
    TaskFailure,
    TaskView,
    WorkerView,
)
from warpdeck.engine.sources import BatchKey, Source, TaskInput, open_source
from warpdeck.engine.task_keys import TaskKeys
from warpdeck.engine.tasks import ALL_QUARANTINED, RUN_PHASES, Phase, StallReason, State

if TYPE_CHECKING:
    from warpdeck.engine.scaleout.dispatch import RayLane
    from warpdeck.engine.scaleout.executor import RayExecutor

__all__ = ["Engine"]

#: Fewer successful batches than this in a window say nothing about the bottleneck's idle time.
_TUNE_MIN_RECORDS = 4
_REBIRTH_POLL_S = 0.25
_HOST = socket.gethostname()
_SLOT_STATE = {Phase.NONE: "free", Phase.FILL: "filling", Phase.H2D: "h2d", Phase.COMPUTE: "computing",
               Phase.D2H: "d2h", Phase.SINK: "readable"}


def _version() -> str:
    try:
        return importlib.metadata.version("warpdeck")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "0+unknown"


@dataclass(slots=True)
class _Stall:
    reason: StallReason
    since: float


class Engine:
    """Runs one pipeline spec. Use ``async with Engine(spec) as eng: report = await eng.wait()``."""

    def __init__(self, spec: PipelineSpec, run_dir: Path | str | None = None, *,
                 backend: Backend | None = None, source: Source | None = None, sink: Sink | None = None,
                 snapshot_interval: float = 0.1, journal: bool | None = None, retry_failed: bool = False,
                 control: ControlSettings | None = None, workers: int = 1) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir) if run_dir is not None else Path(".warpdeck") / spec.name
        #: executor = "ray": the actors that run the batches (None: lanes in this process).
        self.executor, workers, backend = _scale_out(spec, self._kick, workers, backend)
        self.backend = backend if backend is not None else select_backend(spec.backend)
        self.sink = sink if sink is not None else open_sink(spec.sink, self.run_dir)
        # A run given a run directory is durable by default: journaled there, resumed from there.
        # Without one (library calls, most tests) nothing is written unless journal=True.
        durable = run_dir is not None if journal is None else journal
        raw_source = source if source is not None else open_source(spec.source)
        self.resume = ResumingSource(raw_source, self.sink) if durable else None
        self.source: Source = self.resume if self.resume is not None else raw_source
        self.retry_failed = retry_failed
        self.journal: Journal | None = None
        self.temps_cleaned = 0
        self.table = JournaledTable()
        self.ready = ReadyQueue(spec.batch_size, spec.batch_timeout_s)
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        # In-process workers: each one a group of spec.lanes lanes with a heartbeat of its own.
        bs, nl = spec.batch_size, spec.lanes * workers
        low, high = feeder_watermarks(spec, nl)
        self.feeder = Feeder(self.source, self.table, self.ready, low, high, on_admit=self._on_admit,
                             prepare=self._prepare if self.resume is not None else None)
        #: Cancel, retry and detail by key (tasks not admitted yet included).
        self.task_keys = TaskKeys(self.table, self.ready, self.feeder, self.source, self.resume)
        self.tuner = DepthTuner(spec.feeder.max_depth, int(spec.feeder.memory_budget_mb * 2**20))
        self.auto_depth = spec.feeder.auto_depth
        self.metrics = MetricsAccumulator(nl)
        self.publisher = SnapshotPublisher()
        self.lanes: Sequence[Lane | RayLane] = (
            self.executor.lanes(self, self.source, self.task_keys.guard(self.sink), self._plan_for)
            if self.executor is not None else
            [Lane(i, self.backend, spec.slot_depth, self, self.source, self.task_keys.guard(self.sink),
                  self._plan_for, bs) for i in range(nl)])
        self._fns = tuple(resolve_target(s.fn) for s in spec.stages)
        self._plans: dict[BatchKey, StagePlan] = {}
        self._wake = asyncio.Event()
        self._inflight = 0
        self._stalls: dict[int, _Stall] = {}
        self._lane_records: dict[int, deque[BatchRecord]] = {i: deque(maxlen=self.tuner.window) for i in range(nl)}
        self._since_tune: dict[int, int] = dict.fromkeys(range(nl), 0)
        self._timeline: deque[BatchRecord] = deque(maxlen=2048)
        self._failures: deque[TaskFailure] = deque(maxlen=200)
        self._lane_wait: dict[int, tuple[float, StallReason]] = {}
        self._snapshot_interval = snapshot_interval
        self._seq = 0
        self._t0 = time.perf_counter()
        self._status = "starting"
        self._cancelled_all = False
        self._main: asyncio.Task[None] | None = None
        self.first_batch_s: float | None = None
        self.report: RunReport | None = None
        #: The workers' ids (in process, or the actors), and the worker each lane belongs to.
        self.worker_ids = _worker_ids(local_worker_id(_HOST, self.backend.device_name), workers, self.executor)
        self.worker_id = self.worker_ids[0]
        self._lane_worker = [self.worker_ids[i // spec.lanes] for i in range(nl)]
        self.leases = LeaseBook(self._epoch_of)
        self._control_settings = control
        self.control: ControlPlane | None = None
        #: Workers an operator quarantined; the local one among them gets no new batches.
        self.quarantined: set[str] = set()

    # -- lifecycle --------------------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        if self.resume is not None:
            journal, state = await asyncio.to_thread(self._open_journal)
            self.journal = journal
            self.table.attach(journal)
            self.resume.begin(state, journal, self.retry_failed)
            self.task_keys.attach(journal, state.cancels)
        self._t0 = time.perf_counter()
        self._status = "running"
        self._main = asyncio.create_task(self._run(), name=f"warpdeck-engine-{self.spec.name}")
        if self._control_settings is not None:
            self._start_control(self._control_settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._main is not None and not self._main.done():
            self._main.cancel()
        if self._main is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._main
        try:
            if self.executor is not None:
                await self.executor.close()
            if self.control is not None:
                # The last telemetry (the final snapshot) goes out before the goodbye.
                await asyncio.to_thread(self.control.stop)
            if self.journal is not None:
                await asyncio.to_thread(self.journal.close)
        finally:
            self.backend.close()

    def _start_control(self, settings: ControlSettings) -> None:
        """Join the control plane (a thread of its own); the first batch never waits for it."""
        # Device load through NVML where the device is a GPU and nvidia-ml-py is installed.
        # (NVML index 0: the CuPy backend drives device 0; CUDA_VISIBLE_DEVICES may renumber it.)
        nvml = NvmlSampler(0) if self.backend.name == "cupy" else None
        local = []
        for wid in self.worker_ids if self.executor is None else ():  # actors heartbeat for themselves
            lanes = [lane for lane in self.lanes if isinstance(lane, Lane) and self._lane_worker[lane.id] == wid]
            local.append((wid, WorkerInfo(device=self.backend.device_name, lanes=len(lanes), version=_version()),
                          _probe(lanes, nvml)))
        self.control = ControlPlane(settings, Topics(self.spec.name), workers=local,
                                    latest=lambda: self.publisher.latest, command=self.command,
                                    on_verdict=self._on_verdict)
        self.control.start()

    def _epoch_of(self, worker: str) -> int:
        """The epoch ``worker`` heartbeats under now (0 without a control plane)."""
        if self.executor is not None:
            remote = self.executor.epoch_of(worker)
            if remote is not None:
                return remote
        plane = self.control
        return plane.epoch_of(worker) if plane is not None else 0

    def _on_verdict(self, verdict: Verdict) -> None:
        """The monitor convicted a worker: take back every batch it held (on the engine's loop)."""
        if verdict.kind == "dead" and verdict.worker_id in self.worker_ids:
            self._reclaim(verdict.worker_id, verdict.epoch, verdict.reason)

    def worker_lost(self, worker: str, epoch: int, reason: str) -> None:
        """Ray reports an actor dead: convict its epoch as a Will would (whichever comes first)."""
        self._reclaim(worker, epoch, f"ray: {reason}")

    def _reclaim(self, worker: str, epoch: int, why: str) -> None:
        for lease in self.leases.convict(worker, epoch):
            batch = lease.batch
            self._inflight -= 1
            self._stalls.pop(batch.id, None)
            rows = self._live(batch)
            self.table.clear_stall(rows)
            reason = f"worker {lease.worker} lost (epoch {lease.epoch}, {why})"
            self._retry_or_fail(rows, reason, "")
        if self.executor is not None:
            self.executor.convicted(worker, epoch, why)
        self._kick()

    def claim(self, batch: Batch, epoch: int) -> bool | None:
        """A remote result for ``batch``, computed under ``epoch``, is in the engine's hands: its
        lease ends now, so no later conviction can requeue what is about to be committed. False:
        the batch was fenced (reject the result); None: the result is from an epoch older than the
        lease's (stale)."""
        if self.leases.fenced(batch):
            return False
        leased = self.leases.epoch(batch)
        if leased is not None and epoch < leased:
            return None
        self.leases.release(batch)
        return True

    def _open_journal(self) -> tuple[Journal, ResumeState]:
        """Lock the run directory, open its journal, clear a killed run's temp files (a thread)."""
        journal, state = Journal.open(self.run_dir, spec_identity(self.spec))
        if isinstance(self.sink, DurableSink):
            try:
                self.temps_cleaned = self.sink.clean_temps()
            except BaseException:
                journal.close()
                raise
        return journal, state

    def _prepare(self, rows: npt.NDArray[np.int64], items: list[TaskInput]) -> None:
        assert self.resume is not None
        self.resume.restore(self.table, rows, items)

    async def wait(self) -> RunReport:
        """Wait for the run to end and return its report."""
        assert self._main is not None, "use the engine inside 'async with'"
        await asyncio.shield(self._main)
        assert self.report is not None
        return self.report

    async def _run(self) -> None:
        try:
            if self.executor is not None:  # before the task group: a failure to start is raised as is
                self.publisher.publish(self.snapshot())
                await self._start_executor(self.executor)
            async with asyncio.TaskGroup() as tg:
                feeder = tg.create_task(self.feeder.run(), name="warpdeck-feeder")
                pub = tg.create_task(self._publish_loop(), name="warpdeck-snapshots")
                lanes = [tg.create_task(lane.run(), name=f"warpdeck-lane{lane.id}") for lane in self.lanes]
                await asyncio.gather(*lanes)
                feeder.cancel()
                pub.cancel()
        finally:
            self._status = self._final_status()
            self.report = make_report(self, self.snapshot())
            self.publisher.publish(self.snapshot())
            self.publisher.close()

    async def _start_executor(self, executor: RayExecutor) -> None:
        """Start the actors once the control plane has a broker to give them (none: no heartbeats)."""
        plane, broker, interval = self.control, None, 0.5
        if plane is not None:
            await asyncio.to_thread(plane.connected.wait, 30)
            broker, interval = plane.address, plane.settings.heartbeat_s
        await executor.start(broker, interval)

    def _final_status(self) -> str:
        """Stopped (work left: tasks queued or running, or a source not exhausted nor drained) beats
        cancelled beats drained beats finished."""
        counts = self.table.counts()
        unfinished = counts[State.QUEUED].sum() + counts[State.RUNNING].sum()
        if unfinished or not (self.feeder.exhausted or self.feeder.draining):
            return "stopped"
        if self._cancelled_all:
            return "cancelled"
        return "drained" if self.feeder.draining else "finished"

    async def _publish_loop(self) -> None:
        while True:
            self.publisher.publish(self.snapshot())
            await asyncio.sleep(self._snapshot_interval)

    def _kick(self) -> None:
        ev, self._wake = self._wake, asyncio.Event()
        ev.set()

    def _on_admit(self) -> None:
        if self.feeder.failed_on_admit:
            for row, reason in self.feeder.failed_on_admit:
                self.table.fail(np.array([row]), reason)
                self._failures.append(TaskFailure(self.table.keys[row], reason, int(self.table.attempt[row])))
            self.feeder.failed_on_admit.clear()
        self.task_keys.on_admit()
        if self.feeder.paused:
            self.table.set_stall(np.array(self.ready.pending(), np.int64), StallReason.CONTROL, "paused")
        self._kick()

    # -- stage plans --------------------------------------------------------------------------------
    def _plan_for(self, key: BatchKey) -> StagePlan:
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_stages(self._fns, self.spec.stages, key, self.spec.nonfinite)
        return plan

    # -- LaneHost -----------------------------------------------------------------------------------
    async def next_batch(self, lane: Lane | RayLane) -> Batch | None:
        """Hand ``lane`` its next batch; None once nothing can come any more."""
        waited_from = time.perf_counter()
        try:
            while True:
                t0 = time.perf_counter()
                # Paused, or this worker quarantined: no new batch (an empty, finished run still ends).
                worker = self._lane_worker[lane.id]
                convicted = self.leases.held(worker)
                held = self.feeder.paused or convicted or (bool(self.quarantined) and worker in self.quarantined)
                flush = self.feeder.exhausted or self.feeder.draining
                if not held:
                    batch = self.ready.take(flush=flush)
                    if batch is not None:
                        self.leases.lease(batch, worker)
                        if len(self.ready) <= self.feeder.low:
                            self.feeder.poke()
                        self.metrics.serial_s += time.perf_counter() - t0
                        return batch
                if flush and len(self.ready) == 0 and self._inflight == 0:
                    self._kick()
                    return None
                due = self.ready.next_due()
                wake = self._wake
                reason = StallReason.CONTROL if held else StallReason.MEMORY
                self._lane_wait[lane.id] = (waited_from, reason)
                timeout = None if due is None or held else max(0.0, due - time.monotonic()) + 1e-4
                if convicted:  # look again for its re-birth (a new epoch)
                    timeout = _REBIRTH_POLL_S
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):  # not wait_for: see Marker.wait
                        await wake.wait()
        finally:
            wait = self._lane_wait.pop(lane.id, None)
            if wait is not None:
                self.metrics.add_stall(wait[1], time.perf_counter() - wait[0])

    def on_started(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        self.table.start(batch.idx, batch.id)
        self._inflight += 1
        self.metrics.serial_s += time.perf_counter() - t0

    def fenced(self, batch: Batch) -> bool:
        """True for a batch taken back from a convicted worker: nothing it reports counts."""
        return self.leases.fenced(batch)

    def on_filled(self, batch: Batch, errors: Sequence[BaseException | None]) -> Batch:
        if self.leases.fenced(batch):
            return batch
        keep = [j for j, e in enumerate(errors) if e is None]
        for j, e in enumerate(errors):
            if e is not None:
                self._retry_or_fail(batch.idx[j:j + 1], f"input: {e}", format_exception(e), retry=retryable(e))
        if not keep:
            self.leases.release(batch)
            self._inflight -= 1
            self._kick()
        return Batch(batch.id, batch.key, batch.idx[keep], [batch.items[j] for j in keep], batch.formed_at,
                     batch.divergence, batch.lane, batch.slot, batch.retry)

    def _live(self, batch: Batch) -> npt.NDArray[np.int64]:
        """The batch's rows still running (an operator may have cancelled some on the way)."""
        idx = batch.idx
        live: npt.NDArray[np.int64] = idx[self.table.state[idx] == State.RUNNING]
        return live

    def on_phase(self, batch: Batch, phase: Phase) -> None:
        if self.leases.fenced(batch):
            return
        t0 = time.perf_counter()
        self._apply_cancels(batch)
        self.table.advance(self._live(batch), phase)
        self.metrics.serial_s += time.perf_counter() - t0

    def on_stall(self, batch: Batch, reason: StallReason, note: str = "") -> None:
        if self.leases.fenced(batch):
            return
        idx = self._live(batch)
        now = time.perf_counter()
        prev = self._stalls.pop(batch.id, None)
        if prev is not None:
            self.metrics.add_stall(prev.reason, now - prev.since)
        if reason is StallReason.NONE:
            self.table.clear_stall(idx)
            return
        self._stalls[batch.id] = _Stall(reason, now)
        self.table.set_stall(idx, reason, note)

    def on_failed(self, batch: Batch, phase: Phase, exc: BaseException) -> None:
        if self.leases.fenced(batch):
            self.leases.reject(batch)
            return
        self.leases.release(batch)
        self._inflight -= 1
        self.on_stall(batch, StallReason.NONE)
        idx = self._live(batch)
        reason = f"{phase.name.lower()}: {type(exc).__name__}: {exc}"
        self._retry_or_fail(idx, reason, format_exception(exc), isolate=len(batch) > 1)
        self._kick()

    def on_sunk(self, batch: Batch, errors: Sequence[BaseException | None]) -> None:
        if self.leases.fenced(batch):  # a result under a convicted epoch: its tasks run elsewhere
            self.leases.reject(batch)
            return
        self.leases.release(batch)
        t0 = time.perf_counter()
        self._inflight -= 1
        self.on_stall(batch, StallReason.NONE)
        self._apply_cancels(batch)
        ok = np.array([j for j, e in enumerate(errors) if e is None or _written(e)], np.int64)
        rows = batch.idx[ok] if len(ok) else batch.idx[:0]
        rows = rows[self.table.state[rows] == State.RUNNING]
        self.table.finish(rows)
        for j, e in enumerate(errors):
            if isinstance(e, NonFiniteOutput) and e.written:
                self.table.set_flag(batch.idx[j:j + 1], str(e))
        now_mono = time.monotonic()
        self.metrics.add_latencies(now_mono - self.table.t_queued[rows])
        for r in rows.tolist():
            self.feeder.handles.pop(r, None)
        for j, e in enumerate(errors):
            if e is not None and self.table.state[batch.idx[j]] == State.RUNNING:
                if isinstance(e, NonFiniteOutput):  # the same input would give the same values
                    self._retry_or_fail(batch.idx[j:j + 1], str(e), "", retry=False)
                else:
                    self._retry_or_fail(batch.idx[j:j + 1], f"sink: {type(e).__name__}: {e}", format_exception(e))
        if self.first_batch_s is None and len(rows):
            self.first_batch_s = time.perf_counter() - self._t0
        self.metrics.serial_s += time.perf_counter() - t0
        self._kick()

    def on_record(self, record: BatchRecord) -> None:
        t0 = time.perf_counter()
        self.metrics.add(record)
        self._timeline.append(record)
        recs = self._lane_records[record.lane]
        recs.append(record)
        self._since_tune[record.lane] += 1
        if self.auto_depth and record.ok and self._since_tune[record.lane] >= self.tuner.window:
            self._since_tune[record.lane] = 0
            self._tune(self.lanes[record.lane], recs)
        self.metrics.serial_s += time.perf_counter() - t0

    def _tune(self, lane: Lane | RayLane, recs: deque[BatchRecord]) -> None:
        ok = [r for r in recs if r.ok]
        if len(ok) < _TUNE_MIN_RECORDS:
            return
        sums = np.array([[r.duration(p) for p in RUN_PHASES] for r in ok]).sum(axis=0)
        i = int(np.argmax(sums))
        starts = [r.phases[i][0] for r in ok]
        ends = [r.phases[i][1] for r in ok]
        span = max(ends) - min(starts)
        idle = 1.0 - float(sums[i]) / span if span > 0 else 0.0
        slot_bytes = lane.ring[0].nbytes if lane.ring else 0
        used = sum(ln.nbytes for ln in self.lanes)
        depth = self.tuner.decide(lane.id, lane.depth, idle, slot_bytes, used)
        if depth != lane.depth:
            lane.set_depth(depth)

    # -- retries and cancels ------------------------------------------------------------------------
    def _retry_or_fail(self, rows: npt.NDArray[np.int64], reason: str, tb: str, *, retry: bool = True,
                       isolate: bool = False) -> None:
        if len(rows) == 0:
            return
        can = retry & (self.table.attempt[rows] < self.spec.retry.max_attempts)  # attempts count from 1
        again, final = rows[can], rows[~can]
        if len(again):
            self.table.new_attempt(again, "failed", reason, tb)
            for r in again.tolist():
                self.ready.put_retry(r, self.feeder.handles[r], isolate and self.spec.retry.isolate)
        if len(final):
            self.table.fail(final, reason, tb)
            for r in final.tolist():
                self._failures.append(TaskFailure(self.table.keys[r], reason, int(self.table.attempt[r])))

    def _apply_cancels(self, batch: Batch) -> None:
        self.task_keys.on_phase(batch.idx)

    # -- commands -----------------------------------------------------------------------------------
    async def command(self, cmd: Command) -> CommandResult:
        """Apply an operator command; the answer says what it did."""
        result = self._apply(cmd)
        self._kick()
        self.feeder.poke()
        return result

    def _apply(self, cmd: Command) -> CommandResult:
        if isinstance(cmd, Pause):
            self.feeder.paused = True
            pending = np.array(self.ready.pending(), np.int64)
            self.table.set_stall(pending, StallReason.CONTROL, "paused")
            return CommandResult(True, len(pending), "paused: no new batches start")
        if isinstance(cmd, Resume):
            self.feeder.paused = False
            pending = np.array(self.ready.pending(), np.int64)
            self.table.clear_stall(pending)
            return CommandResult(True, len(pending), "resumed")
        if isinstance(cmd, Drain):
            self.feeder.draining = True
            return CommandResult(True, len(self.ready), "draining: nothing more is admitted")
        if isinstance(cmd, Cancel):
            if cmd.all:
                self._cancelled_all = True
                return self.task_keys.cancel_all()
            return self.task_keys.cancel(cmd.keys)
        if isinstance(cmd, RetryFailed):
            return self.task_keys.retry(cmd.keys)
        if isinstance(cmd, RequeueStalled):
            waiting = set(self.ready.pending())
            stalled = [r for r in self.table.indices(State.QUEUED, stalled=True).tolist() if r in waiting]
            self.ready.remove(stalled)
            for r in stalled:
                self.ready.put_retry(r, self.feeder.handles[r], isolate=False)
            running = len(self.table.indices(State.RUNNING, stalled=True))
            note = f"; {running} stalled in flight stay with their batch" if running else ""
            return CommandResult(True, len(stalled), f"requeued {len(stalled)} stalled task(s) to the front{note}")
        if isinstance(cmd, Quarantine | Release):
            return self._quarantine(cmd)
        if isinstance(cmd, SetDepth):
            self.auto_depth = False
            for lane in self.lanes:
                if cmd.lane is None or lane.id == cmd.lane:
                    lane.set_depth(cmd.depth)
            return CommandResult(True, 0, f"prefetch depth {cmd.depth} (auto off)")
        return CommandResult(False, 0, f"unknown command {cmd!r}")  # pragma: no cover - union is closed

    def _quarantine(self, cmd: Quarantine | Release) -> CommandResult:
        known = set(self.worker_ids)
        if self.publisher.latest is not None:
            known.update(w.id for w in self.publisher.latest.workers)
        if cmd.worker not in known:
            return CommandResult(False, 0, f"no worker {cmd.worker!r} (known: {', '.join(sorted(known))})")
        if isinstance(cmd, Quarantine):
            self.quarantined.add(cmd.worker)
        else:
            self.quarantined.discard(cmd.worker)
        if self.control is not None:
            self.control.quarantine(cmd.worker, isinstance(cmd, Quarantine))
        # With every local worker quarantined, the waiting tasks are stalled by the operator.
        pending = np.array(self.ready.pending(), np.int64)
        if all(w in self.quarantined for w in self.worker_ids):
            self.table.set_stall(pending, StallReason.CONTROL, ALL_QUARANTINED)
        elif not self.feeder.paused:
            self.table.clear_stall(pending)
        if isinstance(cmd, Quarantine):
            return CommandResult(True, 0, f"worker {cmd.worker} quarantined: no new batches")
        return CommandResult(True, 0, f"worker {cmd.worker} released")

    # -- snapshots ----------------------------------------------------------------------------------
    def task_detail(self, key: str) -> TaskDetail | None:
        """Everything known about one task (admitted, still to come, or finished by an earlier run),
        or None for a key the engine does not know. On the engine's loop while the run lasts; from
        any thread once it has ended (the table no longer changes)."""
        return self.task_keys.detail(key)

    def snapshot(self) -> EngineSnapshot:
        """The engine as of now (cheap enough to call at 10 Hz with a million tasks)."""
        self._seq += 1
        t = self.table
        n = len(t)
        now = time.perf_counter()
        c = t.counts()
        stall_col = t.stall[:n]
        stalled_rows = np.flatnonzero(stall_col)
        by_reason = np.bincount(stall_col[stalled_rows], minlength=len(StallReason)) if len(stalled_rows) else None
        counts = Counts(
            queued=int(c[State.QUEUED].sum()),
            running={p.name.lower(): int(c[State.RUNNING, p]) for p in RUN_PHASES},
            done=int(c[State.DONE].sum()), failed=int(c[State.FAILED].sum()),
            cancelled=int(c[State.CANCELLED].sum()),
            stalled={r.name.lower(): int(by_reason[r]) if by_reason is not None else 0 for r in StallReason if r},
            total=n, expected=self.source.total,
        )
        mono = time.monotonic()
        stalled = tuple(
            StalledTask(t.keys[r], StallReason(int(t.stall[r])).name.lower(), mono - float(t.stall_since[r]),
                        t.state_of(r).name.lower(), t.phase_of(r).name.lower(), t.stall_note(r))
            for r in stalled_rows[:500].tolist())
        view = TaskView(t.keys, _frozen(t.state[:n]), _frozen(t.phase[:n]), _frozen(stall_col),
                        _frozen(t.attempt[:n]))
        lanes = tuple(self._lane_view(lane) for lane in self.lanes)
        feeder = FeederView(self.feeder.state.value if self._status == "running" else self._status,
                            len(self.ready), self.feeder.low, self.feeder.high, n, self.feeder.exhausted,
                            self.auto_depth, len(self.tuner.decisions))
        figures = self.metrics.figures(now, self._t0, counts.done, counts.failed, self.ready.divergence,
                                       self.ready.max_divergence)
        return EngineSnapshot(
            seq=self._seq, t=now - self._t0, t0=self._t0, pipeline=self.spec.name, status=self._status,
            backend=self.backend.name, backend_reason=self.backend.reason, device=self.backend.device_name,
            counts=counts, tasks=view, stalled=stalled, lanes=lanes, feeder=feeder,
            timeline=tuple(self._timeline)[-512:], figures=figures, failures=tuple(self._failures),
            workers=self._workers(lanes, counts), control=self.control.view() if self.control else None,
        )

    def _workers(self, lanes: tuple[LaneView, ...], counts: Counts) -> tuple[WorkerView, ...]:
        local = [self._local_worker(wid, tuple(ln for ln in lanes if self._lane_worker[ln.id] == wid), counts)
                 for wid in self.worker_ids]
        plane = self.control
        if plane is None:
            return tuple(local)
        return merge_workers(local, plane.workers, self.quarantined, plane.heard())

    def _local_worker(self, wid: str, lanes: tuple[LaneView, ...], counts: Counts) -> WorkerView:
        """An in-process worker: some of this engine's lanes on its backend's device. Task counts
        are the engine's (a task is not tied to one worker across its attempts)."""
        busy = sum(any(h >= 0 for s in lane.slots for h in s.holders) for lane in lanes)
        state = "quarantined" if wid in self.quarantined else "dead" if self.leases.held(wid) else "online"
        if self.executor is not None:
            return self.executor.view(wid, state, len(lanes), busy, counts.done, counts.failed)
        return WorkerView(id=wid, state=state, host=_HOST, pid=os.getpid(), device=self.backend.device_name,
                          epoch=self._epoch_of(wid), lanes=len(lanes), lanes_busy=busy,
                          progress=sum(lane.batches_done for lane in lanes), tasks_done=counts.done,
                          tasks_failed=counts.failed)

    @staticmethod
    def _lane_view(lane: Lane | RayLane) -> LaneView:
        if not isinstance(lane, Lane):
            return lane.view()
        slots = []
        for s in lane.ring:
            holders = tuple(b.holder if not b.release.done() else -1 for b in s.buffers())
            state = _SLOT_STATE[s.newest_phase] if any(h >= 0 for h in holders) or s.newest_phase else "free"
            slots.append(SlotView(s.index, state, holders))  # type: ignore[arg-type]
        return LaneView(lane.id, lane.depth, lane.status, lane.output_blocked, lane.batches_done, lane.nbytes,
                        tuple(slots))


def _probe(lanes: list[Lane], nvml: NvmlSampler | None) -> WorkerProbe:
    """What one in-process worker's heartbeat reports, read from the heartbeat's thread."""
    return WorkerProbe(progress=lambda: sum(lane.batches_done for lane in lanes),
                       lanes_busy=lambda: sum(1 for lane in lanes if lane.inflight_ids()),
                       leased=lambda: tuple(b for lane in lanes for b in lane.inflight_ids()),
                       device_stats=nvml if nvml is not None and nvml.available else None)


def _scale_out(spec: PipelineSpec, on_change: Callable[[], None], workers: int,
               backend: Backend | None) -> tuple[RayExecutor | None, int, Backend | None]:
    """For ``executor = "ray"``: the actors (joining the cluster), one worker per actor, and a
    NumPy backend for the engine itself (it computes nothing). Otherwise what was given."""
    if spec.executor.kind != "ray":
        return None, workers, backend
    from warpdeck.engine.scaleout.executor import RayExecutor  # noqa: PLC0415 - only a Ray run loads it

    executor = RayExecutor(spec, on_change)
    return executor, len(executor.workers), backend or NumpyBackend("executor = ray: stages run on the actors")


def _worker_ids(base: str, workers: int, executor: RayExecutor | None) -> list[str]:
    if executor is not None:
        return executor.worker_ids
    return [base] if workers == 1 else [f"{base}.w{k}" for k in range(workers)]


def feeder_watermarks(spec: PipelineSpec, lanes: int | None = None) -> tuple[int, int]:
    """The ready queue's watermarks: the spec's, or 2 and 8 batches per lane, always low < high."""
    batch = spec.batch_size * (spec.lanes if lanes is None else lanes)
    low, high = spec.feeder.low_watermark, spec.feeder.high_watermark
    if high is None:
        low = low or 2 * batch
        return low, max(low + 1, 8 * batch)
    return (low or max(1, min(2 * batch, high // 4))), high


def _written(e: BaseException) -> bool:
    """A flagged output: written, so its task is done (with a flag), not failed."""
    return isinstance(e, NonFiniteOutput) and e.written


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out = a.copy()
    out.setflags(write=False)
    return out
