"""A lane's fill in worker processes: its pinned inputs in shared memory, and the pool that loads them.

The decisions this module protects:
- Only the fill moves. The lane still takes a slot, submits the fill on its fill stream (one thread
  per worker process, waiting on it with the GIL released), and takes the results in batch order;
  the journal, the task table and every commit stay in the engine's process, and workers never see
  them.
- The slot's pinned input is the buffer the worker writes (``Backend.shared_host_buffer``: on CuPy
  page-locked, so h2d reads it directly). One copy, from the source into the slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.backends.process_pool import LoadRows, RowLoader
from warpdeck.engine.backends.shared_memory import SharedBuffer
from warpdeck.engine.run.process_host import ProcessHost
from warpdeck.engine.state.batches import TaskInput

__all__ = ["ProcessFill"]


class ProcessFill(ProcessHost):
    """One lane's fill worker processes and the shared input buffers they write."""

    def __init__(self, backend: Backend, loader: RowLoader, workers: int, deadline_s: float, label: str) -> None:
        super().__init__(backend, LoadRows(loader), workers, deadline_s, label, "fill")

    def load(self, buf: SharedBuffer, items: Sequence[TaskInput], out: Any) -> list[BaseException | None]:
        """Load ``items`` into the rows of ``out`` (a view of ``buf``) in a worker process; each
        item's error or None. Runs on a fill thread."""
        return self.run((str(buf.path), buf.nbytes, 0, tuple(out.shape), out.dtype.str), [t.handle for t in items])
