"""The report of a run, made from its final snapshot and the facts the engine gathered.

The decision this module protects: the report's models (``engine/state/report.py``) are frozen
types any reader may load; making one needs the run's parts (the journal, the resume, the control
plane, the outage watch), so that lives here, in the run, and the models never import those parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warpdeck.engine.edges.journal import JournalError
from warpdeck.engine.state.report import (
    ReportControl,
    ReportCounts,
    ReportFailure,
    ReportFlag,
    ReportOutages,
    ReportResume,
    RunReport,
)
from warpdeck.engine.state.snapshot import EngineSnapshot

if TYPE_CHECKING:
    from warpdeck.engine.control.plane import ControlPlane
    from warpdeck.engine.edges.journal import Journal
    from warpdeck.engine.edges.outage import Outage
    from warpdeck.engine.edges.resume import ResumingSource

__all__ = ["RunFacts", "make_report"]


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the report needs beyond the final snapshot: the run's facts, gathered by the engine
    (so this module never imports it)."""

    batch_size: int
    first_batch_s: float | None
    failures: list[tuple[str, str, int]]
    """Every task that failed or was cancelled: key, reason, attempt."""
    flags: list[tuple[str, str]]
    """Every done task whose output is suspect: key, note."""
    resume: ResumingSource | None
    journal: Journal | None
    temps_cleaned: int
    control: ControlPlane | None
    outage: Outage
    stopped_by: str
    source_error: str = ""
    source_traceback: str = ""
    phase_clocks: dict[str, str] = field(default_factory=dict)
    tuning: list[str] = field(default_factory=list)
    executor: str = ""


def make_report(snap: EngineSnapshot, facts: RunFacts) -> RunReport:
    """The report of a run from its final snapshot and its facts."""
    f = snap.figures
    c = snap.counts
    failures = [ReportFailure(key=k, reason=why, attempt=n) for k, why, n in facts.failures]
    flagged = [ReportFlag(key=k, note=note) for k, note in facts.flags]
    rs, journal = facts.resume, facts.journal
    resume = None if rs is None or journal is None else ReportResume(
        resumed=rs.resumed, journal=str(journal.path), skipped_done=rs.skipped_done,
        outputs_recovered=rs.outputs_recovered, outputs_rejected=rs.outputs_rejected,
        requeued_in_flight=rs.requeued_in_flight,
        retried_failed=rs.retried_failed, temps_cleaned=facts.temps_cleaned)
    outage = facts.outage
    view = outage.view()
    outages = outage.count + (view is not None)
    last = view.reason if view is not None else outage.last
    report_outages = ReportOutages(count=outages, total_s=round(outage.total_s + (
        snap.t - view.since if view is not None else 0.0), 3), last=last) if outages else None
    journal_error = str(JournalError(journal.run_dir, journal.error)) if journal and journal.error else ""
    plane = facts.control
    control = None if plane is None else ReportControl(
        broker=plane.address.url if plane.address else "", connected=plane.connected.is_set(),
        commands_applied=plane.applied, commands_refused=dict(plane.refused), dropped=plane.dropped.counts(),
        workers_lost=sorted(plane.workers_lost()), workers_lost_count=plane.monitor.counters.workers_lost,
        error=plane.error,
        lag_holds=plane.lag.holds, worst_input_lag_s=plane.lag.worst_s,
        workers_waiting={w.id: w.note for w in snap.workers if w.note})
    return RunReport(
        pipeline=snap.pipeline, status=snap.status, backend=snap.backend, backend_reason=snap.backend_reason,
        device=snap.device, lanes=len(snap.lanes), batch_size=facts.batch_size,
        slot_depth=[ln.depth for ln in snap.lanes], elapsed_s=snap.t, first_batch_s=facts.first_batch_s,
        counts=ReportCounts(total=c.total, done=c.done, failed=c.failed, cancelled=c.cancelled, queued=c.queued,
                            running=c.running_total, skipped_done=resume.skipped_done if resume else 0,
                            flagged=len(flagged)),
        throughput_tasks_s=f.throughput_tasks_s, throughput_bytes_s=f.throughput_bytes_s,
        steady_tasks_s=f.steady_tasks_s, bound_tasks_s=f.bound_tasks_s,
        device_busy=f.device_busy, device_busy_by_lane=dict(f.device_busy_by_lane), bottleneck=f.bottleneck,
        bottleneck_phase=f.bottleneck_phase, cpu_phase_s=dict(f.cpu_phase_s),
        host_threads={str(ln.id): {"fill": ln.fill_workers, "sink": ln.sink_workers} for ln in snap.lanes},
        host_processes={str(ln.id): [{"pid": p.pid, "batches": p.batches, "busy_share": round(p.busy_share, 4)}
                                     for p in ln.fill_processes] for ln in snap.lanes if ln.fill_processes},
        sink_processes={str(ln.id): [{"pid": p.pid, "batches": p.batches, "busy_share": round(p.busy_share, 4)}
                                     for p in ln.sink_processes] for ln in snap.lanes if ln.sink_processes},
        phase_clocks=facts.phase_clocks, tuning=facts.tuning, executor=facts.executor,
        serial_bound_tasks_s=f.serial_bound_tasks_s, overlap_efficiency=f.overlap_efficiency,
        mean_phase_s=f.mean_phase_s, occupancy={str(k): v for k, v in f.occupancy.items()}, stall_s=f.stall_s,
        divergence_max=f.max_divergence, serial_fraction=f.serial_fraction, amdahl_ceiling=f.amdahl,
        lanes_limit=f.lanes_limit,
        latency_p50_s=f.latency_p50_s, latency_p99_s=f.latency_p99_s, failures=failures, resume=resume, control=control,
        flagged=flagged, stopped_by=facts.stopped_by, source_error=facts.source_error,
        source_traceback=facts.source_traceback, outages=report_outages, journal_error=journal_error,
    )
