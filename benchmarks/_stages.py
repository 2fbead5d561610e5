"""Stage functions, sources and sinks shared by the benchmarks.

The engine resolves stages from ``module:function`` strings, so they live in this importable
module; every script in this folder has the folder on ``sys.path`` (it is the script's own
directory), and ``start.py`` puts it on ``PYTHONPATH`` for its subprocess.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from warpdeck.engine.state.batches import BatchKey, TaskInput

# -- overlap.py ------------------------------------------------------------------------------------
COMPUTE_S = 0.010
"""Seconds the compute stage sleeps per batch; overlap.py sets it before a run."""


def compute_sleep(xp: Any, inp: Any, out: Any) -> None:
    """One batch of simulated device work: sleep COMPUTE_S (the GIL is released), then copy."""
    time.sleep(COMPUTE_S)
    xp.copyto(out, inp)


def noop(xp: Any, inp: Any, out: Any) -> None:
    """Does nothing (engine overhead)."""


class ScheduledSource:
    """``n_batches * batch_size`` tasks; loading batch i spends ``load_s[i]`` once and fills its rows.

    Spending is ``spend(seconds)``: ``time.sleep`` by default (waiting, as on I/O), or a
    ``CpuBurn`` (decoding). Task i belongs to batch ``i // batch_size``, so the amount is chosen by
    the batch's index, never by call order: several fill threads may load at once. The engine
    forms full batches in order, which ``batch_sizes`` records so the benchmark can check it (a
    misaligned batch would change which amount it got).
    """

    def __init__(self, load_s: Sequence[float], batch_size: int, shape: tuple[int, ...],
                 block: np.ndarray, spend: Callable[[float], None] = time.sleep) -> None:
        self.load_s = list(load_s)
        self.batch_size = batch_size
        self.total: int | None = len(self.load_s) * batch_size
        self.key = BatchKey("bench", shape, "float32")
        self.block = block
        self.spend = spend
        self.batch_sizes: list[int] = []
        self.misaligned = 0
        self._lock = threading.Lock()

    def items(self) -> Iterator[TaskInput]:
        key = self.key
        for i in range(self.total or 0):
            yield TaskInput(f"t{i:08d}", key, i)

    def load(self, items: Sequence[TaskInput], out: np.ndarray) -> list[BaseException | None]:
        first = items[0].handle
        with self._lock:  # fill threads call this at once
            if first % self.batch_size:
                self.misaligned += 1
            self.batch_sizes.append(len(items))
        self.spend(self.load_s[first // self.batch_size])
        out[: len(items)] = self.block[: len(items)]
        return [None] * len(items)


_TRAILING_INDEX = re.compile(r"(\d+)$")


class BatchSleepSink:
    """Sleeps ``sleep_s`` once per batch (on its first task) and stamps ``time.perf_counter()``
    after each batch's last write: the batch-done times, in the order they happened.

    Safe to call from several sink threads at once: a task's batch and place in it come from the
    index its key ends with (``t00000042`` is task 42), so the sleep goes to each batch's first task
    and a batch is done when all its tasks are written, whichever thread wrote them and in whatever
    order batches interleave. A key without a trailing number falls back to call order (one thread).
    """

    def __init__(self, sleep_s: float, batch_size: int) -> None:
        self.sleep_s = sleep_s
        self.batch_size = batch_size
        self.calls = 0
        self.done_at: list[float] = []
        self.checksum = 0.0
        self._lock = threading.Lock()
        self._written: dict[int, int] = {}  # batch -> tasks written so far (batches not done yet)

    def write(self, key: str, out: np.ndarray) -> None:
        m = _TRAILING_INDEX.search(key)
        with self._lock:
            index = int(m.group(1)) if m else self.calls
            self.calls += 1
        batch, j = divmod(index, self.batch_size)
        if j == 0:
            time.sleep(self.sleep_s)
            with self._lock:
                self.checksum += float(out[0])
        with self._lock:
            n = self._written.pop(batch, 0) + 1
            if n == self.batch_size:
                self.done_at.append(time.perf_counter())  # stamped under the lock: stays sorted
            else:
                self._written[batch] = n


class CpuBurn:
    """Spends CPU time the way a decoder does: NumPy ufunc loops over a small buffer, which release
    the GIL while they run (as zlib, image codecs and NumPy itself do), so threads burning at once
    scale with the cores. ``burn(seconds)`` spends about that much CPU time on the calling thread;
    the cost of one pass is calibrated once, with ``time.thread_time`` (CPU time, so a busy
    machine slows the wall clock but not the calibration)."""

    def __init__(self, elements: int = 16384, calibrate_s: float = 0.2) -> None:
        self._src = np.linspace(0.0, 1.0, elements)
        self.pass_s = self._calibrate(calibrate_s)

    def _passes(self, n: int) -> None:
        tmp = np.empty_like(self._src)  # per call: threads never share a buffer
        for _ in range(n):
            np.sin(self._src, out=tmp)
            np.exp(tmp, out=tmp)

    def _calibrate(self, total_s: float) -> float:
        self._passes(20)  # warm the buffer and the ufunc loops
        per_pass: list[float] = []
        while sum(per_pass) * 20 < total_s or len(per_pass) < 5:
            c = time.thread_time()
            self._passes(20)
            per_pass.append((time.thread_time() - c) / 20)
        return float(np.median(per_pass))

    def __call__(self, seconds: float) -> None:
        self._passes(max(1, round(seconds / self.pass_s)))


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


def py_spin(iters: int) -> int:
    """Pure-Python work that holds the GIL throughout (a tokenizer's or a parser's inner loop)."""
    h = 0
    for k in range(iters):
        h = (h * 31 + k) % 1_000_003
    return h


class PyBurn:
    """Spends CPU time holding the GIL: ``py_spin`` loops, calibrated once with ``time.thread_time``.
    Threads burning at once take turns; processes (each its own GIL) scale with the cores."""

    def __init__(self, calibrate_s: float = 0.2) -> None:
        py_spin(10_000)
        spent, done = 0.0, 0
        while spent < calibrate_s:
            c = time.thread_time()
            py_spin(20_000)
            spent += time.thread_time() - c
            done += 20_000
        self.iter_s = spent / done

    def iters(self, seconds: float) -> int:
        return max(1, round(seconds / self.iter_s))

    def __call__(self, seconds: float) -> None:
        py_spin(self.iters(seconds))


def gil_items(count: int, iters: int) -> Iterator[tuple[str, tuple[int, int]]]:
    """An ``items`` source's list for the GIL-bound profile: ``count`` tasks, each ``iters`` spins."""
    for i in range(count):
        yield f"t{i:08d}", (i, iters)


def gil_load(handle: tuple[int, int], row: np.ndarray) -> None:
    """The GIL-bound profile's ``load(handle, row)``: pure-Python work, then the row."""
    py_spin(handle[1])
    row[...] = 0.5


def gil_write(key: str, out: np.ndarray) -> None:
    """A callable sink's ``target`` that holds the GIL: ``WD_BENCH_WRITE_ITERS`` spins per output
    (pure-Python encoding), read from the environment, which sink worker processes inherit."""
    py_spin(int(os.environ.get("WD_BENCH_WRITE_ITERS", "1")))
