"""The GPU benchmark's workload: a tunable device kernel, the source and sink every runner shares.

The decision this module protects: every runner (the naive CuPy loop, the DataLoader loop and
warpdeck) runs the same kernel on the same bytes and checks the same stamps, so their rates differ
only by how they move data and order work. A task is a float32 ``(256, 1024)`` block (1 MiB); its
first element carries the task's index (the "stamp"). The kernel is ``ITERS`` dependent
multiply-adds per element with ``a = 1, b = 0`` passed at run time (the compiler cannot fold them),
so it costs a chosen, calibrated amount of device time and its output equals its input exactly:
each sink checks every batch's stamps, so a batch computed from the wrong slot, or not copied back,
is caught by every runner. The host work per batch is the same small cost everywhere (write the
stamps, read them back); the bytes themselves are not produced on the host, so the figures judge the
device path, not the host's memcpy.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from warpdeck.engine.state.batches import BatchKey, TaskInput

TASK_SHAPE = (256, 1024)
"""One task: a float32 block of this shape (1 MiB)."""
ITERS = 0
"""Multiply-adds per element of the current workload; gpu.py sets it before each run."""

_KERNELS: dict[int, Any] = {}


def fma_kernel(cp: Any) -> Any:
    """``y = x`` after ``n`` dependent multiply-adds by ``a`` and ``b`` (1 and 0: exactly ``x``)."""
    k = _KERNELS.get(id(cp))
    if k is None:
        k = _KERNELS[id(cp)] = cp.ElementwiseKernel(
            "T x, T a, T b, int32 n", "T y",
            "T v = x; for (int i = 0; i < n; ++i) { v = v * a + b; } y = v;",
            "warpdeck_bench_fma")
    return k


def fma(xp: Any, inp: Any, out: Any) -> None:
    """The benchmark's stage, ``fn(xp, inp, out)``: ``ITERS`` multiply-adds per element on CuPy;
    on NumPy (no device) only the copy that the kernel's result equals."""
    if xp is np:
        np.copyto(out, inp)
        return
    fma_kernel(xp)(inp, np.float32(1.0), np.float32(0.0), np.int32(ITERS), out)


class StampSource:
    """``count`` tasks of ``TASK_SHAPE``; loading writes each task's index into its first element
    and leaves the rest of the slot as it is (the bytes a real source would produce are not the
    point here: the copies and the kernel are)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.total: int | None = count
        self.key = BatchKey("gpu-bench", TASK_SHAPE, "float32")

    def items(self) -> Iterator[TaskInput]:
        key = self.key
        for i in range(self.count):
            yield TaskInput(f"t{i:08d}", key, i)

    def load(self, items: Sequence[TaskInput], out: np.ndarray) -> list[BaseException | None]:
        out[: len(items), 0, 0] = [t.handle for t in items]
        return [None] * len(items)

    def produces(self, key: str) -> bool | None:
        return None


_INDEX = re.compile(r"(\d+)$")


class StampSink:
    """Checks each batch's stamps (row j of a batch must carry its task's index) and stamps
    ``time.perf_counter()`` when a batch is written: the batch-done times every runner is timed by.
    ``write_batch`` makes the engine hand it whole batches, as the other runners do."""

    def __init__(self) -> None:
        self.done_at: list[float] = []
        self.tasks = 0
        self.wrong = 0
        self._lock = threading.Lock()

    def check(self, first_values: np.ndarray, indices: Sequence[int] | np.ndarray) -> None:
        wrong = int(np.count_nonzero(np.asarray(first_values, np.float64) != np.asarray(indices, np.float64)))
        with self._lock:
            self.wrong += wrong
            self.tasks += len(indices)
            self.done_at.append(time.perf_counter())

    def write_batch(self, keys: Sequence[str], outputs: np.ndarray) -> None:
        self.check(outputs[:, 0, 0], [int(_INDEX.search(k).group(1)) for k in keys])  # type: ignore[union-attr]

    def write(self, key: str, out: np.ndarray) -> None:  # pragma: no cover - the engine uses write_batch
        self.write_batch([key], out[None])
