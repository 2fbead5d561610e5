"""What travels through a run: a task's input as its source enumerates it, the batching key that
says which tasks may share a batch, and the batch a lane carries.

The decision this module protects: these are contract types between the sources, the ready queue,
the lanes, the leases and the batch log, so they live at the bottom of the engine: a source, the
batcher and the readers of a batch all import them from here, never from each other.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Batch", "BatchKey", "TaskInput", "item_nbytes"]


def item_nbytes(shape: tuple[int, ...], dtype: np.dtype[Any] | str) -> int:
    """Bytes of one task's array of ``shape`` and ``dtype``."""
    return int(math.prod(shape)) * np.dtype(dtype).itemsize


@functools.lru_cache(maxsize=1024)
def _key_nbytes(shape: tuple[int, ...], dtype: str) -> int:
    # Asked once per admitted task: a million tasks share a handful of keys.
    return item_nbytes(shape, dtype)


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Tasks with equal keys can share a batch: same kind, shape and dtype (uniform work)."""

    kind: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Bytes of one task's input."""
        return _key_nbytes(self.shape, self.dtype)

    def __str__(self) -> str:
        return f"{self.kind}{list(self.shape)}:{self.dtype}"


@dataclass(frozen=True, slots=True)
class TaskInput:
    """One enumerated task: its key, its batching key, and what the source needs to load it."""

    key: str
    batch_key: BatchKey
    handle: Any
    error: str = ""
    """Set when enumeration already knows the input is unusable (unreadable header, say)."""



@dataclass(slots=True)
class Batch:
    """Tasks that travel a lane together. ``idx`` are task-table rows, ``items`` their inputs."""

    id: int
    key: BatchKey
    idx: npt.NDArray[np.int64]
    items: list[TaskInput]
    formed_at: float
    divergence: int = 1
    """Distinct batching keys waiting when this batch was formed."""
    lane: int = -1
    slot: int = -1
    retry: bool = False
    meta: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)
