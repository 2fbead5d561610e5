"""Where a lane's fills run, on its fill threads or in worker processes, and the inputs they write.

The decisions this module protects:
- The lane decides when a batch fills and takes the results in batch order; this decides only where
  the loading runs and into which buffer. The lane asks for a slot's pinned input and a loader for
  it and never asks which kind it got.
- A fill moves to processes (``fill_pool = "processes"``, or the tuner's trial under ``"auto"``) and
  back to threads for good at a batch boundary: batches already filling finish where they are; a
  slot takes a shared buffer as it is next filled and keeps it (threads write shared memory as
  well), so switching back copies nothing.
- One worker process per fill thread: the thread hands the worker a batch and waits with the GIL
  released, so the fill stream's order and its thread count stay the lane's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.run.process_fill import ProcessFill
from warpdeck.engine.run.slots import Buffer
from warpdeck.engine.state.batches import TaskInput
from warpdeck.engine.state.snapshot import HostProcess

__all__ = ["LaneFill", "Load"]

Load = Callable[[Sequence[TaskInput], Any], list[BaseException | None]]
"""Loads a batch's items into the rows of a buffer; each item's error or None."""


class LaneFill:
    """A lane's fill placement: its source's own ``load`` on the fill threads, or ``processes``.

    ``make_processes`` makes the worker processes when the tuner first moves the fill there (None:
    it never may)."""

    def __init__(self, backend: Backend, source: Source, processes: ProcessFill | None = None,
                 make_processes: Callable[[], ProcessFill | None] | None = None) -> None:
        self.backend = backend
        self.source = source
        self.processes = processes
        """The worker processes and the shared buffers they write, once there are any."""
        self._make_processes = make_processes
        self._in_processes = processes is not None

    @property
    def in_processes(self) -> bool:
        """Fills run in worker processes now."""
        return self._in_processes

    def resize(self, workers: int) -> None:
        """The fill runs on ``workers`` threads from now: as many worker processes, where it uses them."""
        if self._in_processes and self.processes is not None:
            self.processes.resize(workers)

    def switch(self, on: bool, workers: int) -> None:
        """Move the fill to ``workers`` worker processes, or back to the threads (``on`` False)."""
        if on == self._in_processes:
            return
        if not on:
            self._in_processes = False
            if self.processes is not None:
                self.processes.stop()
            return
        if self.processes is None and self._make_processes is not None:
            self.processes = self._make_processes()
        if self.processes is None:
            return
        self.processes.resize(workers)
        self.processes.start()
        self._in_processes = True

    def start(self) -> None:
        """The lane is about to run: worker processes start while its first batch is formed."""
        if self._in_processes and self.processes is not None:
            self.processes.start()

    def warming(self, since: float) -> bool:
        """Whether a fill worker process was starting at some time after ``since``."""
        return self._in_processes and self.processes is not None and self.processes.warming(since)

    def views(self) -> tuple[HostProcess, ...]:
        """Each fill worker process as the snapshot shows it (none while fills run on threads)."""
        return self.processes.views() if self.processes is not None and self._in_processes else ()

    def input_buffer(self, b: Buffer, nbytes: int) -> bool:
        """Make ``b`` (a slot's free pinned input) hold ``nbytes`` where the next fill writes: shared
        memory for worker processes. True when it was allocated again (it had a smaller one)."""
        processes = self.processes if self._in_processes else None
        if b.cap >= nbytes and (processes is None or b.shared is not None):
            return False
        again = b.cap > 0
        if processes is None:
            b.buf, b.cap = self.backend.host_buffer(nbytes), nbytes
            b.shared = None  # outgrown: the old shared buffer stays in its arena until the lane closes
            return again
        if b.shared is not None:
            processes.release(b.shared)  # free: the batch that last used it is past its h2d
        b.shared = processes.buffer(nbytes)
        b.buf, b.cap = b.shared.array, nbytes
        return again

    def loader(self, b: Buffer) -> Load:
        """What loads a batch into ``b`` (made ready by ``input_buffer``)."""
        processes, shared = (self.processes, b.shared) if self._in_processes else (None, None)
        if processes is None or shared is None:
            return self.source.load

        def load(items: Sequence[TaskInput], out: Any) -> list[BaseException | None]:
            return processes.load(shared, items, out)
        return load

    async def stop(self) -> None:
        """The lane is stopping: fills waiting on a worker end now, not at its deadline."""
        if self.processes is not None:
            await asyncio.to_thread(self.processes.stop)

    def close(self) -> None:
        """No stream uses a shared buffer any more: the workers stop and the shared memory goes."""
        if self.processes is not None:
            self.processes.close()
