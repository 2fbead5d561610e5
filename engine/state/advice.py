"""Advice: the batch size, host threads and slot depth a pipeline should run with, from a calibration.

The decisions this module protects:
- Pure arithmetic on measurements: ``engine/calibrate.py`` runs the engine and measures; this
  module fits and decides, so tests drive it with made-up measurements.
- Each phase's cost per batch is a line in the batch size, t = a + b·n (a: fixed per batch, b: per
  item), fitted by least squares over the calibrated sizes and never negative; wall time and CPU
  time each get their own line, and so does the whole process's CPU per batch (every thread and
  the event loop: the loop's bookkeeping competes for the same cores).
- The predicted rate is the smallest of the pipeline's bounds: a device phase (h2d, compute, d2h)
  runs one batch at a time per lane (rate <= 1/t), a host phase (fill, sink) on w threads w at a
  time (rate <= w/t), and the process's CPU seconds per batch fit in the cores (rate <= cores/cpu),
  across lanes, not per lane.
- Host threads are added only up to the device's pace (w = ceil(t_host / t_compute)) and taken
  away again while another bound holds the rate anyway: a thread that cannot run adds nothing.
  The ring gets a slot per thread and one more for the device (depth = threads + 2).
- The batch size with the best predicted rate wins, the smaller one when within 5 %: smaller
  batches cost less latency and memory for the same throughput.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HOST_PHASES",
    "PHASES",
    "Advice",
    "BackendAdvice",
    "CostModel",
    "Limits",
    "Line",
    "PhaseFit",
    "Plan",
    "Sample",
    "anchor",
    "candidate_sizes",
    "fit_line",
    "fit_model",
    "gpu_speedup",
    "plan_for",
    "predict",
    "recommend",
]

PHASES: tuple[str, ...] = ("fill", "h2d", "compute", "d2h", "sink")
HOST_PHASES: tuple[str, ...] = ("fill", "sink")
"""Phases that run on a pool of host threads; the others run in order, one batch at a time."""
_PREFER_SMALLER = 0.05
"""A smaller batch within this share of the best predicted rate is preferred."""
_LEAST_EFFICIENCY = 0.5
"""Below this, a calibration's efficiency says more about its noise than about the engine."""
_SCALE_RANGE = (0.25, 1.0)
"""An anchor lowers the fits' level, never raises it: a short run of the plan sees what the lines cannot (threads
contending, a size outside the calibrated ones), while a run faster than the lines has mostly caught the machine in a
lull. Below the floor it says more about its noise."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One calibration run at one batch size and thread counts: per phase the mean wall and CPU
    seconds per batch, the whole process's CPU seconds per batch and the rate it reached, all
    measured after the first batches (warm-up) and before the drain."""

    batch_size: int
    wall_s: Mapping[str, float]
    cpu_s: Mapping[str, float]
    process_cpu_s: float
    tasks_s: float
    batches: int
    fill_workers: int = 1
    sink_workers: int = 1
    slot_depth: int = 3
    lanes: int = 1


@dataclass(frozen=True, slots=True)
class Line:
    """Seconds per batch as a line in the batch size n: ``a + b·n`` (a, b >= 0)."""

    a: float
    b: float

    def at(self, n: float) -> float:
        return self.a + self.b * n


def fit_line(points: Sequence[tuple[float, float]]) -> Line:
    """Least squares ``y = a + b·x`` over ``points`` (x > 0), each point's error taken relative
    to its x (the cost per item, y/x, regressed on 1/x): small batches, where a fixed cost shows,
    weigh as much as large ones. Neither coefficient is negative: a negative per-batch cost (noise)
    gives a line through zero, a negative per-item cost a flat line. One batch size alone gives a
    line through zero (all cost per item)."""
    pts = [(float(x), max(0.0, float(y))) for x, y in points if x > 0]
    if not pts:
        return Line(0.0, 0.0)
    per_item = [(1.0 / x, y / x) for x, y in pts]  # (u, v): v = b + a·u
    mu = sum(u for u, _ in per_item) / len(per_item)
    mv = sum(v for _, v in per_item) / len(per_item)
    suu = sum((u - mu) ** 2 for u, _ in per_item)
    if suu <= 0:  # one batch size
        return Line(0.0, mv)
    a = sum((u - mu) * (v - mv) for u, v in per_item) / suu
    b = mv - a * mu
    if a < 0:
        return Line(0.0, mv)
    if b < 0:  # all fixed cost: the flat line through the points, relative errors again
        return Line(sum(y / x**2 for x, y in pts) / sum(1 / x**2 for x, _ in pts), 0.0)
    return Line(a, b)


@dataclass(frozen=True, slots=True)
class PhaseFit:
    """One phase's fitted wall and CPU seconds per batch."""

    phase: str
    wall: Line
    cpu: Line


@dataclass(frozen=True, slots=True)
class CostModel:
    """What a batch of n costs on one backend: per phase, and the process's CPU as a whole."""

    backend: str
    phases: tuple[PhaseFit, ...]
    process_cpu: Line
    slot_item_bytes: float
    """Bytes a slot holds per task: its input and output, pinned on the host and on the device."""
    efficiency: float = 1.0
    """Share of its tightest bound the engine reached in the calibration runs (the median of
    their overlap efficiencies: jitter, batches waiting on the loop's turn)."""
    scale: float = 1.0
    """The bound a run of the recommended settings showed over the fits' bound for them
    (``anchor``): what the lines miss there (threads contending, a size outside the calibrated
    ones). Predictions are the fits' bound times ``efficiency`` times ``scale``."""

    def wall(self, phase: str, n: float) -> float:
        return next(f.wall.at(n) for f in self.phases if f.phase == phase)

    def cpu(self, phase: str, n: float) -> float:
        return next(f.cpu.at(n) for f in self.phases if f.phase == phase)

    def cpu_total(self, n: float) -> float:
        """CPU seconds the process spends per batch: at least its phases' own."""
        return max(self.process_cpu.at(n), sum(f.cpu.at(n) for f in self.phases))


def fit_model(backend: str, samples: Sequence[Sample], slot_item_bytes: float, cores: float = math.inf) -> CostModel:
    """Fit every phase's wall and CPU lines, and the process's CPU line, over ``samples``; the
    efficiency is the median of each sample's rate over the bound its own figures set."""
    phases = tuple(PhaseFit(p, fit_line([(s.batch_size, s.wall_s.get(p, 0.0)) for s in samples]),
                            fit_line([(s.batch_size, s.cpu_s.get(p, 0.0)) for s in samples])) for p in PHASES)
    process = fit_line([(s.batch_size, s.process_cpu_s) for s in samples])
    shares = sorted(s.tasks_s / b for s in samples if (b := _sample_bound(s, cores)) > 0)
    efficiency = min(1.0, max(_LEAST_EFFICIENCY, shares[len(shares) // 2])) if shares else 1.0
    return CostModel(backend, phases, process, slot_item_bytes, efficiency)


def _sample_bound(s: Sample, cores: float) -> float:
    """Tasks/s the bounds allow with a sample's own figures."""
    workers = {"fill": s.fill_workers, "sink": s.sink_workers}
    rates = [s.lanes * workers.get(p, 1) / t for p in PHASES if (t := s.wall_s.get(p, 0.0)) > 0]
    cpu = max(s.process_cpu_s, sum(s.cpu_s.values()))
    if cpu > 0:
        rates.append(cores / cpu)
    return min(rates) * s.batch_size if rates else 0.0


@dataclass(frozen=True, slots=True)
class Limits:
    """What the run may use: cores for its CPU, lanes, threads per host phase, slot memory."""

    cores: float
    lanes: int = 1
    max_workers: int = 8
    memory_budget_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class Plan:
    """Settings for one batch size and what the model predicts they reach. ``bottleneck`` is the
    bound that holds the rate: a phase, or ``cpu``."""

    batch_size: int
    fill_workers: int
    sink_workers: int
    slot_depth: int
    tasks_s: float
    batches_s: float
    device_busy: float
    """Share of the time each lane's compute phase runs (the device busy, on CuPy)."""
    bottleneck: str
    memory_bytes: int
    """Slot memory all lanes' rings take (pinned host and device together)."""


def _depth(fill_workers: int, sink_workers: int) -> int:
    return max(2, max(fill_workers, sink_workers) + 2)


def predict(model: CostModel, limits: Limits, n: int, fill_workers: int, sink_workers: int) -> Plan:
    """The rate ``n``-task batches reach with these host threads: the smallest bound wins."""
    workers = {"fill": fill_workers, "sink": sink_workers}
    bounds: dict[str, float] = {}
    for p in PHASES:
        t = model.wall(p, n)
        per_lane = workers.get(p, 1) / t if t > 0 else math.inf
        bounds[p] = per_lane * limits.lanes
    cpu = model.cpu_total(n)
    bounds["cpu"] = limits.cores / cpu if cpu > 0 else math.inf
    bottleneck = min(bounds, key=lambda k: bounds[k])
    rate = bounds[bottleneck] * model.efficiency * model.scale
    if math.isinf(rate):  # nothing measured: nothing to predict
        rate = 0.0
    depth = _depth(fill_workers, sink_workers)
    busy = min(1.0, rate / limits.lanes * model.wall("compute", n))
    memory = round(limits.lanes * depth * n * model.slot_item_bytes)
    return Plan(n, fill_workers, sink_workers, depth, rate * n, rate, busy, bottleneck, memory)


def plan_for(model: CostModel, limits: Limits, n: int) -> Plan:
    """Host threads for ``n``-task batches: each host phase gets enough to keep pace with compute
    (within ``max_workers``), then loses those another bound makes useless."""
    compute = model.wall("compute", n)
    workers: dict[str, int] = {}
    for p in HOST_PHASES:
        t = model.wall(p, n)
        if t <= 0:
            need = 1
        elif compute <= 0:  # nothing to keep pace with: as many as allowed, the bounds trim them
            need = limits.max_workers
        else:
            need = math.ceil(t / compute - 1e-9)
        workers[p] = min(limits.max_workers, max(1, need))
    best = predict(model, limits, n, workers["fill"], workers["sink"]).batches_s
    changed = True
    while changed:
        changed = False
        for p in sorted(HOST_PHASES, key=lambda q: -workers[q]):
            if workers[p] == 1:
                continue
            fewer = {**workers, p: workers[p] - 1}
            if predict(model, limits, n, fewer["fill"], fewer["sink"]).batches_s >= best * (1 - 1e-9):
                workers, changed = fewer, True
    return predict(model, limits, n, workers["fill"], workers["sink"])


def anchor(model: CostModel, limits: Limits, plan: Plan, run: Sample) -> CostModel:
    """``model`` scaled so that ``plan``'s bound is the one a run of its settings showed, where
    that is lower: from that run's own phase times (each host phase on its threads, contending as
    they do) and CPU, which a handful of batches measure well, where its rate over a handful would
    carry the pipeline's filling. Every plan scales alike, so the choice among them stands."""
    fitted = plan.tasks_s / (model.efficiency * model.scale) if plan.tasks_s > 0 else 0.0
    shown = _sample_bound(run, limits.cores)
    if fitted <= 0 or shown <= 0:
        return model
    lo, hi = _SCALE_RANGE
    return dataclasses.replace(model, scale=min(hi, max(lo, model.scale * shown / fitted)))


def candidate_sizes(batch_size: int) -> list[int]:
    """The spec's batch size and the powers of two from a quarter of it to four times it."""
    sizes = {batch_size}
    p = 1
    while p <= 4 * batch_size:
        if p * 4 >= batch_size:
            sizes.add(p)
        p *= 2
    return sorted(sizes)


def recommend(model: CostModel, limits: Limits, batch_size: int) -> tuple[Plan, tuple[Plan, ...]]:
    """The plan to run with and every candidate's: the best predicted rate within the memory
    budget, the smallest batch within 5 % of it (the smallest candidate if none fits)."""
    plans = tuple(plan_for(model, limits, n) for n in candidate_sizes(batch_size))
    fits = [p for p in plans if p.memory_bytes <= limits.memory_budget_bytes] or [plans[0]]
    best = max(p.tasks_s for p in fits)
    chosen = next(p for p in fits if p.tasks_s >= best * (1 - _PREFER_SMALLER))
    return chosen, plans


@dataclass(frozen=True, slots=True)
class BackendAdvice:
    """Calibration and recommendation on one backend. ``checks`` are the runs of the recommended
    settings (the last anchors the prediction); ``note`` says what an earlier one changed."""

    backend: str
    device: str
    limits: Limits
    samples: tuple[Sample, ...]
    model: CostModel
    plan: Plan
    candidates: tuple[Plan, ...]
    checks: tuple[Sample, ...] = ()
    note: str = ""
    calibration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Advice:
    """What ``warpdeck advise`` found: a recommendation per backend calibrated and, with both,
    how many times faster the GPU's recommended plan runs than NumPy's (``gpu_speedup``)."""

    pipeline: str
    batch_size: int
    """The spec's own batch size."""
    results: tuple[BackendAdvice, ...]
    gpu_speedup: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-ready (seconds, bytes, tasks per second)."""
        return dataclasses.asdict(self)


def gpu_speedup(results: Sequence[BackendAdvice]) -> float | None:
    """The CuPy plan's predicted rate over the NumPy plan's, where both were calibrated."""
    by = {r.backend: r.plan.tasks_s for r in results}
    if "cupy" not in by or "numpy" not in by or by["numpy"] <= 0:
        return None
    return by["cupy"] / by["numpy"]
