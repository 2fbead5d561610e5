"""Inside a Ray actor: the host its real lanes report to, fed by the engine's calls.

The decisions this module protects:
- The actor runs the same ``Lane`` as the engine (slot ring, fill → h2d → compute → d2h → sink on
  ordered streams); only its host differs. ``next_batch`` hands over what the engine sent; the
  lane's "sink" keeps each output row for the engine, which commits it under its lease fence.
  So the journal and exactly-once stay in the engine, in one place.
- The actor owns no task table and judges nothing: a failure goes back to the engine as text with
  its phase, and the engine's retry policy decides.
- Task keys inside the actor are ``<batch>/<row>``: the same task may sit in two batches at once
  (a fenced one still running and its new attempt), and their outputs must not mix.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.run.lane_protocols import LaneLike
from warpdeck.engine.scaleout.jobs import BatchJob, BatchOutcome
from warpdeck.engine.scaleout.shared_data import portable
from warpdeck.engine.state.batches import Batch, TaskInput
from warpdeck.engine.state.records import BatchRecord, format_exception
from warpdeck.engine.state.task_states import RUN_PHASES, Phase, StallReason

__all__ = ["ActorHost", "ArrivedSource", "KeepingSink"]


class ArrivedSource:
    """Loads a task from the array the engine sent (``handle`` is the task's input row)."""

    total: int | None = None

    def items(self) -> Iterator[TaskInput]:  # pragma: no cover - the engine enumerates, not the actor
        return iter(())

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        for j, t in enumerate(items):
            np.copyto(out[j], t.handle)
        return [None] * len(items)

    def produces(self, key: str) -> bool | None:  # pragma: no cover - the engine answers for keys, not the actor
        return None


@dataclass(slots=True)
class _Pending:
    job: BatchJob
    epoch: int
    received: float
    done: asyncio.Future[BatchOutcome]
    outputs: npt.NDArray[Any] | None = None
    failure: tuple[str, str, str] | None = None
    record: BatchRecord | None = None
    rows: int = 0
    finishing: bool = False
    fill_errors: list[tuple[int, BaseException]] = field(default_factory=list)
    """Shared data: rows the actor's own source could not load (row, error)."""


class KeepingSink:
    """The lane's sink: copies each output row into its batch's outcome array (``<batch>/<row>``)."""

    def __init__(self, pending: dict[int, _Pending]) -> None:
        self._pending = pending

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        batch, _, row = key.partition("/")
        p = self._pending[int(batch)]
        if p.outputs is None:
            p.outputs = np.empty((len(p.job), *out.shape), out.dtype)
        p.outputs[int(row)] = out
        p.rows += 1


class ActorHost:
    """The ``LaneHost`` of an actor's lanes: one inbox per lane, one future per batch.
    ``epoch_now`` says the worker's epoch as a batch arrives (the outcome carries it)."""

    def __init__(self, lanes: int, epoch_now: Callable[[], int]) -> None:
        self.epoch_now = epoch_now
        self._inbox: list[asyncio.Queue[Batch | None]] = [asyncio.Queue() for _ in range(lanes)]
        self.pending: dict[int, _Pending] = {}

    def submit(self, job: BatchJob) -> asyncio.Future[BatchOutcome]:
        """Queue ``job`` for its lane; the future resolves with its outcome."""
        loop = asyncio.get_running_loop()
        p = _Pending(job, self.epoch_now(), time.perf_counter(), loop.create_future())
        self.pending[job.batch] = p
        # The handle is what the lane's source loads: the row itself (shipped), or the engine's
        # handle for the actor's own source (shared data).
        handles = job.inputs if job.inputs is not None else [t.handle for t in job.items]
        items = [TaskInput(f"{job.batch}/{j}", job.key, handles[j]) for j in range(len(job))]
        batch = Batch(job.batch, job.key, np.arange(len(items), dtype=np.int64), items, p.received)
        self._inbox[job.lane].put_nowait(batch)
        return p.done

    def close(self) -> None:
        """Let every lane finish what it holds and stop."""
        for q in self._inbox:
            q.put_nowait(None)

    # -- LaneHost -------------------------------------------------------------------------------
    async def next_batch(self, lane: LaneLike) -> Batch | None:
        batch = await self._inbox[lane.id].get()
        if batch is not None:
            p = self.pending.get(batch.id)
            if p is not None and p.job.depth != lane.depth:
                lane.set_depth(p.job.depth)
            if p is not None and p.job.fill_workers and p.job.fill_workers != lane.workers(Phase.FILL):
                lane.set_workers(Phase.FILL, p.job.fill_workers)
        return batch

    def on_started(self, batch: Batch) -> None:
        pass

    def fenced(self, batch: Batch) -> bool:
        return False  # the engine fences; the actor always hands its result back

    def on_filled(self, batch: Batch, errors: Sequence[BaseException | None]) -> Batch:
        """Rows the actor's own source could not load go back to the engine (its retry policy
        judges them); the rest run. (``ArrivedSource`` never fails a row.)"""
        p = self.pending.get(batch.id)
        keep = [j for j, e in enumerate(errors) if e is None]
        if p is not None:
            p.fill_errors.extend((int(batch.items[j].key.partition("/")[2]), portable(e))
                                 for j, e in enumerate(errors) if e is not None)
            if not keep:  # nothing left to run: the lane drops the batch
                self._finish_soon(p)
        return Batch(batch.id, batch.key, batch.idx[keep], [batch.items[j] for j in keep], batch.formed_at)

    def on_phase(self, batch: Batch, phase: Phase) -> None:
        pass

    def on_stall(self, batch: Batch, reason: StallReason, note: str = "") -> None:
        pass

    def on_failed(self, batch: Batch, phase: Phase, exc: BaseException) -> None:
        p = self.pending.get(batch.id)
        if p is not None:
            p.failure = (phase.name.lower(), f"{type(exc).__name__}: {exc}", format_exception(exc))
            self._finish_soon(p)

    def on_sunk(self, batch: Batch, errors: Sequence[BaseException | None]) -> None:
        p = self.pending.get(batch.id)
        if p is None:
            return
        bad = next((e for e in errors if e is not None), None)
        if bad is not None or p.rows != len(batch):
            exc = bad or RuntimeError(f"{p.rows} of {len(batch)} outputs kept")
            p.failure = ("sink", f"{type(exc).__name__}: {exc}", format_exception(exc))
        self._finish_soon(p)

    def on_record(self, record: BatchRecord) -> None:
        p = self.pending.get(record.batch)
        if p is not None:
            p.record = record

    # -- outcomes -------------------------------------------------------------------------------
    def _finish_soon(self, p: _Pending) -> None:
        # The lane reports the record right after the result, in the same step: finish after it.
        if not p.finishing:
            p.finishing = True
            asyncio.get_running_loop().call_soon(self._finish, p)

    def _finish(self, p: _Pending) -> None:
        self.pending.pop(p.job.batch, None)
        rec = p.record
        phases = rec.phases if rec is not None else tuple((0.0, 0.0) for _ in RUN_PHASES)
        outcome = BatchOutcome(p.job.batch, p.epoch, None if p.failure else p.outputs, p.failure, p.received,
                               phases, rec.slot if rec is not None else -1, tuple(p.fill_errors))
        if not p.done.done():
            p.done.set_result(outcome)
