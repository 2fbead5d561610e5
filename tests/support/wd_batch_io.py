"""Batch-at-a-time loaders and writers the batch I/O tests name in specs (``wd_batch_io:load_batch``).

A fill worker process imports this module by name, as it would a user's: the loaders must live in
a module. What a loader or writer did is kept where the test can read it: the batches a sink was
handed in ``WRITES`` (the sink runs in the engine's process), and the batches a loader refused in
``$WD_BATCH_MARKS/raised`` (one line of handles per refusal; loaders may run in another process).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from warpdeck.engine.edges.input_errors import InputError

WRITES: list[tuple[tuple[str, ...], np.ndarray]] = []
"""Every batch a recording writer or loader was handed, in the engine's process: its keys and values."""
LOADS: list[tuple[int, ...]] = []
_LOCK = threading.Lock()
BAD = 7
"""The item whose batch ``load_batch_raising`` refuses, and the key whose batch ``write_batch_failing`` refuses."""
BAD_KEY = "t00007"


def reset() -> None:
    with _LOCK:
        WRITES.clear()
        LOADS.clear()


def load_batch(handles: Sequence[int], out: np.ndarray) -> None:
    """Every row = its item's index, but for the first element: the loading process's pid, and the
    second: how many items the call was handed (a batch, not a row at a time)."""
    out[...] = np.asarray(handles, dtype=out.dtype).reshape((len(handles),) + (1,) * (out.ndim - 1))
    flat = out.reshape(len(handles), -1)
    flat[:, 0] = os.getpid()
    flat[:, 1] = len(handles)


def load_batch_recording(handles: Sequence[int], out: np.ndarray) -> None:
    """``load_batch``, keeping each batch's handles in ``LOADS`` (fill threads only)."""
    load_batch(handles, out)
    with _LOCK:
        LOADS.append(tuple(handles))


def _refused(handles: Sequence[int]) -> None:
    marks = Path(os.environ["WD_BATCH_MARKS"]) / "raised"
    with marks.open("a", encoding="utf-8") as f:
        f.write(" ".join(str(h) for h in handles) + "\n")


def load_batch_raising(handles: Sequence[int], out: np.ndarray) -> None:
    """``load_batch``, but a batch holding item 7 raises (its handles noted in the marks)."""
    if BAD in handles:
        _refused(handles)
        raise ValueError(f"batch with bad record {BAD}")
    load_batch(handles, out)


def load_one(i: int, row: np.ndarray) -> None:
    """One item as ``load_batch`` writes it in a batch of one; item 7 raises its own error."""
    if i == BAD:
        raise ValueError(f"record {i} is bad on its own")
    load_batch([i], row[np.newaxis])


def load_batch_short(handles: Sequence[int], out: np.ndarray) -> list[None]:
    """Loads every row, then answers for one item fewer than it was handed."""
    load_batch(handles, out)
    return [None] * (len(handles) - 1)


def load_batch_some_fail(handles: Sequence[int], out: np.ndarray) -> list[BaseException | None]:
    """Loads every row; item 13 is reported unusable (an InputError: never retried)."""
    load_batch(handles, out)
    return [InputError(f"record-{h}", "checksum mismatch") if h == 13 else None for h in handles]


def write_batch(keys: Sequence[str], outputs: np.ndarray) -> None:
    """Keeps the batch's keys and a copy of its outputs (only valid during the call)."""
    with _LOCK:
        WRITES.append((tuple(keys), np.array(outputs)))


def write_batch_failing(keys: Sequence[str], outputs: np.ndarray) -> None:
    """``write_batch``, but a batch holding ``t00007`` raises before keeping anything."""
    if BAD_KEY in keys:
        raise RuntimeError(f"the store refused a batch holding {BAD_KEY}")
    write_batch(keys, outputs)


def write_one(key: str, output: np.ndarray) -> None:
    """A per-output target: keeps the output as a batch of one."""
    write_batch([key], output[np.newaxis])
