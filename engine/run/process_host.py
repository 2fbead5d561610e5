"""A lane's worker processes for one host phase, and the shared buffers they work on.

The decisions this module protects:
- A pool of warm processes and an arena of shared slot buffers belong together: the lane's fill or
  sink asks for a slot buffer here, and the workers map that same memory, so a batch's rows are never
  copied between the engine and a worker (engine/backends/process_pool.py says how they travel).
- The lane's threads stay in charge: one worker process per host thread, resized with them; each
  thread hands its worker one batch and waits with the GIL released, so the stream's order stays the
  lane's.
- A worker's CPU counts as the phase's (``charge_cpu``), so the tuner and the report see what the
  work costs even though the host thread only waits.
"""

from __future__ import annotations

import contextlib
from typing import Any

from warpdeck.engine.backends.base import Backend, charge_cpu
from warpdeck.engine.backends.process_pool import ProcessPool, Rows, RowWork
from warpdeck.engine.backends.shared_memory import SharedArena, SharedBuffer
from warpdeck.engine.state.snapshot import HostProcess

__all__ = ["ProcessHost"]


class ProcessHost:
    """One lane's worker processes for one host phase (``role``: fill or sink) and their shared buffers."""

    def __init__(self, backend: Backend, work: RowWork, workers: int, deadline_s: float, label: str,
                 role: str) -> None:
        self.backend = backend
        self.label = label
        self.pool = ProcessPool(f"warpdeck-{label}-{role}", work, workers, deadline_s, role)
        self._arena: SharedArena | None = None  # made with the first buffer: a lane never run makes none

    def buffer(self, nbytes: int) -> SharedBuffer:
        """A new shared buffer of ``nbytes`` (page-locked where the backend is a device)."""
        if self._arena is None:
            self._arena = SharedArena(label=self.label)
        return self.backend.shared_host_buffer(self._arena, nbytes)

    def release(self, buf: SharedBuffer) -> None:
        """Let go of a buffer a slot outgrew (it is free: no phase reads it)."""
        if self._arena is not None:
            self._arena.release(buf)

    def place(self, rows: Any) -> Rows:
        """Where a worker finds ``rows``: in a shared buffer of this lane, as its place, or (a copy,
        a few rows picked out) the rows themselves, sent along."""
        placed = self._arena.locate(rows) if self._arena is not None else None
        if placed is None:
            return rows  # type: ignore[no-any-return]
        buf, offset = placed
        return (str(buf.path), buf.nbytes, offset, tuple(rows.shape), rows.dtype.str)

    def run(self, where: Rows, payload: Any) -> list[BaseException | None]:
        """One batch in a worker: ``payload`` and the rows ``where`` they are; each row's error or
        None. Runs on a host thread."""
        errors, cpu = self.pool.run(where, payload)
        charge_cpu(cpu)
        return errors

    def resize(self, workers: int) -> None:
        self.pool.resize(workers)

    def start(self) -> None:
        """Start the workers now (a lane about to run): the first batch waits for one start only."""
        self.pool.start()

    def warming(self, since: float) -> bool:
        """A worker was starting at some time after ``since`` (or still is): batches measured since
        then waited for it, so the tuner does not judge the phase's size from them."""
        return self.pool.warming or self.pool.ready_at > since

    def views(self) -> tuple[HostProcess, ...]:
        """Each worker as the snapshot shows it."""
        return tuple(HostProcess(w.pid, w.jobs, w.busy_share) for w in self.pool.views())

    def stop(self) -> None:
        """Stop the workers (a busy one is killed after a few seconds): a stopping lane's jobs end."""
        self.pool.close()

    def close(self) -> None:
        """Stop the workers, then unmap and remove the shared buffers (once no stream uses them)."""
        self.pool.close()
        if self._arena is not None:
            with contextlib.suppress(OSError):
                self._arena.close()
