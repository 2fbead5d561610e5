"""The engine's side of one remote lane: load a batch, send it to its actor, commit what returns.

The decisions this module protects:
- Dispatch is asyncio end to end: the call to the actor is an awaited object ref, so one event
  loop keeps every actor busy without a thread per call.
- In flight per remote lane is bounded by the lane's slot depth (the auto-tuner may change it):
  the actor's ring stays full and no work piles up where a death would strand it.
- The engine commits: outputs come back through Ray's object store and the engine's sink writes
  them on this lane's sink thread, after ``claim`` took the batch out of the fence's reach on the
  event loop. A batch fenced before its result arrived is rejected and writes nothing; one claimed
  is committed whatever happens to its actor afterwards. So the journal, the sink and exactly-once
  stay in one place, as for in-process lanes.
- Inputs are loaded by the engine's source on this lane's fill thread (the same ``Source`` as in
  process: resume, input errors and retries behave alike), then travel as one array. With shared
  data (``shared_data.py``) only the tasks' keys and handles travel: the actor loads and stages,
  and this lane's sink thread commits (renames) what it staged, after ``claim`` as above.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import Marker, StreamSet
from warpdeck.engine.edges.sinks import Sink
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.run.lane_io import load_rows, write_outputs
from warpdeck.engine.run.lane_protocols import LaneHost
from warpdeck.engine.run.phase_times import phase_spans
from warpdeck.engine.run.slots import Slot
from warpdeck.engine.scaleout.jobs import BatchJob, BatchOutcome
from warpdeck.engine.scaleout.raylink import WorkerCallFailed, WorkerDied
from warpdeck.engine.scaleout.remote import RemoteWorker
from warpdeck.engine.state.batches import Batch, BatchKey
from warpdeck.engine.state.records import BatchRecord, StagePlan
from warpdeck.engine.state.snapshot import LaneStatus, LaneView, SlotView
from warpdeck.engine.state.task_states import Phase

__all__ = ["DispatchHost", "RayLane", "RemoteFailure", "StaleEpoch"]

_ON_ACTOR = (Phase.H2D, Phase.COMPUTE, Phase.D2H)
"""The phases an actor measures (on its clock) for shipped batches, and with shared data."""
_ON_ACTOR_SHARED = (Phase.FILL, *_ON_ACTOR)


class RemoteFailure(RuntimeError):
    """A batch failed on its actor; the actor's traceback is kept as text."""

    def __init__(self, worker_id: str, phase: str, message: str, tb: str) -> None:
        self.worker_id = worker_id
        self.phase = phase
        self.remote_traceback = tb
        super().__init__(f"on {worker_id}: {message}")


class StaleEpoch(RuntimeError):
    """A result computed under an older epoch than its batch was leased under."""


class DispatchHost(LaneHost, Protocol):
    """What a remote lane reports to: the dispatcher's ``LaneHost`` and two more calls."""

    def claim(self, batch: Batch, epoch: int) -> bool | None:
        """A result for ``batch`` under ``epoch`` is in hand: end its lease so no conviction can
        take it back now. False: fenced (reject it); None: leased under a newer epoch (stale)."""
        ...

    def worker_lost(self, worker: str, epoch: int, reason: str) -> None:
        """``worker``'s ``epoch`` is dead (Ray says so): convict it and requeue its batches."""
        ...


class RayLane:
    """Lane ``remote_lane`` of actor ``worker``, numbered ``lane_id`` among the engine's lanes."""

    def __init__(self, lane_id: int, worker: RemoteWorker, remote_lane: int, depth: int, host: DispatchHost,
                 source: Source, sink: Sink, plan_for: Callable[[BatchKey], StagePlan], policy: str,
                 shared: bool = False) -> None:
        self.id = lane_id
        self.worker = worker
        self.remote_lane = remote_lane
        self.host = host
        self.source = source
        self.sink = sink
        self.plan_for = plan_for
        self.policy = policy
        self.shared = shared
        """Shared data: the actor loads and stages; this lane sends keys and commits."""
        self._depth = max(2, depth)
        self.ring: list[Slot] = []
        """The slots live in the actor; the engine shows the batches it has out instead."""
        self.status: LaneStatus = "starting"
        self.output_blocked = False
        self.batches_done = 0
        self.nbytes = 0
        self._out: dict[int, tuple[Batch, asyncio.Task[None]]] = {}
        """Batches out: id -> the batch and the task dispatching it."""
        self._abandoned: set[int] = set()
        """Batches whose dispatch was given up because the engine fenced them."""
        self._room = asyncio.Event()
        self.streams = StreamSet(lane_id)

    @property
    def depth(self) -> int:
        return self._depth

    def set_depth(self, depth: int) -> None:
        """Batches in flight at once (sent to the actor with the next batch for its ring)."""
        self._depth = max(2, depth)
        self._room.set()

    def workers(self, phase: Phase) -> int:
        """Threads loading (fill) or writing (sink) this lane's batches on the engine's side."""
        return self.streams.workers(phase)

    def set_workers(self, phase: Phase, workers: int) -> None:
        self.streams.resize(phase, workers)

    @property
    def fill_in_processes(self) -> bool:
        """The engine's side of a Ray lane loads on its threads: the actor does the heavy loading."""
        return False

    def set_fill_processes(self, on: bool) -> None:
        """Stays on threads (see ``fill_in_processes``)."""

    def warming(self, since: float) -> bool:
        return False

    def inflight_ids(self) -> tuple[int, ...]:
        return tuple(self._out)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one batch out on the actor (inputs and outputs; the largest seen)."""
        return self.nbytes

    def view(self) -> LaneView:
        """The lane as the snapshot shows it: a slot per batch out on the actor."""
        slots = tuple(SlotView(i, "computing", (bid, bid, bid, bid)) for i, bid in enumerate(self._out))
        return LaneView(self.id, self.depth, self.status, False, self.batches_done, self.nbytes, slots,
                        self.workers(Phase.FILL), self.workers(Phase.SINK))

    # -- run ------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Send batches while there is room, until the engine has none or the actor is gone."""
        try:
            async with asyncio.TaskGroup() as tg:
                while True:
                    while len(self._out) >= self._depth:
                        self.status = "waiting for the actor"
                        self._room.clear()
                        await self._room.wait()
                    self.status = "waiting for input"
                    batch = await self._next()
                    if batch is None:
                        return
                    batch.lane = self.id
                    self.host.on_started(batch)
                    name = f"warpdeck-{self.worker.id}.{self.remote_lane}-b{batch.id}"
                    self._out[batch.id] = (batch, tg.create_task(self._one(batch), name=name))
        finally:
            self.status = "stopped" if not self.worker.gone.is_set() else "worker gone"
            await asyncio.to_thread(self.streams.close)

    async def _next(self) -> Batch | None:
        """The engine's next batch for this lane, or None when the run or the actor ended."""
        if self.worker.gone.is_set():
            return None
        want = asyncio.ensure_future(self.host.next_batch(self))
        gone = asyncio.ensure_future(self.worker.gone.wait())
        try:
            await asyncio.wait({want, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not want.done():
                want.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await want
        return want.result() if not want.cancelled() else None

    def abandon_fenced(self) -> int:
        """Stop waiting for every batch out that the engine fenced: its tasks already run elsewhere,
        and a frozen or cut-off actor must not hold this lane (and so the run) until it wakes. Its
        result, should it come, is dropped by Ray. Returns how many were given up."""
        n = 0
        for bid, (batch, task) in list(self._out.items()):
            if bid not in self._abandoned and self.host.fenced(batch):
                self._abandoned.add(bid)
                task.cancel()
                n += 1
        return n

    async def _one(self, batch: Batch) -> None:
        try:
            await self._dispatch(batch)
        except asyncio.CancelledError:
            if batch.id not in self._abandoned:
                raise
            self.host.on_failed(batch, Phase.COMPUTE, asyncio.CancelledError("fenced"))  # counted as rejected
        finally:
            self._out.pop(batch.id, None)
            self._abandoned.discard(batch.id)
            self._room.set()

    async def _dispatch(self, batch: Batch) -> None:
        host = self.host
        loaded = await (self._keys_only(batch) if self.shared else self._fill(batch))
        if loaded is None:
            return
        batch, inputs, fill = loaded
        epoch = self.worker.epoch
        # Phases step one at a time; on the actor (h2d, compute, d2h there) the tasks show as compute.
        host.on_phase(batch, Phase.H2D)
        host.on_phase(batch, Phase.COMPUTE)
        sent = time.perf_counter()
        items, fill_workers = (tuple(batch.items), self.workers(Phase.FILL)) if self.shared else ((), 0)
        job = BatchJob(batch.id, self.remote_lane, batch.key, inputs, self._depth, items, fill_workers)
        try:
            outcome = await self.worker.run(job)
        except WorkerDied as exc:
            host.worker_lost(self.worker.id, epoch, exc.detail)
            host.on_failed(batch, Phase.COMPUTE, exc)  # fenced now: rejected, its tasks already requeued
            return
        except WorkerCallFailed as exc:
            host.on_failed(batch, Phase.COMPUTE, exc)
            return
        sent_items = batch.items  # the job's rows, before any failed to load
        if outcome.fill_errors:  # shared data: inputs the actor could not load (input errors)
            errors: list[BaseException | None] = [None] * len(batch)
            for j, e in outcome.fill_errors:
                errors[j] = e
            batch = host.on_filled(batch, errors)
            if len(batch) == 0:
                return
        markers = [] if fill is None else [fill]
        if outcome.failure is not None:
            phase, message, tb = outcome.failure
            host.on_failed(batch, Phase[phase.upper()], RemoteFailure(self.worker.id, phase, message, tb))
            host.on_record(self._record(batch, markers, outcome, sent, ok=False))
            return
        claimed = host.claim(batch, outcome.epoch)
        if claimed is None:
            stale = StaleEpoch(f"a result under epoch {outcome.epoch} from {self.worker.id}")
            host.on_failed(batch, Phase.COMPUTE, stale)
            return
        if not claimed:  # convicted meanwhile: its tasks run elsewhere; this result is not written
            host.on_sunk(batch, [])
            return
        late = {sent_items[j].key: e for j, e in outcome.sink_errors}
        await self._commit(batch, outcome, markers, sent, 0 if inputs is None else int(inputs.nbytes), late)

    async def _keys_only(self, batch: Batch) -> tuple[Batch, None, None] | None:
        """Shared data: nothing to load here; the batch goes unless its stages refuse its key."""
        try:
            self.plan_for(batch.key)
        except Exception as exc:  # noqa: BLE001 - a stage's out_spec refusing this key fails the batch
            self.host.on_failed(batch, Phase.FILL, exc)
            return None
        return batch, None, None

    async def _fill(self, batch: Batch) -> tuple[Batch, npt.NDArray[Any], Marker] | None:
        """Load the batch's inputs on the fill thread; None when nothing is left to send."""
        host = self.host
        try:
            self.plan_for(batch.key)
        except Exception as exc:  # noqa: BLE001 - a stage's out_spec refusing this key fails the batch
            host.on_failed(batch, Phase.FILL, exc)
            return None
        inputs = np.empty((len(batch), *batch.key.shape), np.dtype(batch.key.dtype))
        fill = self.streams.submit(Phase.FILL, lambda: load_rows(self.source.load, batch.items, inputs))
        try:
            await fill.wait()
        except Exception as exc:  # noqa: BLE001 - the source itself broke: the batch fails
            host.on_failed(batch, Phase.FILL, exc)
            host.on_record(self._record(batch, [fill], None, 0.0, ok=False))
            return None
        errors: list[BaseException | None] = fill.future.result()
        if any(e is not None for e in errors):
            batch = host.on_filled(batch, errors)
            if len(batch) == 0:
                return None
            inputs = inputs[: len(batch)]  # the good rows, moved up by load_rows
        if host.fenced(batch):  # convicted while loading: counted as rejected, its tasks run elsewhere
            host.on_failed(batch, Phase.FILL, RuntimeError("fenced"))
            return None
        return batch, inputs, fill

    async def _commit(self, batch: Batch, outcome: BatchOutcome, markers: list[Marker], sent: float, in_bytes: int,
                      late: dict[str, BaseException]) -> None:
        """Write the outputs through the engine's sink, or (shared data) rename what the actor
        staged, on this lane's sink thread; then report. ``late``: rows the actor did not stage
        or flagged (shared data), by key."""
        host = self.host
        host.on_phase(batch, Phase.D2H)
        host.on_phase(batch, Phase.SINK)
        if self.shared:
            keys, staged, commit = outcome.staged_keys, outcome.staged, self.sink.commit  # type: ignore[attr-defined]
            sink = self.streams.submit(Phase.SINK, lambda: commit(keys, staged) if keys else None)
        else:
            out, ordered = outcome.outputs, [t.key for t in batch.items]
            sink = self.streams.submit(Phase.SINK, lambda: write_outputs(self.sink, ordered, out, self.policy))
        try:
            await sink.wait()
        except Exception as exc:  # noqa: BLE001 - the sink itself broke
            host.on_failed(batch, Phase.SINK, exc)
            return
        self.batches_done += 1
        self.worker.batches_done += 1
        self.nbytes = max(self.nbytes, in_bytes + outcome.nbytes)
        errors = [late.get(t.key) for t in batch.items] if self.shared else sink.future.result()
        host.on_sunk(batch, errors)
        host.on_record(self._record(batch, [*markers, sink], outcome, sent, ok=True))

    def _record(self, batch: Batch, markers: Sequence[Marker], outcome: BatchOutcome | None, sent: float,
                ok: bool) -> BatchRecord:
        """The batch's phases on the engine's clock: fill and sink measured here, h2d, compute and
        d2h the actor's, shifted so that its arrival is when the engine sent it."""
        phases = phase_spans(markers)
        if outcome is not None:
            shift = sent - outcome.received
            for p in _ON_ACTOR_SHARED if self.shared else _ON_ACTOR:
                t0, t1 = outcome.phases[p - 1]
                if t0:
                    phases[p - 1] = (t0 + shift, t1 + shift)
            staged_at = outcome.phases[Phase.SINK - 1][0]
            if self.shared and staged_at and phases[Phase.SINK - 1][1]:  # staged there, committed here
                phases[Phase.SINK - 1] = (staged_at + shift, phases[Phase.SINK - 1][1])
        slot = outcome.slot if outcome is not None else -1
        return BatchRecord(batch.id, self.id, slot, len(batch), str(batch.key), batch.formed_at, tuple(phases), ok,
                           len(batch) * batch.key.nbytes, out_nbytes=len(batch) * self.plan_for(batch.key).out_nbytes)
