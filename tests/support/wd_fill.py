"""Item lists and per-item loaders the fill-process tests name in specs (``wd_fill:load_stamp``).

A worker process imports this module by name, as it would a user's: the loaders must live in a
module, never in a test file's ``__main__``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from warpdeck.engine.edges.input_errors import InputError

COUNT = int(os.environ.get("WD_FILL_COUNT", "320"))
"""Items every list below yields, keyed ``t00000`` on; their handle is their index."""


def items() -> Iterator[tuple[str, int]]:
    for i in range(COUNT):
        yield f"t{i:05d}", i


def items_with_a_lock() -> Iterator[tuple[str, Any]]:
    """Item 3's handle is a lock: it cannot be sent to a worker process."""
    for i in range(COUNT):
        yield f"t{i:05d}", (threading.Lock() if i == 3 else i)


def stamp(i: int, row: np.ndarray) -> None:
    """Row = the item's index everywhere but the first element: the loading process's pid."""
    row[...] = i
    row.reshape(-1)[0] = os.getpid()


def load_stamp(i: int, row: np.ndarray) -> None:
    stamp(i, row)


def load_omp(i: int, row: np.ndarray) -> None:
    """The stamp, then the worker's ``OMP_NUM_THREADS`` (0: unset) in every element but the first."""
    stamp(i, row)
    row.reshape(-1)[1:] = int(os.environ.get("OMP_NUM_THREADS", "0"))


def load_slow(i: int, row: np.ndarray) -> None:
    """5 ms of waiting per item: a batch in flight when a test kills its worker."""
    time.sleep(0.005)
    stamp(i, row)


def load_failing(i: int, row: np.ndarray) -> None:
    """Item 7 raises a ValueError (retried, fails each attempt); item 13 is an unusable input (never retried)."""
    if i == 7:
        raise ValueError(f"bad record {i}")
    if i == 13:
        raise InputError(f"record-{i}", "checksum mismatch")
    stamp(i, row)


def load_hang_once(i: int, row: np.ndarray) -> None:
    """Item 5 hangs on its first attempt (a marker file in ``$WD_FILL_MARKS`` says it did)."""
    if i == 5:
        mark = Path(os.environ["WD_FILL_MARKS"]) / "hung"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            time.sleep(120)
    stamp(i, row)


def load_python(i: int, row: np.ndarray) -> None:
    """Pure-Python work holding the GIL (a tokenizer's loop), then the stamp."""
    h = i
    for k in range(20_000):
        h = (h * 31 + k) % 1_000_003
    stamp(i, row)
    row.reshape(-1)[1] = h


def _explode() -> None:
    raise RuntimeError("the loader's module cannot start here")


class LoaderThatCannotStart:
    """Pickles, but fails to unpickle: a worker that cannot load the loader."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_explode, ())

    def __call__(self, handle: Any, row: np.ndarray) -> None:  # pragma: no cover - never reached
        stamp(handle, row)


def items_many() -> Iterator[tuple[str, int]]:
    """2,000 items: enough batches for the tuner to grow a pool and judge it."""
    for i in range(2000):
        yield f"t{i:05d}", i


def items_seeded(count: int) -> Iterator[tuple[str, int]]:
    """``count`` items keyed as the synthetic source keys its tasks (``syn-00000000`` on)."""
    for i in range(count):
        yield f"syn-{i:08d}", i


def load_seeded(i: int, row: np.ndarray) -> None:
    """The synthetic source's input of task ``i`` (seed 11): the same data, loaded by a user's function."""
    from warpdeck.engine.edges.sources import synthetic_values  # only in the loading process

    row[...] = synthetic_values(11, [i], row.shape, row.dtype)[0]
