"""What travels between the engine and its Ray actors, through Ray's object store (never MQTT).

The decision this module protects: data and control take separate roads. A batch's inputs go
out as one array and its outputs come back as one array, both through Ray's object store (zero
copy on the same node, Ray's transfer between nodes); the control plane carries only liveness
(births, heartbeats, Wills). Errors cross as text, never as pickled exceptions: an exception
class of the user's may not unpickle in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from warpdeck.engine.edges.sinks import Staged
from warpdeck.engine.state.batches import BatchKey, TaskInput

__all__ = ["BatchJob", "BatchOutcome", "WorkerHello"]


@dataclass(frozen=True, slots=True)
class BatchJob:
    """One batch for one of an actor's lanes: its tasks' inputs, already loaded by the engine
    (``inputs``), or (shared data) the tasks themselves, for the actor to load (``items``)."""

    batch: int
    lane: int
    """The actor's lane (0 … lanes-1) that runs it."""
    key: BatchKey
    inputs: npt.NDArray[Any] | None
    depth: int
    """The lane's slot depth the engine asks for (the auto-tuner's choice)."""
    items: tuple[TaskInput, ...] = ()
    """Shared data: each task's key and handle (an index, a path, a row's place), no data."""
    fill_workers: int = 0
    """Shared data: the fill threads the engine's tuner chose for this lane (the actor loads)."""

    def __len__(self) -> int:
        return len(self.items) if self.inputs is None else len(self.inputs)


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What an actor did with one batch, under which epoch, and when (the actor's clock)."""

    batch: int
    epoch: int
    """The worker's epoch when the batch arrived: the engine rejects a result from an older one."""
    outputs: npt.NDArray[Any] | None
    """Row j is task j's output; None when the batch failed."""
    failure: tuple[str, str, str] | None
    """(phase name, message, traceback) of a failed batch."""
    received: float
    """``time.perf_counter`` of the actor when the batch arrived, and (start, end) per phase in RUN_PHASES order on the
    same clock; (0, 0) for a phase not reached."""
    phases: tuple[tuple[float, float], ...]
    slot: int = -1
    fill_errors: tuple[tuple[int, BaseException], ...] = ()
    """Shared data: the rows that could not be loaded (row, error); the rest ran."""
    staged_keys: tuple[str, ...] = ()
    """Shared data: the keys staged and their temp files (``StagingSink.stage``), for the engine to commit, and the rows
    whose output was not staged or is flagged (row, error)."""
    staged: Staged = ()
    sink_errors: tuple[tuple[int, BaseException], ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of outputs coming back."""
        return 0 if self.outputs is None else int(self.outputs.nbytes)


@dataclass(frozen=True, slots=True)
class WorkerHello:
    """An actor's answer when asked who it is: the epoch it heartbeats under now and its birth's
    details (the engine's worker rows show them before the monitor hears the birth)."""

    worker_id: str
    epoch: int
    host: str
    pid: int
    device: str
    backend: str
    lanes: int
    heartbeating: bool
    """Whether its heartbeat is connected to the broker (False without a control plane)."""

