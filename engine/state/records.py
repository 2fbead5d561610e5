"""Records several parts share: a batch's record, a stage plan, a flagged output, a kept traceback.

The decision this module protects: the data that the lanes produce and the snapshot, metrics, wire,
telemetry and report read lives here, apart from the lanes, so none of those readers imports the
lanes (and a remote control room never loads them).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from warpdeck.engine.state.batches import BatchKey, item_nbytes
from warpdeck.engine.state.task_states import Phase

__all__ = ["BatchRecord", "NonFiniteOutput", "StagePlan", "format_exception", "plan_stages", "root_failure"]


class NonFiniteOutput(ValueError):
    """A task's output holds NaN or infinity. Under the ``flag`` policy it was written anyway
    (``written``) and the task finishes flagged; under ``fail`` nothing was written."""

    def __init__(self, key: str, bad: int, size: int, written: bool) -> None:
        self.key = key
        self.bad = bad
        self.size = size
        self.written = written
        super().__init__(f"non-finite output: {bad} of {size} values are NaN or infinite")

    def __reduce__(self) -> tuple[type[NonFiniteOutput], tuple[str, int, int, bool]]:
        # Errors cross process boundaries (Ray actors that write their own outputs): keep every field.
        return (NonFiniteOutput, (self.key, self.bad, self.size, self.written))


@dataclass(frozen=True, slots=True)
class StagePlan:
    """The stage functions for one batching key and the shape/dtype after each of them."""

    fns: tuple[Callable[..., Any], ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[np.dtype[Any], ...]
    deadline_s: float
    nonfinite: str = "allow"
    """The spec's ``nonfinite`` policy: flag, fail or allow."""

    @property
    def out_nbytes(self) -> int:
        """Bytes of one task's final output."""
        return item_nbytes(self.shapes[-1], self.dtypes[-1])

    def mid_nbytes(self, i: int) -> int:
        """Bytes of one task's output of stage ``i``."""
        return item_nbytes(self.shapes[i + 1], self.dtypes[i + 1])


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """What one batch did, for the timeline and every figure of merit.

    ``phases`` holds (start, end) per phase in RUN_PHASES order, on ``time.perf_counter``'s
    clock; (0, 0) for a phase the batch never reached. ``cpu`` holds the CPU seconds each phase's
    thread spent on it (empty when not measured: a remote lane's record). ``nbytes`` are the batch's
    inputs (what h2d copies), ``out_nbytes`` its outputs (what d2h copies)."""

    batch: int
    lane: int
    slot: int
    tasks: int
    key: str
    formed: float
    phases: tuple[tuple[float, float], ...]
    ok: bool
    nbytes: int
    cpu: tuple[float, ...] = ()
    out_nbytes: int = 0

    def duration(self, phase: Phase) -> float:
        t0, t1 = self.phases[phase - 1]
        return max(0.0, t1 - t0)

    @property
    def end(self) -> float:
        return max(t1 for _, t1 in self.phases)

    @property
    def start(self) -> float:
        starts = [t0 for t0, _ in self.phases if t0]
        return min(starts) if starts else self.formed


class StageShape(Protocol):
    """What a stage plan reads of a spec's stage (``edges/config.py``'s ``StageSpec``)."""

    @property
    def out_shape(self) -> Sequence[int] | None: ...

    @property
    def out_dtype(self) -> str | None: ...

    @property
    def deadline_s(self) -> float: ...


def plan_stages(fns: Sequence[Callable[..., Any]], stages: Sequence[StageShape], key: BatchKey,
                nonfinite: str) -> StagePlan:
    """The shapes and dtypes after each stage for inputs of ``key``: a stage's ``out_spec``, then
    the spec's ``out_shape``/``out_dtype``, else its input's."""
    shapes: list[tuple[int, ...]] = [tuple(key.shape)]
    dtypes: list[np.dtype[Any]] = [np.dtype(key.dtype)]
    for fn, st in zip(fns, stages, strict=True):
        shape, dtype = shapes[-1], dtypes[-1]
        spec_fn = getattr(fn, "out_spec", None)
        if spec_fn is not None:
            s, d = spec_fn(shape, dtype)
            shape, dtype = tuple(int(x) for x in s), np.dtype(d)
        if st.out_shape is not None:
            shape = tuple(st.out_shape)
        if st.out_dtype is not None:
            dtype = np.dtype(st.out_dtype)
        shapes.append(shape)
        dtypes.append(dtype)
    return StagePlan(tuple(fns), tuple(shapes), tuple(dtypes), sum(s.deadline_s for s in stages), nonfinite)



def root_failure(exc: BaseException) -> BaseException:
    """The original failure behind a chain of skipped dependencies."""
    while exc.__cause__ is not None and type(exc).__name__ == "DependencyFailed":
        exc = exc.__cause__
    return exc


def format_exception(exc: BaseException) -> str:
    """A traceback as text, kept with the failed task (a remote worker's own, where it sent one)."""
    remote = getattr(exc, "remote_traceback", "")
    if isinstance(remote, str) and remote:
        return remote
    return "".join(traceback.format_exception(exc)).rstrip()
