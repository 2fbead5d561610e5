"""The dispatcher: the lanes' host. It hands out batches, hears each batch's progress, and decides
what a failure means.

The decisions this module protects:
- Only the dispatcher changes the task table on the lanes' behalf, always on the engine's loop;
  lanes report to it (``LaneHost``), so every transition is checked in one place.
- A batch is leased to the worker whose lane took it; a batch taken back from a convicted worker
  is fenced, and nothing it reports afterwards counts.
- A failed attempt is retried per policy, and the failure keeps its reason and traceback. A batch
  that failed as a whole (a stage; an items source's ``load_batch`` or a sink's ``write_batch``,
  which fail every task they held with one exception) has its tasks retried one per batch when
  ``isolate``, so a bad input fails alone instead of taking its batch-mates with it every time. An
  input that cannot be loaded fails at once (retrying cannot fix a corrupt file); a write held by
  an outage and given up is neither done nor failed.
- While the engine is paused, in an outage, or a worker is quarantined or convicted, its lanes
  get no new batch (an empty, finished run still ends).
- Each batch's start (lane, slot, worker, epoch), record and finished stalls, and each lane's wait
  for a batch, go to the batch log (engine/state/batch_log.py), which tells a task's story.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.input_errors import retryable
from warpdeck.engine.edges.outage import OutageAbandoned
from warpdeck.engine.run.autotune import LaneSettings, measure_window
from warpdeck.engine.run.idle_cores import IdleCores
from warpdeck.engine.run.lane_protocols import LaneLike
from warpdeck.engine.run.run_state import RunState
from warpdeck.engine.state.batches import Batch
from warpdeck.engine.state.records import BatchRecord, NonFiniteOutput, format_exception
from warpdeck.engine.state.run_events import BatchFinished, StallEvent, WorkerConvicted
from warpdeck.engine.state.task_states import Phase, StallReason, State

__all__ = ["Dispatcher"]

_TUNE_RECORDS = 256
"""The most records one tuning window holds (its last ones)."""
_REBIRTH_POLL_S = 0.25
"""How often a lane of a convicted worker looks again for its re-birth (a new epoch)."""


@dataclass(slots=True)
class _Stall:
    reason: StallReason
    since: float
    note: str = ""


class Dispatcher:
    """Implements ``LaneHost`` (and the Ray lanes' ``claim`` and ``worker_lost``) over a ``RunState``."""

    def __init__(self, state: RunState, on_convicted: Callable[[str, int, str], None] | None = None) -> None:
        self.s = state
        self._on_convicted = on_convicted
        nl = len(state.lane_worker)
        self._stalls: dict[int, _Stall] = {}
        self._lane_records: dict[int, deque[BatchRecord]] = {i: deque(maxlen=_TUNE_RECORDS) for i in range(nl)}
        self._since_tune: dict[int, int] = dict.fromkeys(range(nl), 0)
        self._tune_clock: dict[int, tuple[float, float]] = {}
        """Per lane: (perf_counter, process_time) at its last tuning (the process's cores in between)."""
        self._idle = {i: IdleCores() for i in range(nl)}
        """Per lane: the machine's idle cores since its last tuning (what other processes left spare too)."""
        self._lane_wait: dict[int, tuple[float, StallReason]] = {}
        self.t0 = time.perf_counter()
        """When the run started (``time.perf_counter``), and how long its first batch took."""
        self.first_batch_s: float | None = None

    @property
    def t0(self) -> float:
        """When the run started (``time.perf_counter``): the batch log's origin, so stories count from it."""
        return self.s.batches.origin

    @t0.setter
    def t0(self, t: float) -> None:
        self.s.batches.origin = t

    # -- handing out batches ----------------------------------------------------------------------
    async def next_batch(self, lane: LaneLike) -> Batch | None:
        """Hand ``lane`` its next batch; None once nothing can come any more."""
        s = self.s
        waited_from = time.perf_counter()
        try:
            while True:
                t0 = time.perf_counter()
                worker = s.lane_worker[lane.id]
                convicted = s.leases.held(worker)
                held = (s.feeder.paused or s.feeder.held or convicted
                        or (bool(s.quarantined) and worker in s.quarantined))
                flush = not s.feeder.admitting
                if not held:
                    batch = s.ready.take(flush=flush)
                    if batch is not None:
                        s.leases.lease(batch, worker)
                        if len(s.ready) <= s.feeder.low:
                            s.feeder.poke()
                        s.metrics.serial_s += time.perf_counter() - t0
                        return batch
                if flush and len(s.ready) == 0 and s.inflight == 0:
                    s.kick()
                    return None
                due = s.ready.next_due()
                wake = s.wake
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
                now = time.perf_counter()
                s.metrics.add_stall(wait[1], now - wait[0])
                s.batches.lane_waited(lane.id, wait[1], wait[0], now)

    def on_admit(self) -> None:
        """The feeder admitted tasks: fail those it could not use, apply waiting cancels and pauses."""
        s = self.s
        if s.feeder.failed_on_admit:
            for row, reason in s.feeder.failed_on_admit:
                s.fail(np.array([row], np.int64), reason)
            s.feeder.failed_on_admit.clear()
        s.task_keys.on_admit()
        if s.feeder.paused:
            s.table.set_stall(np.array(s.ready.pending(), np.int64), StallReason.CONTROL, "paused")
        s.kick()

    # -- LaneHost -----------------------------------------------------------------------------------
    def on_started(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        s = self.s
        worker = s.lane_worker[batch.lane]
        epoch = s.leases.epoch(batch)
        s.batches.started(batch, worker, s.leases.current_epoch(worker) if epoch is None else epoch, s.table)
        s.table.start(batch.idx, batch.id)
        s.inflight += 1
        s.metrics.serial_s += time.perf_counter() - t0

    def fenced(self, batch: Batch) -> bool:
        """True for a batch taken back from a convicted worker: nothing it reports counts."""
        return self.s.leases.fenced(batch)

    def on_filled(self, batch: Batch, errors: Sequence[BaseException | None]) -> Batch:
        s = self.s
        if s.leases.fenced(batch):
            return batch
        keep = [j for j, e in enumerate(errors) if e is None]
        whole = _shared(errors)
        for j, e in enumerate(errors):
            if e is not None:
                self.retry_or_fail(batch.idx[j:j + 1], f"input: {e}", format_exception(e), retry=retryable(e),
                                   isolate=id(e) in whole)
        if not keep:
            s.leases.release(batch)
            s.inflight -= 1
            s.kick()
        return Batch(batch.id, batch.key, batch.idx[keep], [batch.items[j] for j in keep], batch.formed_at,
                     batch.divergence, batch.lane, batch.slot, batch.retry)

    def on_phase(self, batch: Batch, phase: Phase) -> None:
        s = self.s
        if s.leases.fenced(batch):
            return
        t0 = time.perf_counter()
        s.task_keys.on_phase(batch.idx)
        s.table.advance(s.live(batch.idx), phase)
        s.metrics.serial_s += time.perf_counter() - t0

    def on_stall(self, batch: Batch, reason: StallReason, note: str = "") -> None:
        s = self.s
        if s.leases.fenced(batch):
            return
        idx = s.live(batch.idx)
        now = time.perf_counter()
        prev = self._stalls.pop(batch.id, None)
        if prev is not None:
            s.metrics.add_stall(prev.reason, now - prev.since)
            s.batches.stalled(batch.id, batch.lane, prev.reason, prev.since, now, prev.note)
            if s.events.heard:
                s.events.emit(StallEvent(now, prev.reason.label, len(batch), False, batch.id, batch.lane,
                                         lasted_s=now - prev.since))
        if reason is not StallReason.NONE and s.events.heard:
            s.events.emit(StallEvent(now, reason.label, len(batch), True, batch.id, batch.lane, note))
        if reason is StallReason.NONE:
            s.table.clear_stall(idx)
            return
        self._stalls[batch.id] = _Stall(reason, now, note)
        s.table.set_stall(idx, reason, note)

    def on_failed(self, batch: Batch, phase: Phase, exc: BaseException) -> None:
        s = self.s
        if s.leases.fenced(batch):
            s.leases.reject(batch)
            return
        s.leases.release(batch)
        s.inflight -= 1
        self.on_stall(batch, StallReason.NONE)
        idx = s.live(batch.idx)
        reason = f"{phase.name.lower()}: {type(exc).__name__}: {exc}"
        self.retry_or_fail(idx, reason, format_exception(exc), isolate=len(batch) > 1)
        s.kick()

    def on_sunk(self, batch: Batch, errors: Sequence[BaseException | None]) -> None:
        s = self.s
        if s.leases.fenced(batch):  # a result under a convicted epoch: its tasks run elsewhere
            s.leases.reject(batch)
            return
        s.leases.release(batch)
        t0 = time.perf_counter()
        s.inflight -= 1
        self.on_stall(batch, StallReason.NONE)
        s.task_keys.on_phase(batch.idx)
        # Every output written is the usual case: counted in C, with no Python pass per task.
        clean = errors.count(None) == len(errors)
        if clean:
            rows = s.live(batch.idx)
        else:
            ok = np.array([j for j, e in enumerate(errors) if e is None or _written(e)], np.int64)
            rows = s.live(batch.idx[ok] if len(ok) else batch.idx[:0])
        s.table.finish(rows)
        s.metrics.add_latencies(time.monotonic() - s.table.t_queued[rows])
        deque(map(s.feeder.handles.pop, rows.tolist(), itertools.repeat(None)), maxlen=0)  # drop each handle
        if not clean:
            self._sunk_with_errors(batch, errors)
        if self.first_batch_s is None and len(rows):
            self.first_batch_s = time.perf_counter() - self.t0
        s.metrics.serial_s += time.perf_counter() - t0
        s.kick()

    def _sunk_with_errors(self, batch: Batch, errors: Sequence[BaseException | None]) -> None:
        """The outputs of a sunk batch that were not written plainly: flagged ones marked, failed
        ones retried or failed (one per batch where one error failed several)."""
        s = self.s
        for j, e in enumerate(errors):
            if isinstance(e, NonFiniteOutput) and e.written:
                s.table.set_flag(batch.idx[j:j + 1], str(e))
        whole = _shared(errors)
        for j, e in enumerate(errors):
            if e is not None and s.table.state[batch.idx[j]] == State.RUNNING:
                if isinstance(e, OutageAbandoned):  # neither done nor failed: a resume runs it again
                    continue
                if isinstance(e, NonFiniteOutput):  # the same input would give the same values
                    self.retry_or_fail(batch.idx[j:j + 1], str(e), "", retry=False)
                else:
                    self.retry_or_fail(batch.idx[j:j + 1], f"sink: {type(e).__name__}: {e}", format_exception(e),
                                       isolate=id(e) in whole)

    def on_record(self, record: BatchRecord) -> None:
        s = self.s
        t0 = time.perf_counter()
        s.metrics.add(record)
        s.timeline.append(record)
        s.batches.finished(record)
        if s.events.heard:
            worker = s.lane_worker[record.lane]
            s.events.emit(BatchFinished(record, worker, s.leases.current_epoch(worker)))
        recs = self._lane_records[record.lane]
        recs.append(record)
        self._since_tune[record.lane] += 1
        if record.ok and s.tuner.window_ready(record.lane, self._since_tune[record.lane], record.end - recs[0].start):
            self._since_tune[record.lane] = 0
            self._tune(s.lanes[record.lane], recs)
            recs.clear()  # the next window measures the lane as the tuner has just set it
        s.metrics.serial_s += time.perf_counter() - t0

    def _tune(self, lane: LaneLike, recs: deque[BatchRecord]) -> None:
        ok = [r for r in recs if r.ok]
        if self.s.tuner.first_decision(lane.id):
            ok = ok[1:]  # the lane's first batch carries its warm-up, not its steady cost
        if len(ok) < self.s.tuner.records_needed(lane.id):
            return
        if lane.warming(ok[0].start):
            # A fill (sink) worker process started during this window: its batches queued for fewer workers
            # than the tuner set, and judged now, the workers it just added would be taken back
            # (run 7 on 16 cores stopped at 1 where 8 ran 5x faster). The next window judges.
            return
        s = self.s
        wall, cpu = time.perf_counter(), time.process_time()
        w0, c0 = self._tune_clock.get(lane.id, (self.t0, 0.0))
        self._tune_clock[lane.id] = (wall, cpu)
        s.tuner.process_cores = (cpu - c0) / (wall - w0) if wall > w0 and c0 else 0.0
        s.tuner.idle_cores = self._idle[lane.id].read()
        now = LaneSettings(lane.depth, lane.workers(Phase.FILL), lane.workers(Phase.SINK),
                           lane.fill_in_processes)
        used = sum(ln.nbytes for ln in s.lanes)
        new = s.tuner.decide(lane.id, now, measure_window(ok), lane.slot_bytes, used, tune_depth=s.auto_depth)
        if new.depth != now.depth:
            lane.set_depth(new.depth)
        if new.fill_processes != now.fill_processes:
            lane.set_fill_processes(new.fill_processes)
        for phase in (Phase.FILL, Phase.SINK):
            if new.workers(phase) != now.workers(phase):
                lane.set_workers(phase, new.workers(phase))

    # -- failures and convictions -------------------------------------------------------------------
    def retry_or_fail(self, rows: npt.NDArray[np.int64], reason: str, tb: str, *, retry: bool = True,
                      isolate: bool = False) -> None:
        """Another attempt for ``rows`` while the policy allows (``retry``: the error's class allows
        one at all), else fail them for good."""
        s = self.s
        if len(rows) == 0:
            return
        can = retry & (s.table.attempt[rows] < s.spec.retry.max_attempts)  # attempts count from 1
        again, final = rows[can], rows[~can]
        if len(again):
            s.table.new_attempt(again, "failed", reason, tb)
            for r in again.tolist():
                s.ready.put_retry(r, s.feeder.handles[r], isolate and s.spec.retry.isolate)
        s.fail(final, reason, tb)

    def reclaim(self, worker: str, epoch: int, why: str, *, told: bool = True) -> None:
        """``worker`` is convicted under ``epoch``: take back every batch it held. ``told`` off: a
        goodbye the engine asked for, no loss to tell of and no return to wait for."""
        s = self.s
        batches = tasks = 0
        for lease in s.leases.convict(worker, epoch):
            batch = lease.batch
            s.inflight -= 1
            self._stalls.pop(batch.id, None)
            rows = s.live(batch.idx)
            s.table.clear_stall(rows)
            self.retry_or_fail(rows, f"worker {lease.worker} lost (epoch {lease.epoch}, {why})", "")
            batches, tasks = batches + 1, tasks + len(rows)
        if told:
            s.events.emit(WorkerConvicted(time.perf_counter(), worker, epoch, why, batches, tasks))
            if self._on_convicted is not None:
                self._on_convicted(worker, epoch, why)
        s.kick()

    def worker_lost(self, worker: str, epoch: int, reason: str) -> None:
        """Ray reports an actor dead: convict its epoch as a Will would (whichever comes first)."""
        self.reclaim(worker, epoch, f"ray: {reason}")

    def claim(self, batch: Batch, epoch: int) -> bool | None:
        """A remote result for ``batch``, computed under ``epoch``, is in the engine's hands: its
        lease ends now, so no later conviction can requeue what is about to be committed. False:
        the batch was fenced (reject the result); None: the result is from an epoch older than the
        lease's (stale)."""
        leases = self.s.leases
        if leases.fenced(batch):
            return False
        leased = leases.epoch(batch)
        if leased is not None and epoch < leased:
            return None
        leases.release(batch)
        return True


def _written(e: BaseException) -> bool:
    """A flagged output: written, so its task is done (with a flag), not failed."""
    return isinstance(e, NonFiniteOutput) and e.written


def _shared(errors: Sequence[BaseException | None]) -> set[int]:
    """The ids of the exceptions that failed more than one task of a batch: each failed the batch as
    a whole (a ``load_batch`` or ``write_batch`` that raised), so its tasks are retried one per batch."""
    seen: set[int] = set()
    shared: set[int] = set()
    for e in errors:
        if e is not None:
            (shared if id(e) in seen else seen).add(id(e))
    return shared
