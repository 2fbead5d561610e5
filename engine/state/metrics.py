"""Figures of merit (DESIGN.md section 4), computed from the lanes' real batch records.

The decisions this module protects: every figure comes from measured phase intervals, never
from configured or assumed times; throughput for overlap efficiency is the steady-state rate
(first batch done to last batch done), so a pipeline's fill-up and drain latency does not pass
for a lack of overlap; the Amdahl ceiling uses the measured serial share of the work.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from warpdeck.engine.state.read_only import LaneFigures, NamedFigures, read_only_by_lane, set_read_only
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.tasks import RUN_PHASES, StallReason

__all__ = ["Figures", "MetricsAccumulator", "amdahl_speedup"]

#: Batches needed before a steady-state rate means anything (first done to last done).
_STEADY_MIN = 3
_PHASE_NAMES = tuple(p.name.lower() for p in RUN_PHASES)


def amdahl_speedup(serial_fraction: float, p: float) -> float:
    """Amdahl's law: speedup on p workers when ``serial_fraction`` of the work cannot overlap."""
    s = min(max(serial_fraction, 0.0), 1.0)
    if math.isinf(p):
        return math.inf if s == 0 else 1.0 / s
    return 1.0 / (s + (1.0 - s) / p)


@dataclass(frozen=True, slots=True)
class Figures:
    """Every figure the TUI and the report show. Times in seconds, rates per second."""

    elapsed_s: float
    tasks_done: int
    tasks_failed: int
    batches: int
    throughput_tasks_s: float
    """Done tasks over the whole run so far (includes start-up and drain)."""
    throughput_bytes_s: float
    steady_tasks_s: float
    """Tasks/s from the first batch done to the last: the rate once the pipeline is full."""
    recent_tasks_s: float
    """Tasks/s over the last few seconds (the live sparkline)."""
    latency_p50_s: float
    latency_p99_s: float
    mean_phase_s: NamedFigures
    bound_tasks_s: float
    """1 / max(mean phase time) per lane, times lanes and mean batch size: perfect overlap."""
    serial_bound_tasks_s: float
    """1 / sum(mean phase times): no overlap at all."""
    overlap_efficiency: float
    occupancy: LaneFigures
    stall_s: NamedFigures
    divergence: int
    max_divergence: int
    serial_fraction: float
    amdahl: NamedFigures
    """Most speedup more lanes could give over the current count: p = lanes+1, 2x, infinity."""

    def __post_init__(self) -> None:
        # A snapshot's figures are shared by every reader: read-only (engine/state/read_only.py).
        set_read_only(self, "mean_phase_s", "stall_s", "amdahl")
        object.__setattr__(self, "occupancy", read_only_by_lane(self.occupancy))


class MetricsAccumulator:
    """Folds batch records and task latencies into running sums; ``figures`` reads them."""

    def __init__(self, lanes: int, latency_window: int = 100_000, recent_s: float = 3.0) -> None:
        self.lanes = lanes
        self.batches = 0
        self.tasks = 0
        self.nbytes = 0
        self.phase_sum = np.zeros(len(RUN_PHASES))
        self.phase_n = np.zeros(len(RUN_PHASES), np.int64)
        self.busy: dict[int, np.ndarray] = {}
        self.first_end = 0.0
        self.first_tasks = 0
        self.last_end = 0.0
        self.first_start = 0.0
        self.stall_s = dict.fromkeys((r.name.lower() for r in StallReason if r), 0.0)
        self._lat = np.zeros(latency_window)
        self._lat_n = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_s = recent_s
        self.serial_s = 0.0
        self.failed = 0

    def add(self, rec: BatchRecord) -> None:
        """Count one batch's record (failed batches count for occupancy, not throughput)."""
        busy = self.busy.setdefault(rec.lane, np.zeros(len(RUN_PHASES)))
        for i, (t0, t1) in enumerate(rec.phases):
            if t0:
                d = max(0.0, t1 - t0)
                busy[i] += d
                if rec.ok:
                    self.phase_sum[i] += d
                    self.phase_n[i] += 1
        start = rec.start
        if start and (not self.first_start or start < self.first_start):
            self.first_start = start
        if not rec.ok:
            return
        self.batches += 1
        self.tasks += rec.tasks
        self.nbytes += rec.nbytes
        end = rec.end
        if not self.first_end:
            self.first_end, self.first_tasks = end, rec.tasks
        self.last_end = max(self.last_end, end)
        self._recent.append((end, rec.tasks))

    def add_latencies(self, latencies: np.ndarray) -> None:
        """Record done tasks' queued-to-done times (a ring of the most recent)."""
        cap = len(self._lat)
        vals = latencies[-cap:]
        pos = (self._lat_n + np.arange(len(vals))) % cap
        self._lat[pos] = vals
        self._lat_n += len(vals)

    def add_stall(self, reason: StallReason, seconds: float) -> None:
        """Time some work spent stalled for ``reason``."""
        if reason:
            self.stall_s[reason.name.lower()] += max(0.0, seconds)

    def figures(self, now: float, started: float, done: int, failed: int, divergence: int,
                max_divergence: int) -> Figures:
        """Every figure as of ``now`` (perf_counter clock); ``started`` is the engine's start."""
        elapsed = max(1e-9, now - started)
        means = np.divide(self.phase_sum, self.phase_n, out=np.zeros_like(self.phase_sum), where=self.phase_n > 0)
        mean_batch = self.tasks / self.batches if self.batches else 0.0
        worst = float(means.max()) if self.batches else 0.0
        bound = self.lanes * mean_batch / worst if worst > 0 else 0.0
        total = float(means.sum())
        serial_bound = mean_batch / total if total > 0 else 0.0
        span = self.last_end - self.first_end
        steady = (self.tasks - self.first_tasks) / span if self.batches >= _STEADY_MIN and span > 0 else done / elapsed
        while self._recent and self._recent[0][0] < now - self._recent_s:
            self._recent.popleft()
        recent = sum(n for _, n in self._recent) / self._recent_s if self._recent else 0.0
        wall = max(1e-9, now - (self.first_start or started))
        occupancy = {lane: {name: float(b[i] / wall) for i, name in enumerate(_PHASE_NAMES)}
                     for lane, b in sorted(self.busy.items())}
        lat = self._lat[: min(self._lat_n, len(self._lat))]
        p50, p99 = (float(np.percentile(lat, 50)), float(np.percentile(lat, 99))) if len(lat) else (0.0, 0.0)
        # Serial share: event-loop bookkeeping and source enumeration (one of each, whatever the
        # lane count) against the lanes' bottleneck work, which more lanes would split.
        parallel = sum(float(b.max()) for b in self.busy.values())
        s = self.serial_s / (self.serial_s + parallel) if self.serial_s + parallel > 0 else 0.0
        base = amdahl_speedup(s, self.lanes)
        amdahl = {f"p={p if not math.isinf(p) else 'inf'}": amdahl_speedup(s, p) / base
                  for p in (self.lanes + 1, 2 * self.lanes, math.inf)}
        return Figures(
            elapsed_s=elapsed, tasks_done=done, tasks_failed=failed, batches=self.batches,
            throughput_tasks_s=done / elapsed, throughput_bytes_s=self.nbytes / elapsed,
            steady_tasks_s=steady, recent_tasks_s=recent, latency_p50_s=p50, latency_p99_s=p99,
            mean_phase_s={name: float(means[i]) for i, name in enumerate(_PHASE_NAMES)},
            bound_tasks_s=bound, serial_bound_tasks_s=serial_bound,
            overlap_efficiency=steady / bound if bound > 0 else 0.0,
            occupancy=occupancy, stall_s=dict(self.stall_s), divergence=divergence,
            max_divergence=max_divergence, serial_fraction=s, amdahl=amdahl,
        )
