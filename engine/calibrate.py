"""Calibration: short runs of the real engine that measure a pipeline's phases (``warpdeck advise``).

The decisions this module protects:
- Measured on the engine itself, with the spec's own stages, source and kind of sink: each run is
  the spec at another batch size with one host thread per phase and a ring of 3 (what a plan of
  one thread each runs with), no journal, no tuner, lanes in this process, outputs in a scratch
  directory removed afterwards. An ``npy_dir`` sink never writes into the spec's own directory: a
  later run would take the calibration's outputs for its own, done.
- Short: a run stops admitting (drain) after enough batches or its share of the time budget, and
  the source is cut to what that needs; the first batches (allocation, first calls) and the last
  (the ring emptying) are left out of every figure. The process's CPU is sampled between them.
- The plan is run before it is printed. Runs with one thread each cannot vouch for more: how a
  host phase's threads scale on this machine (its cores, the GIL, a kernel lock on one directory)
  is measured, not assumed. Where the plan's extra threads gain nothing over one each, the plan
  keeps one and is run again. The last such run caps the prediction's level (``advice.anchor``:
  the model's bounds scaled down to the bound that run's own phase times showed, where lower): it
  measured those very settings, contention the lines cannot see included. The fitted lines choose
  among the plans; the run can only say the chosen one goes slower than they think.
- The fitting and deciding are ``engine/state/advice.py``'s (pure); this module only measures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

from warpdeck.engine.edges.config import (
    ExecutorSpec,
    NpyDirSink,
    NpyDirSource,
    ParquetSink,
    PipelineSpec,
    SyntheticSource,
)
from warpdeck.engine.edges.sources import open_source
from warpdeck.engine.engine import Engine
from warpdeck.engine.run.autotune import default_cores
from warpdeck.engine.state.advice import (
    PHASES,
    Advice,
    BackendAdvice,
    Limits,
    Plan,
    Sample,
    anchor,
    fit_model,
    gpu_speedup,
    predict,
    recommend,
)
from warpdeck.engine.state.commands import Cancel, Drain
from warpdeck.engine.state.records import BatchRecord

__all__ = ["advise", "calibrate", "measure", "with_plan"]

BackendName = Literal["numpy", "cupy"]

_WARMUP = 2
"""Batches left out at the start of a run and at its end. At the start: buffers allocated, stage functions' first calls,
and the ring filling, when every phase runs at once and contends for the cores as it never does once the bottleneck sets
the pace (``_warmup``: at least the ring's depth)."""
_TAIL = 2
_MAX_BATCHES = 200
"""Batches a calibration run aims for: as many as its share of the budget is expected to allow (from the rate the run
before it reached), within these. Filling its time matters as much as the count: the machine's other work comes and
goes, and a run of 0.1 s can catch a lull."""
_MIN_BATCHES = 5
_CALIBRATION_DEPTH = 3
"""The ring of the calibration runs: what a plan of one thread per host phase gets (threads + 2)."""
_POLL_S = 0.005
"""How often a run's progress and the process's CPU time are sampled."""
_HARD_STOP = 3.0
"""Past this many times its budget, a run that is still draining is cancelled."""
_GAIN = 1.05
"""Extra threads that do not beat one thread each by this much gain nothing."""
_CHECKS = 2
"""Runs of the recommended plan at most: one, and another when its extra threads gained nothing."""


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """One calibration run: its figures, the bytes a slot holds per task, and the device."""

    sample: Sample
    slot_item_bytes: float
    device: str


def calibration_spec(spec: PipelineSpec, backend: BackendName, n: int, fill_workers: int = 1,
                     sink_workers: int = 1, slot_depth: int = _CALIBRATION_DEPTH,
                     batches: int = _MAX_BATCHES) -> PipelineSpec:
    """``spec`` as a calibration run: batch size ``n``, these threads and depth pinned, no tuner,
    lanes in this process, a synthetic source cut to what the run needs, outputs kept inside the run
    directory."""
    batch = n * spec.lanes
    source = spec.source
    if isinstance(source, SyntheticSource):
        source = source.model_copy(update={"count": min(source.count,
                                                        (batches + _warmup(slot_depth) + _TAIL) * batch)})
    sink = NpyDirSink(kind="npy_dir") if isinstance(spec.sink, NpyDirSink) else spec.sink
    if isinstance(sink, ParquetSink):
        sink = ParquetSink(kind="parquet", row_group_size=sink.row_group_size)
    pinned = _pinned(spec, n, fill_workers, sink_workers, slot_depth)
    # A short ready queue: a drain finishes what was admitted, and that should not be much.
    feeder = pinned.feeder.model_copy(update={"low_watermark": batch, "high_watermark": 3 * batch})
    return pinned.model_copy(update={"backend": backend, "source": source, "sink": sink, "feeder": feeder,
                                     "executor": ExecutorSpec()})


def with_plan(spec: PipelineSpec, plan: Plan) -> PipelineSpec:
    """``spec`` set to run as ``plan`` says: its batch size, ``[host]`` fill and sink threads and slot
    depth, pinned (no tuner moves them, the feeder's depth tuning off)."""
    return _pinned(spec, plan.batch_size, plan.fill_workers, plan.sink_workers, plan.slot_depth)


def _pinned(spec: PipelineSpec, n: int, fill_workers: int, sink_workers: int, slot_depth: int) -> PipelineSpec:
    """``spec`` with batch size ``n`` and these host threads and depth, none of them tuned."""
    host = spec.host.model_copy(update={"fill_workers": fill_workers, "sink_workers": sink_workers,
                                        "max_workers": max(spec.host.max_workers, fill_workers, sink_workers)})
    feeder = spec.feeder.model_copy(update={"auto_depth": False, "max_depth": max(spec.feeder.max_depth, slot_depth)})
    return spec.model_copy(update={"batch_size": n, "slot_depth": slot_depth, "host": host, "feeder": feeder})


async def measure(spec: PipelineSpec, backend: BackendName, n: int, *, fill_workers: int = 1, sink_workers: int = 1,
                  slot_depth: int = _CALIBRATION_DEPTH, batches: int = _MAX_BATCHES, budget_s: float = 3.0,
                  scratch: Path | None = None) -> Measured:
    """Run ``spec`` briefly at batch size ``n`` with these settings and measure it: ``batches``
    past the first ones, or as many as ``budget_s`` allows."""
    cal = calibration_spec(spec, backend, n, fill_workers, sink_workers, slot_depth, batches)
    tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="warpdeck-advise-", dir=scratch))
    try:
        async with Engine(cal, tmp, journal=False) as engine:
            points = await _watch(engine, (batches + _warmup(slot_depth)) * spec.lanes, budget_s)
            slot_bytes = max((lane.slot_bytes for lane in engine.lanes), default=0)
            records = engine.timeline
            device = engine.backend.device_name
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, ignore_errors=True)
    sample = _sample(records, points, cal)
    return Measured(sample, slot_bytes / n, device)


# (batches done, tasks done, perf_counter, process_time)
_Point = tuple[int, int, float, float]


async def _watch(engine: Engine, target: int, budget_s: float) -> list[_Point]:
    """Sample the run until it ends; drain it once it has ``target`` batches or its time is up."""
    points: list[_Point] = []
    waiter = asyncio.ensure_future(engine.wait())
    t0 = time.perf_counter()
    draining = cancelled = False
    try:
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=_POLL_S)
            m = engine.metrics
            now = time.perf_counter()
            points.append((m.batches, m.tasks, now, time.process_time()))
            if done:
                break
            if not draining and (m.batches >= target or now - t0 >= budget_s):
                await engine.command(Drain())
                draining = True
            elif not cancelled and now - t0 >= _HARD_STOP * budget_s:
                await engine.command(Cancel(all=True))
                cancelled = True
    finally:
        if not waiter.done():
            waiter.cancel()
    waiter.result()  # the engine's own failure (a stage that raised on every batch, say) is raised here
    return points


def _sample(records: tuple[BatchRecord, ...], points: list[_Point], spec: PipelineSpec) -> Sample:
    """A run's figures, leaving out its first and last batches where it has enough of them."""
    n = spec.batch_size
    ok = sorted((r for r in records if r.ok and r.tasks == n), key=lambda r: r.batch)
    warmup = _warmup(spec.slot_depth)
    steady = ok[warmup:-_TAIL] if len(ok) > warmup + _TAIL + 1 else ok
    if not steady:
        raise RuntimeError(f"calibration at batch size {n}: no batch finished (see a run of the spec for why)")
    wall = {p: sum(max(0.0, r.phases[i][1] - r.phases[i][0]) for r in steady) / len(steady)
            for i, p in enumerate(PHASES)}
    cpu = {p: sum(r.cpu[i] for r in steady if r.cpu) / len(steady) for i, p in enumerate(PHASES)}
    last = points[-1][0]
    start = next((q for q in points if q[0] >= warmup), points[0])
    end = next((q for q in points if q[0] >= last - _TAIL), points[-1])
    if end[0] - start[0] < _WARMUP + 1:  # too short a run for a window: all of it
        start, end = next((q for q in points if q[0] > 0), points[0]), points[-1]
    batches = max(1, end[0] - start[0])
    span = max(1e-9, end[2] - start[2])
    return Sample(batch_size=n, wall_s=wall, cpu_s=cpu, process_cpu_s=(end[3] - start[3]) / batches,
                  tasks_s=(end[1] - start[1]) / span, batches=len(ok), fill_workers=spec.host.fill_workers or 1,
                  sink_workers=spec.host.sink_workers or 1, slot_depth=spec.slot_depth, lanes=spec.lanes)


def _warmup(slot_depth: int) -> int:
    return max(_WARMUP, slot_depth)


def _batches(budget_s: float, period_s: float | None) -> int:
    """Batches a run of ``budget_s`` can measure at ``period_s`` a batch (unknown: the most);
    the period is the previous run's time per task times this batch size, an overestimate."""
    if period_s is None or period_s <= 0:
        return _MAX_BATCHES
    return max(_MIN_BATCHES, min(_MAX_BATCHES, int(budget_s / period_s) - _WARMUP - _TAIL))


def calibration_sizes(batch_size: int, tasks: int | None = None) -> list[int]:
    """The sizes measured: a quarter of the spec's, the spec's, and twice it; where the source
    has only ``tasks``, none so large that a run would have too few batches to measure."""
    sizes = {max(1, batch_size // 4), batch_size, 2 * batch_size}
    if tasks is not None:
        most = max(1, tasks // (_MIN_BATCHES + _warmup(_CALIBRATION_DEPTH) + _TAIL))
        sizes = {min(n, most) for n in sizes}
    return sorted(sizes)


def _known_tasks(spec: PipelineSpec) -> int | None:
    """Tasks per lane the source holds, where that is known without running user code."""
    if isinstance(spec.source, SyntheticSource):
        return spec.source.count // spec.lanes
    if isinstance(spec.source, NpyDirSource):
        try:
            total = open_source(spec.source).total
        except OSError:  # the engine's own run says what is wrong with the directory
            return None
        return None if total is None else total // spec.lanes
    return None


async def calibrate(spec: PipelineSpec, backend: BackendName, *, cores: float | None = None, budget_s: float = 10.0,
                    scratch: Path | None = None) -> BackendAdvice:
    """Measure ``spec`` on ``backend`` at a few batch sizes, fit its costs, recommend a plan and
    run it once (twice where its extra host threads do not pay off) to anchor the prediction."""
    t0 = time.perf_counter()
    sizes = calibration_sizes(spec.batch_size, _known_tasks(spec))
    per_run = budget_s / (len(sizes) + _CHECKS)
    runs: list[Measured] = []
    for n in sizes:
        batches = _batches(per_run, n / runs[-1].sample.tasks_s if runs and runs[-1].sample.tasks_s > 0 else None)
        runs.append(await measure(spec, backend, n, batches=batches, budget_s=per_run, scratch=scratch))
    samples = tuple(r.sample for r in runs)
    limits = Limits(cores=cores or spec.host.cpu_cores or default_cores(), lanes=spec.lanes,
                    max_workers=spec.host.max_workers,
                    memory_budget_bytes=int(spec.feeder.memory_budget_mb * 2**20))
    model = fit_model(backend, samples, max(r.slot_item_bytes for r in runs), limits.cores)
    plan, candidates = recommend(model, limits, spec.batch_size)
    checks: list[Sample] = []
    notes: list[str] = []
    while True:
        check = (await measure(spec, backend, plan.batch_size, fill_workers=plan.fill_workers,
                               sink_workers=plan.sink_workers, slot_depth=plan.slot_depth,
                               batches=_batches(per_run, plan.batch_size / plan.tasks_s if plan.tasks_s > 0 else None),
                               budget_s=per_run, scratch=scratch)).sample
        checks.append(check)
        threads = plan.fill_workers > 1 or plan.sink_workers > 1
        one = next((s.tasks_s for s in samples if s.batch_size == plan.batch_size),
                   predict(model, limits, plan.batch_size, 1, 1).tasks_s)
        if threads and check.tasks_s < one * _GAIN and len(checks) < _CHECKS:
            notes.append(f"{plan.fill_workers} fill and {plan.sink_workers} sink threads reached "
                         f"{check.tasks_s:,.0f} tasks/s against {one:,.0f} with one each: more host threads "
                         "do not pay off here")
            limits = dataclasses.replace(limits, max_workers=1)
            plan, candidates = recommend(model, limits, spec.batch_size)
            continue
        model = anchor(model, limits, plan, check)
        plan, candidates = recommend(model, limits, spec.batch_size)
        break
    return BackendAdvice(backend=backend, device=runs[0].device, limits=limits, samples=samples, model=model,
                         plan=plan, candidates=candidates, checks=tuple(checks), note="; ".join(notes),
                         calibration_s=time.perf_counter() - t0)


def backends_to_calibrate(spec: PipelineSpec, backend: str | None = None) -> list[BackendName]:
    """A backend named here, else both where CuPy can run, else the spec's (NumPy for ``auto``)."""
    match backend:
        case "numpy" | "cupy":
            return [backend]
    from warpdeck.engine.backends import cupy_backend  # noqa: PLC0415 - keeps CuPy out of the root

    if cupy_backend.cupy_unavailable_reason() is None:
        return ["numpy", "cupy"]
    return ["cupy"] if spec.backend == "cupy" else ["numpy"]  # cupy: its run says why it cannot


async def advise(spec: PipelineSpec, *, backend: str | None = None, cores: float | None = None,
                 budget_s: float = 10.0, scratch: Path | None = None) -> Advice:
    """Calibrate ``spec`` (on both backends where CuPy can run) and recommend how to run it.
    ``budget_s`` is each backend's share of time; ``scratch`` where calibration outputs go."""
    results = [await calibrate(spec, name, cores=cores, budget_s=budget_s, scratch=scratch)
               for name in backends_to_calibrate(spec, backend)]
    return Advice(pipeline=spec.name, batch_size=spec.batch_size, results=tuple(results),
                  gpu_speedup=gpu_speedup(results))
