"""The feeder keeps the ready queue between its watermarks (the autotuner, engine/run/autotune.py, sizes the lanes).

The decisions this module protects:
- The source is pulled off the event loop in chunks, only when the ready queue has fallen to the
  low watermark, and only up to the high one; a slow or infinite source never floods memory.
- Backpressure from the sink: while lanes report their outputs blocked, the feeder refills only
  to the low watermark, so a slow sink does not pile admitted work up behind it.
- Operator control (pause, drain) is state here; the dispatcher and lanes read it.
- A task the operator cancelled before it was admitted (``withheld``) enters the table but never the
  ready queue; the engine records it cancelled (``cancelled_on_admit``), so it never runs.
- A source that raises part way (a bucket gone, a generator's own bug) is not the feeder's crash:
  what it yielded before is admitted, the error is kept with its traceback (``source_error``), and
  nothing more is pulled. What was admitted finishes and the run ends stopped (``stopped_by =
  "source"``, exit status 4), so that a resume carries on once the source is fixed.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.run.batching import ReadyQueue
from warpdeck.engine.state.batches import BatchKey, TaskInput
from warpdeck.engine.state.part_views import FeederState
from warpdeck.engine.state.tasks import TaskTable

__all__ = ["Feeder", "feeder_watermarks"]


def feeder_watermarks(spec: PipelineSpec, lanes: int | None = None) -> tuple[int, int]:
    """The ready queue's watermarks: the spec's, or 2 and 8 batches per lane, always low < high."""
    batch = spec.batch_size * (spec.lanes if lanes is None else lanes)
    low, high = spec.feeder.low_watermark, spec.feeder.high_watermark
    if high is None:
        low = low or 2 * batch
        return low, max(low + 1, 8 * batch)
    return (low or max(1, min(2 * batch, high // 4))), high


class Feeder:
    """Admits tasks from ``source`` into ``table`` and ``ready``."""

    def __init__(self, source: Source, table: TaskTable, ready: ReadyQueue, low: int, high: int,
                 on_admit: Callable[[], None] = lambda: None,
                 prepare: Callable[[npt.NDArray[np.int64], list[TaskInput]], None] | None = None) -> None:
        if not 0 < low < high:
            raise ValueError(f"watermarks must satisfy 0 < low < high (got low={low}, high={high})")
        self.source = source
        self.table = table
        self.ready = ready
        self.low = low
        self.high = high
        self.handles: dict[int, TaskInput] = {}
        self.paused = False
        self.held = False
        """An outage (a full or read-only disk): nothing is admitted until it passes."""
        self.draining = False
        self.exhausted = False
        self.backpressure = False
        self.pulls = 0
        self.pull_seconds = 0.0
        self._it: Iterator[TaskInput] | None = None
        self._wake = asyncio.Event()
        self._on_admit = on_admit
        self.prepare = prepare
        """Called with the new rows before they are queued (a resumed run restores attempts)."""
        self.failed_on_admit: list[tuple[int, str]] = []
        self.withheld: set[str] = set()
        """Keys cancelled before admission (the engine's, shared); each is taken out when admitted."""
        self.cancelled_on_admit: list[int] = []
        self.source_error = ""
        """The source's error where its iteration raised (``RuntimeError: ...``), and its traceback."""
        self.source_traceback = ""

    @property
    def state(self) -> FeederState:
        if self.draining:
            return FeederState.DRAINING
        if self.paused:
            return FeederState.PAUSED
        if self.held:
            return FeederState.OUTAGE
        if self.exhausted:
            return FeederState.EXHAUSTED
        if self.backpressure:
            return FeederState.BACKPRESSURE
        return FeederState.FULL if len(self.ready) >= self.target else FeederState.FILLING

    @property
    def admitting(self) -> bool:
        """False once nothing more will be admitted: the source is exhausted or failed, or the run drains."""
        return not (self.exhausted or self.draining or self.source_error)

    @property
    def target(self) -> int:
        """How full the ready queue is kept now: the low watermark under backpressure."""
        return self.low if self.backpressure else self.high

    def wanted(self) -> int:
        """How many tasks to pull now: none above the low watermark, else up to the target."""
        if self.held or not self.admitting:
            return 0
        n = len(self.ready)
        return self.target - n if n <= self.low else 0

    def poke(self) -> None:
        """Something changed (a batch was taken, backpressure moved): re-check the watermarks."""
        self._wake.set()

    def set_watermarks(self, low: int, high: int) -> None:
        """Move the watermarks (the depth tuner widens them with the rings)."""
        if 0 < low < high:
            self.low, self.high = low, high
            self.poke()

    def _pull(self, n: int) -> tuple[list[TaskInput], BaseException | None]:
        """Up to ``n`` items (a thread), and the source's error where its iteration raised: kept
        apart until the loop has admitted what came before it, so no lane sees the end first."""
        if self._it is None:
            self._it = self.source.items()
        out: list[TaskInput] = []
        try:
            for item in self._it:
                out.append(item)
                if len(out) >= n:
                    break
        except Exception as exc:  # noqa: BLE001 - the source's own failure: kept and told, never raised
            return out, exc
        return out, None

    def admit(self, items: list[TaskInput]) -> None:
        """Add pulled items to the table and the ready queue."""
        rows = self.table.add([t.key for t in items], _nbytes(items))
        if self.prepare is not None:
            self.prepare(rows, items)
        withheld = self.withheld
        row_list = rows.tolist()
        if not withheld and not any(t.error for t in items):  # the usual case: every item goes to the queue
            self.handles.update(zip(row_list, items, strict=True))
            self.ready.put_many(row_list, items)
            self._on_admit()
            return
        for row, item in zip(row_list, items, strict=True):
            if withheld and item.key in withheld:
                withheld.discard(item.key)
                self.cancelled_on_admit.append(row)
                self.handles[row] = item
                continue
            if item.error:
                self.failed_on_admit.append((row, item.error))
                continue
            self.handles[row] = item
            self.ready.put(row, item)
        self._on_admit()

    async def step(self) -> int:
        """One pull if the watermarks ask for it; returns how many tasks were admitted."""
        n = self.wanted()
        if n <= 0:
            return 0
        t0 = time.perf_counter()
        items, failed = await asyncio.to_thread(self._pull, n)
        self.pull_seconds += time.perf_counter() - t0
        self.pulls += 1
        if failed is not None:
            self.source_error = f"{type(failed).__name__}: {failed}"
            self.source_traceback = "".join(traceback.format_exception(failed))
        elif len(items) < n:
            self.exhausted = True
        if items:
            self.admit(items)
        elif not self.admitting:
            self._on_admit()
        return len(items)

    async def run(self) -> None:
        """Keep the ready queue between the watermarks until the source is exhausted or failed, or the run drains."""
        while self.admitting:
            if await self.step() == 0:
                self._wake.clear()
                if self.wanted() <= 0:
                    await self._wake.wait()


def _nbytes(items: Sequence[TaskInput]) -> list[int]:
    """Each item's input bytes; its key's size is looked up only where the key changes."""
    out: list[int] = []
    last: BatchKey | None = None
    size = 0
    for t in items:
        key = t.batch_key
        if key is not last:
            last, size = key, key.nbytes
        out.append(size)
    return out
