"""A lane's sink in worker processes: its pinned outputs in shared memory, and the pool that writes them.

The decisions this module protects:
- Only the writing moves. The lane still submits each batch's sink on its sink stream (one thread per
  worker process, waiting with the GIL released), takes the answers in batch order and commits them;
  the journal, the task table and every commit stay in the engine's process.
- Each worker opens the spec's own sink once, as it starts (``WriteRows``): an npy directory, or the
  user's ``target`` and ``write_batch`` imported once per worker; a sink that cannot open there says
  why at the first batch, as a loader does. The engine keeps its own instance of the sink for what
  only it does: checking outputs on a resume, cleaning temps, settling a finished run.
- The slot's pinned output is the buffer the worker reads (``Backend.shared_host_buffer``: on CuPy
  page-locked, so d2h writes it directly): no copy between the d2h and the write.
- To the lane this is a sink with ``write_rows`` (engine/edges/sinks.py): each output's error comes
  back in its place, so one bad output fails only its task, as on threads; the sink wrappers (held
  writes in an outage, cancelled tasks' outputs dropped) pass it through.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.edges.config import CallableSink, NpyDirSink, NullSink
from warpdeck.engine.edges.sinks import Sink, open_sink, sink_describes
from warpdeck.engine.run.lane_io import write_outputs
from warpdeck.engine.run.process_host import ProcessHost

__all__ = ["ProcessSink", "WriteRows"]

ProcessSinkSpec = NpyDirSink | CallableSink | NullSink
"""The sinks that can write from a worker process (``config.PROCESS_SINKS``)."""


class WriteRows:
    """A sink's work in a worker: the spec's sink, opened once as the worker starts, writes each
    output of a batch (by ``write_batch`` where it has one, else key by key); each one's error or None."""

    def __init__(self, spec: ProcessSinkSpec, run_dir: Path) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self._sink: Sink | None = None

    def __getstate__(self) -> tuple[ProcessSinkSpec, Path]:
        return self.spec, self.run_dir

    def __setstate__(self, state: tuple[ProcessSinkSpec, Path]) -> None:
        self.spec, self.run_dir = state
        self._sink = open_sink(self.spec, self.run_dir)  # in the worker, as it starts

    def __call__(self, keys: Sequence[str], out: npt.NDArray[Any]) -> list[BaseException | None]:
        if self._sink is None:
            self._sink = open_sink(self.spec, self.run_dir)
        return write_outputs(self._sink, keys, out, "allow")


class ProcessSink(ProcessHost):
    """One lane's sink worker processes and the shared output buffers they read; a sink with
    ``write_rows`` to the lane. ``local`` is the engine's own instance of the same sink (it
    describes where an output goes)."""

    def __init__(self, backend: Backend, spec: ProcessSinkSpec, run_dir: Path, local: Sink, workers: int,
                 deadline_s: float, label: str) -> None:
        super().__init__(backend, WriteRows(spec, run_dir), workers, deadline_s, label, "sink")
        self._local = local

    def write_rows(self, keys: Sequence[str], outs: npt.NDArray[Any]) -> list[BaseException | None]:
        """Write ``outs[j]`` under ``keys[j]`` in a worker process; each output's error or None.
        Runs on a sink thread."""
        return self.run(self.place(outs), list(keys))

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        """One output (the sink protocol's own call); raises its error."""
        err = self.write_rows([key], out[None])[0]
        if err is not None:
            raise err

    def describe(self, key: str) -> str:
        return sink_describes(self._local, key)
