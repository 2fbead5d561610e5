"""The batch log: where and when every recent batch ran, and the stalls that held batches and lanes.

The decisions this module protects:
- A task's story is kept per batch, not per task. Every task of a batch shares its lane, slot,
  worker, epoch and phase intervals, so the log holds one row per batch in columns (like the task
  table) and a task finds its rows through the table's ``batch`` column and, for earlier attempts,
  ``TaskAttempt.batch``. A row costs ``ROW_BYTES`` (79 B): a million tasks at batch size 1 cost
  79 MB, at batch size 64 about 1.2 MB.
- It is bounded. It keeps the newest ``capacity`` batches (1 048 576 by default) and the newest
  ``stall_capacity`` stall episodes (65 536; 30 B each); older rows are overwritten in place. A task
  whose batch is gone keeps what the table has (its batch, attempt, admission and end times), and its
  detail says the phase times are no longer kept.
- One time base. Batch records are on ``time.perf_counter``; the task table, the ready queue and so a
  batch's ``formed`` time are on ``time.monotonic``. The log measures the offset between the two
  clocks once, converts monotonic times when they come in, and stores perf_counter times: absolute
  (float64) for a batch's formation, relative to it (float32: microseconds over hours) for its phases.
- Only the dispatcher writes it, on the engine's loop, a few array stores per batch; readers (the
  task's detail) read it there too, or from any thread once the run is over.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from warpdeck.engine.state.batches import Batch, BatchKey
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.task_states import RUN_PHASES, StallReason
from warpdeck.engine.state.tasks import TaskTable

__all__ = ["BATCH_CAPACITY", "ROW_BYTES", "STALL_CAPACITY", "BatchLog", "LoggedBatch", "LoggedStall"]

BATCH_CAPACITY = 1 << 20
"""How many batches and stall episodes the log keeps (the newest)."""
STALL_CAPACITY = 1 << 16
MIN_LANE_WAIT_S = 1e-3
"""A lane's wait for a batch shorter than this is no episode (it happens before nearly every batch)."""
_MAX_NOTES = 1024
"""Distinct stall notes kept (notes are a handful of fixed texts; any beyond this are dropped)."""
_MAX_WORKERS = int(np.iinfo(np.int16).max)
"""Distinct workers named (a worker's number is an int16 column; any beyond are logged unnamed)."""
_FIRST_ROWS = 1024
_NP = len(RUN_PHASES)
_BATCH_COLUMNS = (("bid", np.int64), ("lane", np.int16), ("slot", np.int16), ("worker", np.int16),
                  ("epoch", np.int64), ("key", np.int32), ("tasks", np.int32), ("formed", np.float64),
                  ("ok", np.int8))
_STALL_COLUMNS = (("bid", np.int64), ("lane", np.int16), ("reason", np.int8), ("kind", np.int8),
                  ("t0", np.float64), ("t1", np.float64), ("note", np.int16))
ROW_BYTES = sum(np.dtype(t).itemsize for _, t in _BATCH_COLUMNS) + _NP * 2 * 4
"""Bytes of one batch row: the columns above and five (start, end) float32 pairs."""
_IN_FLIGHT, _OK, _FAILED = 0, 1, 2
_T = TypeVar("_T")
_BATCH_STALL, _QUEUED_STALL, _LANE_WAIT = 0, 1, 2


@dataclass(frozen=True, slots=True)
class LoggedBatch:
    """One batch as the log keeps it; times are absolute ``time.perf_counter`` seconds."""

    batch: int
    lane: int
    slot: int
    worker: str
    """"" when the log never heard its start (a record without one)."""
    epoch: int
    key: BatchKey | None
    tasks: int
    formed: float
    phases: tuple[tuple[float, float] | None, ...]
    """(start, end) per phase in RUN_PHASES order; None for a phase the batch never reached (while a batch runs, only
    its fill's start is known: its record comes at its end)."""
    ok: bool | None
    """None while the batch is in flight."""


@dataclass(frozen=True, slots=True)
class LoggedStall:
    """One finished stall: a batch's (``queued``: its tasks', while they waited in the queue) or a
    lane's wait for a batch (``batch`` -1). Times are absolute ``time.perf_counter`` seconds."""

    batch: int
    lane: int
    reason: StallReason
    start: float
    end: float
    note: str = ""
    queued: bool = False

    @property
    def lane_wait(self) -> bool:
        return self.batch < 0


class BatchLog:
    """The newest batches' lanes, slots, workers, epochs and phase times, and the newest stalls."""

    def __init__(self, capacity: int = BATCH_CAPACITY, stall_capacity: int = STALL_CAPACITY) -> None:
        if capacity < 1 or stall_capacity < 1:
            raise ValueError("the batch log keeps at least one batch and one stall")
        self.capacity = capacity
        self.stall_capacity = stall_capacity
        p0 = time.perf_counter()
        mono = time.monotonic()
        self.mono_offset = (p0 + time.perf_counter()) / 2 - mono
        """``time.perf_counter() - time.monotonic()``, measured once: the table's clock to the records'."""
        self.origin = p0
        """The run's start on ``time.perf_counter`` (the dispatcher sets it when the run begins)."""
        self._workers: list[str] = []
        self._worker_ix: dict[str, int] = {}
        self._keys: list[BatchKey] = []
        self._key_ix: dict[BatchKey, int] = {}
        self._notes: list[str] = [""]
        self._note_ix: dict[str, int] = {"": 0}
        self._b: dict[str, npt.NDArray[Any]] = {}
        self._ph = np.zeros((0, _NP, 2), np.float32)
        self._s: dict[str, npt.NDArray[Any]] = {}
        self._grow_batches(min(capacity, _FIRST_ROWS))
        self._grow_stalls(min(stall_capacity, _FIRST_ROWS))
        self.stalls_logged = 0
        """Stall episodes logged so far (the ring holds the newest ``stall_capacity``)."""
        self.newest = -1
        """The highest batch id logged so far."""

    # -- clocks -----------------------------------------------------------------------------------
    def from_table(self, t: float) -> float:
        """A task-table (``time.monotonic``) time on the records' clock."""
        return t + self.mono_offset

    def since_start(self, t: float) -> float:
        """A records'-clock time as seconds since the run's start."""
        return t - self.origin

    @property
    def nbytes(self) -> int:
        """Bytes held by the log's columns."""
        return (sum(a.nbytes for a in self._b.values()) + self._ph.nbytes
                + sum(a.nbytes for a in self._s.values()))

    # -- writes (the dispatcher, on the loop) ------------------------------------------------------
    def started(self, batch: Batch, worker: str, epoch: int, table: TaskTable) -> None:
        """``batch`` was handed to its lane (call before the table clears its tasks' queued stalls)."""
        now = time.perf_counter()
        i = self._row(batch.id)
        b = self._b
        formed = batch.formed_at + self.mono_offset
        b["bid"][i] = batch.id
        b["lane"][i] = batch.lane
        b["slot"][i] = batch.slot
        b["worker"][i] = _intern(worker, self._workers, self._worker_ix, _MAX_WORKERS)
        b["epoch"][i] = epoch
        b["key"][i] = _intern(batch.key, self._keys, self._key_ix, len(self._keys) + 1)
        b["tasks"][i] = len(batch.idx)
        b["formed"][i] = formed
        b["ok"][i] = _IN_FLIGHT
        self._ph[i] = np.nan
        self._ph[i, 0, 0] = now - formed  # the fill starts now; the record gives the exact interval
        stall = table.stall[batch.idx]
        if stall.any():  # the stall its tasks had while queued (paused, an outage) ends here
            j = int(np.argmax(stall != 0))
            r = int(batch.idx[j])
            self._add_stall(batch.id, batch.lane, StallReason(int(stall[j])),
                            float(table.stall_since[r]) + self.mono_offset, now, table.stall_note(r), _QUEUED_STALL)

    def finished(self, record: BatchRecord) -> None:
        """A batch's record: its exact phase intervals and whether it succeeded."""
        if record.batch <= self.newest - len(self._ph):  # older than the log keeps: its row is a newer batch's
            return
        i = self._row(record.batch)
        b = self._b
        if int(b["bid"][i]) != record.batch:  # no start heard: what the record says
            b["bid"][i] = record.batch
            b["lane"][i] = record.lane
            b["worker"][i] = b["epoch"][i] = b["key"][i] = -1
            b["tasks"][i] = record.tasks
            b["formed"][i] = record.formed + self.mono_offset
        b["slot"][i] = record.slot
        formed = float(b["formed"][i])
        ph = np.array([(t0 - formed, t1 - formed) if t0 or t1 else (math.nan, math.nan)
                       for t0, t1 in record.phases], np.float32)
        self._ph[i] = ph
        b["ok"][i] = _OK if record.ok else _FAILED

    def stalled(self, batch: int, lane: int, reason: StallReason, start: float, end: float, note: str = "") -> None:
        """A batch's stall ended (times on ``time.perf_counter``)."""
        self._add_stall(batch, lane, reason, start, end, note, _BATCH_STALL)

    def lane_waited(self, lane: int, reason: StallReason, start: float, end: float) -> None:
        """A lane waited for a batch from ``start`` to ``end``: held (control) or none due (memory)."""
        if end - start >= MIN_LANE_WAIT_S:
            self._add_stall(-1, lane, reason, start, end, "", _LANE_WAIT)

    # -- reads ------------------------------------------------------------------------------------
    def get(self, batch: int) -> LoggedBatch | None:
        """The batch's row, None when the log never had it or no longer keeps it."""
        if batch < 0:
            return None
        i = batch % len(self._ph)
        b = self._b
        if int(b["bid"][i]) != batch:
            return None
        formed = float(b["formed"][i])
        # A phase not reached is (nan, nan); a running batch's fill has a start and a nan end.
        phases = tuple(None if math.isnan(t0) else (formed + t0, formed + t1) for t0, t1 in self._ph[i].tolist())
        w, k, ok = int(b["worker"][i]), int(b["key"][i]), int(b["ok"][i])
        return LoggedBatch(batch, int(b["lane"][i]), int(b["slot"][i]), self._workers[w] if w >= 0 else "",
                           int(b["epoch"][i]), self._keys[k] if k >= 0 else None, int(b["tasks"][i]), formed,
                           phases, None if ok == _IN_FLIGHT else ok == _OK)

    def stalls_of(self, batches: Collection[int]) -> list[LoggedStall]:
        """The kept stalls of these batches (queued ones included), oldest first."""
        n = min(self.stalls_logged, len(self._s["bid"]))
        hit = np.flatnonzero(np.isin(self._s["bid"][:n], np.fromiter(batches, np.int64)))
        return self._episodes(hit)

    def overlapping(self, start: float, end: float) -> list[LoggedStall]:
        """The kept stalls of any batch or lane that overlap ``[start, end]``, oldest first."""
        s = self._s
        n = min(self.stalls_logged, len(s["bid"]))
        hit = np.flatnonzero((s["t0"][:n] < end) & (s["t1"][:n] > start))
        return self._episodes(hit)

    # -- storage ----------------------------------------------------------------------------------
    def _row(self, batch: int) -> int:
        size = len(self._ph)
        if batch >= size and size < self.capacity:  # ids are dense from 0: grow until the cap, then wrap
            self._grow_batches(min(self.capacity, max(2 * size, batch + 1)))
        self.newest = max(self.newest, batch)
        return batch % len(self._ph)

    def _grow_batches(self, size: int) -> None:
        old = len(self._ph)
        for name, dtype in _BATCH_COLUMNS:
            col = np.full(size, -1, dtype) if name == "bid" else np.zeros(size, dtype)
            if old:
                col[:old] = self._b[name]
            self._b[name] = col
        ph = np.full((size, _NP, 2), np.nan, np.float32)
        ph[:old] = self._ph
        self._ph = ph

    def _grow_stalls(self, size: int) -> None:
        old = len(self._s["bid"]) if self._s else 0
        for name, dtype in _STALL_COLUMNS:
            col = np.zeros(size, dtype)
            if old:
                col[:old] = self._s[name]
            self._s[name] = col

    def _add_stall(self, batch: int, lane: int, reason: StallReason, start: float, end: float, note: str,
                   kind: int) -> None:
        size = len(self._s["bid"])
        if self.stalls_logged >= size and size < self.stall_capacity:
            self._grow_stalls(min(self.stall_capacity, 2 * size))
            size = len(self._s["bid"])
        i = self.stalls_logged % size
        s = self._s
        s["bid"][i] = batch
        s["lane"][i] = lane
        s["reason"][i] = reason
        s["kind"][i] = kind
        s["t0"][i] = start
        s["t1"][i] = end
        s["note"][i] = max(0, _intern(note, self._notes, self._note_ix, _MAX_NOTES))
        self.stalls_logged += 1

    def _episodes(self, rows: npt.NDArray[np.int64]) -> list[LoggedStall]:
        s = self._s
        rows = rows[np.argsort(s["t0"][rows], kind="stable")]
        return [LoggedStall(int(s["bid"][i]), int(s["lane"][i]), StallReason(int(s["reason"][i])),
                            float(s["t0"][i]), float(s["t1"][i]), self._notes[int(s["note"][i])],
                            int(s["kind"][i]) == _QUEUED_STALL) for i in rows.tolist()]


def _intern(value: _T, values: list[_T], index: dict[_T, int], limit: int) -> int:
    """``value``'s number in ``values`` (appended if new, while fewer than ``limit``; else -1)."""
    ix = index.get(value)
    if ix is None:
        if len(values) >= limit:
            return -1
        ix = index[value] = len(values)
        values.append(value)
    return ix
