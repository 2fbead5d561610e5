"""Shared data: Ray actors that load their own inputs and stage their own outputs.

The decisions this module protects:
- Where the source and the sink live on storage every node sees (``executor.data``, chosen by
  ``data_mode``), the engine sends an actor only its tasks' keys and handles (an index, a path, a
  row's place): the actor opens the same source from the spec as a loader only (no listing of the
  folder, no key column read: the engine enumerated) and loads on its own fill threads.
- The actor writes outputs under temp names of its attempt (``<worker>-e<epoch>-b<batch>``) and
  returns only those names; the engine commits (renames) them after ``claim`` on its event loop,
  exactly where an in-process lane's write would land. An attempt the epoch fence gave up on is
  never committed: its temp files stay until removed (at the end of the run, or the next start).
- Errors cross by value only when they are ours (``InputError``, ``NonFiniteOutput``: the retry
  policy and the flagged outputs depend on their class); anything else crosses as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy.typing as npt

from warpdeck.engine.edges.config import NpyDirSink, ParquetSink, PipelineSpec
from warpdeck.engine.edges.executor_spec import why_not_shared
from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.sinks import Sink, Staged, StagingSink, open_sink
from warpdeck.engine.edges.sources import Source, open_source
from warpdeck.engine.run.lane_io import write_outputs
from warpdeck.engine.state.records import NonFiniteOutput

__all__ = ["RowErrors", "SharedData", "Stager", "data_mode", "opened_from_spec", "portable", "shared_data",
           "stage_outputs"]

RowErrors = tuple[tuple[int, BaseException], ...]
"""(row of the job, its error) for the rows that failed."""


@dataclass(frozen=True, slots=True)
class SharedData:
    """What an actor needs to read and write on its own: the spec's source and sink sections with
    every path made absolute (the actors' working directories are not the engine's)."""

    source: Any
    sink: Any

    def open(self) -> tuple[Source, StagingSink]:
        """The actor's own source and staging sink."""
        sink = open_sink(self.sink, Path("/"))
        assert isinstance(sink, StagingSink), f"{type(sink).__name__} cannot stage"
        return open_source(self.source, tasks=False), sink


def data_mode(spec: PipelineSpec) -> tuple[str, str]:
    """``ship`` or ``shared`` for a Ray run of ``spec``, and why (the report and ``check`` say it)."""
    want = spec.executor.data
    if want == "ship":
        return "ship", "executor.data = 'ship'"
    why = why_not_shared(spec.source.kind, spec.sink.kind)
    if why:  # 'shared' with such sections is refused by the spec itself
        return "ship", why
    how = "asked for" if want == "shared" else "auto: source and sink can be opened by every actor"
    return "shared", f"actors load their inputs and stage their outputs ({how})"


def shared_data(spec: PipelineSpec, sink: Sink) -> SharedData | None:
    """The actors' own data for a run whose mode is ``shared`` (None: the engine ships the arrays).
    ``sink`` is the engine's own: its directory is where the actors stage."""
    if data_mode(spec)[0] != "shared":
        return None
    source = spec.source
    if hasattr(source, "path"):
        source = source.model_copy(update={"path": Path(source.path).absolute()})
    out = spec.sink
    if isinstance(out, NpyDirSink | ParquetSink):
        out = out.model_copy(update={"path": Path(getattr(sink, "dir", out.path)).absolute()})
    return SharedData(source, out)


_SPEC_SOURCES = frozenset({"SyntheticSourceImpl", "NpyDirSourceImpl", "ImageSourceImpl", "ParquetSourceImpl"})
"""The sources ``open_source`` makes from the spec sections an actor can open too."""


def opened_from_spec(source: Source) -> bool:
    """Whether the engine's source (under a resume, if any) is one the spec describes, so that an
    actor opening the spec's section reads the same tasks (not an iterable handed to the engine)."""
    inner = getattr(source, "inner", source)  # ResumingSource
    return type(inner).__name__ in _SPEC_SOURCES and type(inner).__module__.startswith("warpdeck.engine.edges.")


def portable(exc: BaseException) -> BaseException:
    """``exc`` as it may cross to the engine: ours by value, anything else as text."""
    if isinstance(exc, InputError | NonFiniteOutput):
        return exc
    return RuntimeError(f"{type(exc).__name__}: {exc}")


class Stager:
    """A batch writer that stages (``StagingSink.stage``) instead of writing; remembers what."""

    def __init__(self, sink: StagingSink, tag: str) -> None:
        self._sink = sink
        self._tag = tag
        self.keys: tuple[str, ...] = ()
        self.staged: Staged = ()

    def write(self, key: str, out: npt.NDArray[Any]) -> None:  # pragma: no cover - write_batch is used
        self.write_batch([key], out[None])

    def write_batch(self, keys: Sequence[str], outs: npt.NDArray[Any]) -> None:
        self.staged = self._sink.stage(keys, outs, self._tag)
        self.keys = tuple(keys)


def stage_outputs(sink: StagingSink, keys: Sequence[str], rows: Sequence[int], outputs: npt.NDArray[Any],
                  policy: str, tag: str) -> tuple[tuple[str, ...], Staged, RowErrors]:
    """Stage ``outputs[rows]`` under ``keys`` (the job's rows that ran) with the spec's ``nonfinite``
    policy; returns the keys staged, the temp files, and each failed row's error. Runs on a thread."""
    stager = Stager(sink, tag)
    errors = write_outputs(stager, keys, outputs[list(rows)], policy)
    return stager.keys, stager.staged, tuple((rows[j], portable(e)) for j, e in enumerate(errors) if e is not None)
