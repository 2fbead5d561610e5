"""Stage functions, sources and sinks shared by the benchmarks.

The engine resolves stages from ``module:function`` strings, so they live in this importable
module; every script in this folder has the folder on ``sys.path`` (it is the script's own
directory), and ``start.py`` puts it on ``PYTHONPATH`` for its subprocess.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from warpdeck.engine.edges.sources import BatchKey, TaskInput

# -- overlap.py ------------------------------------------------------------------------------------
#: Seconds the compute stage sleeps per batch; overlap.py sets it before a run.
COMPUTE_S = 0.010


def compute_sleep(xp: Any, inp: Any, out: Any) -> None:
    """One batch of simulated device work: sleep COMPUTE_S (the GIL is released), then copy."""
    time.sleep(COMPUTE_S)
    xp.copyto(out, inp)


def noop(xp: Any, inp: Any, out: Any) -> None:
    """Does nothing (engine overhead)."""


class ScheduledSource:
    """``n_batches * batch_size`` tasks; loading batch i sleeps ``load_s[i]`` once and fills its rows.

    Task i belongs to batch ``i // batch_size``; the engine forms full batches in order, which
    ``batch_sizes`` records so the benchmark can check it (a misaligned batch would change which
    sleep it got).
    """

    def __init__(self, load_s: Sequence[float], batch_size: int, shape: tuple[int, ...],
                 block: np.ndarray) -> None:
        self.load_s = list(load_s)
        self.batch_size = batch_size
        self.total: int | None = len(self.load_s) * batch_size
        self.key = BatchKey("bench", shape, "float32")
        self.block = block
        self.batch_sizes: list[int] = []
        self.misaligned = 0

    def items(self) -> Iterator[TaskInput]:
        key = self.key
        for i in range(self.total or 0):
            yield TaskInput(f"t{i:08d}", key, i)

    def load(self, items: Sequence[TaskInput], out: np.ndarray) -> list[BaseException | None]:
        first = items[0].handle
        if first % self.batch_size:
            self.misaligned += 1
        self.batch_sizes.append(len(items))
        time.sleep(self.load_s[first // self.batch_size])
        out[: len(items)] = self.block[: len(items)]
        return [None] * len(items)


class BatchSleepSink:
    """Sleeps ``sleep_s`` once per ``batch_size`` writes (on a batch's first task) and stamps
    ``time.perf_counter()`` after each batch's last write: the batch-done times."""

    def __init__(self, sleep_s: float, batch_size: int) -> None:
        self.sleep_s = sleep_s
        self.batch_size = batch_size
        self.calls = 0
        self.done_at: list[float] = []
        self.checksum = 0.0

    def write(self, key: str, out: np.ndarray) -> None:
        j = self.calls % self.batch_size
        self.calls += 1
        if j == 0:
            time.sleep(self.sleep_s)
            self.checksum += float(out[0])
        if j == self.batch_size - 1:
            self.done_at.append(time.perf_counter())


class InstantSource:
    """``count`` tasks whose load returns at once without touching ``out`` (engine overhead)."""

    def __init__(self, count: int, shape: tuple[int, ...] = (1,)) -> None:
        self.total: int | None = count
        self.count = count
        self.key = BatchKey("noop", shape, "float32")
        self._none: list[BaseException | None] = []

    def items(self) -> Iterator[TaskInput]:
        key = self.key
        for i in range(self.count):
            yield TaskInput(f"t{i:08d}", key, i)

    def load(self, items: Sequence[TaskInput], out: np.ndarray) -> list[BaseException | None]:
        n = len(items)
        if len(self._none) != n:
            self._none = [None] * n
        return list(self._none)


# -- start.py --------------------------------------------------------------------------------------
_stamp_lock = threading.Lock()
_stamp_calls = 0


def first_write_stamp(key: str, out: Any) -> None:
    """Callable sink: writes ``time.time()`` of its first call, then of the end of its
    ``WARPDECK_BENCH_BATCH``-th call (the first batch fully sunk), to ``$WARPDECK_BENCH_STAMP``."""
    global _stamp_calls  # noqa: PLW0603 - one counter per process
    with _stamp_lock:
        _stamp_calls += 1
        n = _stamp_calls
    path = os.environ.get("WARPDECK_BENCH_STAMP")
    if not path:
        return
    batch = int(os.environ.get("WARPDECK_BENCH_BATCH", "1"))
    if n == 1:
        with open(path, "w", encoding="utf-8") as f:  # noqa: PTH123 - tiny, on the sink thread
            f.write(f"{time.time():.6f}\n")
    if n == batch:
        with open(path, "a", encoding="utf-8") as f:  # noqa: PTH123
            f.write(f"{time.time():.6f}\n")
