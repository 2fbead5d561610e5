"""The run report: what ``--json`` writes and the headless summary prints.

The decision this module protects: the report is a pydantic model, so its JSON has one schema
that tests, CI and users can rely on; it is built from the final snapshot, never recomputed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict

from warpdeck.engine.snapshot import EngineSnapshot
from warpdeck.engine.tasks import State

if TYPE_CHECKING:
    from warpdeck.engine.scheduler import Engine

__all__ = ["ReportCounts", "ReportFailure", "RunReport", "make_report"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReportCounts(_Frozen):
    """Tasks by final state."""

    total: int
    done: int
    failed: int
    cancelled: int
    queued: int
    running: int


class ReportFailure(_Frozen):
    """One task that did not finish, and why."""

    key: str
    reason: str
    attempt: int


class RunReport(_Frozen):
    """Everything a run measured (DESIGN.md section 4). Rates per second, times in seconds."""

    schema_version: int = 1
    pipeline: str
    status: str
    backend: str
    backend_reason: str
    device: str
    lanes: int
    batch_size: int
    slot_depth: list[int]
    elapsed_s: float
    first_batch_s: float | None
    counts: ReportCounts
    throughput_tasks_s: float
    throughput_bytes_s: float
    steady_tasks_s: float
    bound_tasks_s: float
    serial_bound_tasks_s: float
    overlap_efficiency: float
    mean_phase_s: dict[str, float]
    occupancy: dict[str, dict[str, float]]
    stall_s: dict[str, float]
    divergence_max: int
    serial_fraction: float
    amdahl_ceiling: dict[str, float]
    latency_p50_s: float
    latency_p99_s: float
    failures: list[ReportFailure]

    @property
    def exit_code(self) -> int:
        """0 when every task is done; 1 when any failed, was cancelled or never ran."""
        c = self.counts
        return 0 if c.done == c.total and self.status == "finished" else 1


def make_report(engine: Engine, snap: EngineSnapshot) -> RunReport:
    """The report of ``engine``'s run as of ``snap``."""
    f = snap.figures
    c = snap.counts
    t = engine.table
    unfinished = np.flatnonzero(t.state[: len(t)] >= State.FAILED)
    failures = [ReportFailure(key=t.keys[r], reason=t.error(r), attempt=int(t.attempt[r]))
                for r in unfinished.tolist()]
    return RunReport(
        pipeline=snap.pipeline, status=snap.status, backend=snap.backend, backend_reason=snap.backend_reason,
        device=snap.device, lanes=len(snap.lanes), batch_size=engine.spec.batch_size,
        slot_depth=[ln.depth for ln in snap.lanes], elapsed_s=snap.t, first_batch_s=engine.first_batch_s,
        counts=ReportCounts(total=c.total, done=c.done, failed=c.failed, cancelled=c.cancelled, queued=c.queued,
                            running=c.running_total),
        throughput_tasks_s=f.throughput_tasks_s, throughput_bytes_s=f.throughput_bytes_s,
        steady_tasks_s=f.steady_tasks_s, bound_tasks_s=f.bound_tasks_s,
        serial_bound_tasks_s=f.serial_bound_tasks_s, overlap_efficiency=f.overlap_efficiency,
        mean_phase_s=f.mean_phase_s, occupancy={str(k): v for k, v in f.occupancy.items()}, stall_s=f.stall_s,
        divergence_max=f.max_divergence, serial_fraction=f.serial_fraction, amdahl_ceiling=f.amdahl,
        latency_p50_s=f.latency_p50_s, latency_p99_s=f.latency_p99_s, failures=failures,
    )
