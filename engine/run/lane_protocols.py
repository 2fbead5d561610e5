"""What a lane and its host are to each other: the interfaces every kind of lane shares.

The decisions this module protects: the dispatcher hosts in-process lanes (``lanes.Lane``) and Ray
lanes (``scaleout.dispatch.RayLane``) alike through ``LaneHost``, and the engine, the tuner and the
snapshot builder use either through ``LaneLike``: no union of lane kinds, no ``isinstance`` on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from warpdeck.engine.state.batches import Batch
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.snapshot import LaneView
from warpdeck.engine.state.task_states import Phase, StallReason

__all__ = ["LaneHost", "LaneLike"]


class LaneLike(Protocol):
    """A lane as the engine drives it: runs until its host has no batch left, and a slot depth."""

    @property
    def id(self) -> int: ...

    @property
    def depth(self) -> int: ...

    def set_depth(self, depth: int) -> None:
        """Batches the lane may hold at once (its slot ring)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes its buffers hold."""
        ...

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's buffers (0 before the first batch)."""
        ...

    @property
    def batches_done(self) -> int: ...

    def workers(self, phase: Phase) -> int:
        """Threads the host phase ``phase`` (fill or sink) runs on."""
        ...

    def set_workers(self, phase: Phase, workers: int) -> None:
        """Run the host phase ``phase`` on ``workers`` threads (the autotuner's choice)."""
        ...

    @property
    def fill_in_processes(self) -> bool:
        """Its fills run in worker processes now (``host.fill_pool``)."""
        ...

    def set_fill_processes(self, on: bool) -> None:
        """Move its fill to worker processes, or back to its threads (the autotuner's choice); a
        lane that cannot keeps its threads."""
        ...

    def warming(self, since: float) -> bool:
        """Whether a fill or sink worker process of its was starting at some time after ``since`` (a window
        of batches that waited for a start is not judged)."""
        ...

    def inflight_ids(self) -> tuple[int, ...]:
        """Ids of the batches it holds (any thread)."""
        ...

    def view(self) -> LaneView:
        """What the control room shows of it."""
        ...

    async def run(self) -> None:
        """Take batches from the host until it has none left."""
        ...


class LaneHost(Protocol):
    """What a lane reports to: the dispatcher, which changes the task table on its behalf."""

    async def next_batch(self, lane: LaneLike) -> Batch | None:
        """The next batch for ``lane``, or None when the run is over for it."""
        ...

    def on_started(self, batch: Batch) -> None: ...

    def fenced(self, batch: Batch) -> bool:
        """True when ``batch`` was taken back from its worker: its result must not be written."""
        ...

    def on_filled(self, batch: Batch, errors: Sequence[BaseException | None]) -> Batch:
        """Fail the tasks whose input could not be loaded; returns the batch of the rest."""
        ...

    def on_phase(self, batch: Batch, phase: Phase) -> None: ...

    def on_stall(self, batch: Batch, reason: StallReason, note: str = "") -> None: ...

    def on_failed(self, batch: Batch, phase: Phase, exc: BaseException) -> None: ...

    def on_sunk(self, batch: Batch, errors: Sequence[BaseException | None]) -> None: ...

    def on_record(self, record: BatchRecord) -> None: ...


