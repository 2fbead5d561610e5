"""A callable sink as a careful user writes one: each output saved to ``$WD_SINK_DIR/<key>.npy``
through a temp file and ``os.replace``, so a stop leaves whole files or none (the stop test)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np


def save(key: str, out: Any) -> None:
    """Write ``out`` as ``<key>.npy`` in ``$WD_SINK_DIR``, whole or not at all."""
    directory = Path(os.environ["WD_SINK_DIR"])
    tmp = directory / f".{key}.{os.getpid()}.partial.npy"
    try:
        # On a full disk NumPy's short write is an outage: the engine holds the write and calls again.
        np.save(tmp, np.asarray(out), allow_pickle=False)
        tmp.replace(directory / f"{key}.npy")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
