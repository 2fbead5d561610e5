"""A lane's fill in worker processes: its pinned inputs in shared memory, and the pool that loads them.

The decisions this module protects:
- Only the fill moves. The lane still takes a slot, submits the fill on its fill stream (one thread
  per worker process, waiting on it with the GIL released), and takes the results in batch order;
  the journal, the task table and every commit stay in the engine's process, and workers never see
  them.
- The slot's pinned input is the buffer the worker writes (``Backend.shared_host_buffer``: on CuPy
  page-locked, so h2d reads it directly). One copy, from the source into the slot.
- A worker's CPU counts as the fill's (``charge_cpu``), so the tuner and the report see what loading
  costs even though the fill thread only waits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from warpdeck.engine.backends.base import Backend, charge_cpu
from warpdeck.engine.backends.process_pool import ProcessPool, RowLoader
from warpdeck.engine.backends.shared_memory import SharedArena, SharedBuffer
from warpdeck.engine.state.batches import TaskInput
from warpdeck.engine.state.snapshot import HostProcess

__all__ = ["ProcessFill"]


class ProcessFill:
    """One lane's worker processes and the shared buffers they write."""

    def __init__(self, backend: Backend, loader: RowLoader, workers: int, deadline_s: float, label: str) -> None:
        self.backend = backend
        self.label = label
        self.pool = ProcessPool(f"warpdeck-{label}-fill", loader, workers, deadline_s)
        self._arena: SharedArena | None = None  # made with the first buffer: a lane never run makes none

    def buffer(self, nbytes: int) -> SharedBuffer:
        """A new shared input buffer of ``nbytes`` (page-locked where the backend is a device)."""
        if self._arena is None:
            self._arena = SharedArena(label=self.label)
        return self.backend.shared_host_buffer(self._arena, nbytes)

    def release(self, buf: SharedBuffer) -> None:
        """Let go of a buffer a slot outgrew (it is free: its h2d is done)."""
        if self._arena is not None:
            self._arena.release(buf)

    def load(self, buf: SharedBuffer, items: Sequence[TaskInput], out: Any) -> list[BaseException | None]:
        """Load ``items`` into the rows of ``out`` (a view of ``buf``) in a worker process; each
        item's error or None. Runs on a fill thread."""
        errors, cpu = self.pool.load(str(buf.path), buf.nbytes, out.shape, out.dtype, [t.handle for t in items])
        charge_cpu(cpu)
        return errors

    def resize(self, workers: int) -> None:
        self.pool.resize(workers)

    def start(self) -> None:
        """Start the workers now (a lane about to run): the first batch waits for one start only."""
        self.pool.start()

    def warming(self, since: float) -> bool:
        """A worker was starting at some time after ``since`` (or still is): fills measured since
        then waited for it, so the tuner does not judge the fill's size from them."""
        return self.pool.warming or self.pool.ready_at > since

    def views(self) -> tuple[HostProcess, ...]:
        """Each worker as the snapshot shows it."""
        return tuple(HostProcess(w.pid, w.jobs, w.busy_share) for w in self.pool.views())

    def stop(self) -> None:
        """Stop the workers (a busy one is killed after a few seconds): a stopping lane's fills end."""
        self.pool.close()

    def close(self) -> None:
        """Stop the workers, then unmap and remove the shared buffers (once no stream uses them)."""
        self.pool.close()
        if self._arena is not None:
            with contextlib.suppress(OSError):
                self._arena.close()
