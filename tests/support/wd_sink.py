"""Writers the sink-process tests name in specs (``wd_sink:write_record``).

A worker process imports this module by name, as it would a user's. Each writer lands one output as
``<WD_SINK_DIR>/<key>.npy`` (through a temp file and a rename, so a retried write replaces it) and
notes the writing process in ``<key>.pid``. ``WD_SINK_DIR`` comes from the environment, which a
worker inherits from the engine that starts it.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _dir() -> Path:
    return Path(os.environ["WD_SINK_DIR"])


def _land(key: str, arr: np.ndarray) -> None:
    d = _dir()
    tmp = d / f".{key}.{os.getpid()}.tmp"
    with tmp.open("wb") as f:
        np.save(f, arr)
    tmp.replace(d / f"{key}.npy")
    (d / f"{key}.pid").write_text(str(os.getpid()))


def write_record(key: str, arr: np.ndarray) -> None:
    _land(key, arr)


def write_batch_record(keys: Sequence[str], outs: np.ndarray) -> None:
    for key, arr in zip(keys, outs, strict=True):
        _land(key, arr)


def write_failing(key: str, arr: np.ndarray) -> None:
    """Key ``t00007`` cannot be written."""
    if key == "t00007":
        raise ValueError(f"cannot encode {key}")
    _land(key, arr)


def write_slow(key: str, arr: np.ndarray) -> None:
    """5 ms per output: a batch in flight when a test kills its worker."""
    time.sleep(0.005)
    _land(key, arr)


def write_full_thrice(key: str, arr: np.ndarray) -> None:
    """The first three writes (in any process) meet a full disk; the rest land."""
    for n in range(3):
        try:
            (_dir() / f".full-{n}").touch(exist_ok=False)
        except FileExistsError:
            continue
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(_dir() / f"{key}.npy"))
    _land(key, arr)


def write_python(key: str, arr: np.ndarray) -> None:
    """Pure-Python encoding (a text format built value by value): holds the GIL throughout."""
    text = ",".join(f"{v:.6g}" for v in arr.reshape(-1).tolist())
    n = 0
    for _ in range(int(os.environ.get("WD_SINK_ROUNDS", "20"))):
        n = (n * 31 + sum(map(ord, text))) % 1_000_003
    (_dir() / f"{key}.txt").write_text(f"{n}\n{text}")
