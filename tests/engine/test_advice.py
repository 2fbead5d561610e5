"""The advice model (engine/state/advice.py): fitting t = a + b·n, and the plan it recommends."""

from __future__ import annotations

import math

import pytest

from warpdeck.engine.state.advice import (
    PHASES,
    CostModel,
    Limits,
    Line,
    PhaseFit,
    Sample,
    anchor,
    candidate_sizes,
    fit_line,
    fit_model,
    plan_for,
    predict,
    recommend,
)

SIZES = (16, 64, 128)


def _model(wall: dict[str, Line], cpu_share: dict[str, float] | None = None, process: Line | None = None,
           item_bytes: float = 1024.0) -> CostModel:
    """A model with these wall lines (phases not named cost nothing) and CPU = share x wall."""
    share = cpu_share or {}
    fits = []
    for p in PHASES:
        w = wall.get(p, Line(0.0, 0.0))
        s = share.get(p, 0.0)
        fits.append(PhaseFit(p, w, Line(w.a * s, w.b * s)))
    cpu = process or Line(sum(f.cpu.a for f in fits), sum(f.cpu.b for f in fits))
    return CostModel("numpy", tuple(fits), cpu, item_bytes)


def _samples(wall: dict[str, Line], cpu: dict[str, Line], rate_share: float = 1.0) -> list[Sample]:
    """What calibration would measure at SIZES for a pipeline with exactly these costs (one thread
    each), its rate ``rate_share`` of the tightest phase's."""
    out = []
    for n in SIZES:
        w = {p: wall[p].at(n) for p in PHASES}
        c = {p: cpu[p].at(n) for p in PHASES}
        out.append(Sample(batch_size=n, wall_s=w, cpu_s=c, process_cpu_s=sum(c.values()) * 1.1,
                          tasks_s=rate_share * n / max(w.values()), batches=20))
    return out


def test_fit_line_recovers_fixed_and_per_item_cost() -> None:
    line = fit_line([(n, 0.004 + 0.0002 * n) for n in SIZES])
    assert line.a == pytest.approx(0.004)
    assert line.b == pytest.approx(0.0002)


def test_fit_line_never_goes_negative() -> None:
    falling = fit_line([(16, 0.010), (64, 0.009), (128, 0.008)])  # noise: cheaper per batch when larger
    assert falling.b == 0 and falling.a > 0
    below_zero = fit_line([(16, 0.0001), (64, 0.010), (128, 0.030)])  # the line would cross below zero
    assert below_zero.a == 0 and below_zero.b > 0
    one_size = fit_line([(64, 0.0064)])
    assert one_size == Line(0.0, pytest.approx(0.0001))


def test_fit_model_recovers_every_phase_from_calibration_samples() -> None:
    wall = {"fill": Line(0.002, 0.00030), "h2d": Line(0.0001, 0.00001), "compute": Line(0.001, 0.00020),
            "d2h": Line(0.0001, 0.00001), "sink": Line(0.003, 0.00050)}
    cpu = {p: Line(w.a / 2, w.b / 4) for p, w in wall.items()}
    model = fit_model("numpy", _samples(wall, cpu), 2048.0)
    for f in model.phases:
        assert f.wall.a == pytest.approx(wall[f.phase].a) and f.wall.b == pytest.approx(wall[f.phase].b)
        assert f.cpu.a == pytest.approx(cpu[f.phase].a) and f.cpu.b == pytest.approx(cpu[f.phase].b)
    assert model.efficiency == pytest.approx(1.0)


def test_efficiency_is_the_share_of_the_bound_calibration_reached() -> None:
    wall = {p: Line(0.001, 0.0001) for p in PHASES}
    cpu = {p: Line(0.0, 0.0) for p in PHASES}
    model = fit_model("numpy", _samples(wall, cpu, rate_share=0.8), 1.0)
    assert model.efficiency == pytest.approx(0.8)
    plan = predict(model, Limits(cores=8), 64, 1, 1)
    assert plan.tasks_s == pytest.approx(0.8 * 64 / wall["fill"].at(64))


def test_io_bound_host_phases_get_threads_to_keep_pace_with_compute() -> None:
    # Fill waits (no CPU) 3.5x as long as compute, sink 2x: ceil(3.5) = 4 and 2 threads.
    compute = Line(0.0, 0.0001)
    model = _model({"fill": Line(0.0, 0.00035), "compute": compute, "sink": Line(0.0, 0.0002)},
                   cpu_share={"compute": 1.0})
    plan = plan_for(model, Limits(cores=16), 64)
    assert (plan.fill_workers, plan.sink_workers) == (math.ceil(3.5), 2)
    assert plan.slot_depth == 4 + 2
    assert plan.bottleneck == "compute"
    assert plan.device_busy == pytest.approx(1.0)
    assert plan.tasks_s == pytest.approx(64 / compute.at(64))


def test_max_workers_caps_the_threads() -> None:
    model = _model({"fill": Line(0.0, 0.001), "compute": Line(0.0, 0.0001)})
    plan = plan_for(model, Limits(cores=64, max_workers=4), 64)
    assert plan.fill_workers == 4 and plan.bottleneck == "fill"
    assert plan.device_busy == pytest.approx(0.4)


def test_cpu_bound_keeps_threads_that_cannot_run_away() -> None:
    # Fill burns a whole core for 4x compute's time: with 2 cores, more than 2 threads cannot help.
    model = _model({"fill": Line(0.0, 0.0004), "compute": Line(0.0, 0.0001)},
                   cpu_share={"fill": 1.0, "compute": 1.0})
    plan = plan_for(model, Limits(cores=2), 64)
    cpu_bound = 2 / model.cpu_total(64) * 64
    assert plan.fill_workers == 2
    assert plan.bottleneck == "cpu"
    assert plan.tasks_s == pytest.approx(cpu_bound)
    assert plan.tasks_s <= predict(model, Limits(cores=2), 64, 4, 1).tasks_s + 1e-9  # 4 would be no faster


def test_the_cpu_bound_is_shared_by_the_lanes() -> None:
    model = _model({"fill": Line(0.0, 0.0001), "compute": Line(0.0, 0.0001)}, cpu_share={"fill": 1.0, "compute": 1.0})
    one = predict(model, Limits(cores=2, lanes=1), 64, 1, 1)
    four = predict(model, Limits(cores=2, lanes=4), 64, 1, 1)
    assert one.bottleneck == "fill" and four.bottleneck == "cpu"
    assert four.tasks_s == pytest.approx(2 / model.cpu_total(64) * 64)


def test_candidate_sizes_are_the_specs_and_powers_of_two_around_it() -> None:
    assert candidate_sizes(256) == [64, 128, 256, 512, 1024]
    assert candidate_sizes(100) == [32, 64, 100, 128, 256]
    assert candidate_sizes(1) == [1, 2, 4]


def test_recommend_prefers_the_smaller_batch_within_five_percent() -> None:
    # A fixed 1 ms per batch in front of 0.1 ms per task: each doubling gains less.
    model = _model({"compute": Line(0.001, 0.0001)}, cpu_share={"compute": 1.0})
    plan, plans = recommend(model, Limits(cores=8), 64)
    best = max(p.tasks_s for p in plans)
    assert plan.tasks_s >= 0.95 * best
    assert all(p.tasks_s < 0.95 * best for p in plans if p.batch_size < plan.batch_size)
    assert plan.batch_size < max(p.batch_size for p in plans)


def test_recommend_stays_within_the_memory_budget() -> None:
    model = _model({"compute": Line(0.001, 0.0001)}, item_bytes=1 << 20)  # 1 MiB a task
    plan, plans = recommend(model, Limits(cores=8, memory_budget_bytes=200 << 20), 64)
    assert plan.memory_bytes <= 200 << 20
    assert plan.batch_size == 64  # 3 slots x 64 tasks: 192 MiB; the larger sizes do not fit
    assert max(p.tasks_s for p in plans) > plan.tasks_s


def test_calibration_sizes_fit_the_source() -> None:
    from warpdeck.engine.calibrate import calibration_sizes

    assert calibration_sizes(256) == [64, 256, 512]
    assert calibration_sizes(1) == [1, 2]
    assert calibration_sizes(64, tasks=400) == [16, 40]  # 10 batches of 40 at most


def _run_of(plan_n: int, sink_s: float, workers: int) -> Sample:
    """A run of the plan whose sink took ``sink_s`` a batch on ``workers`` threads."""
    wall = dict.fromkeys(PHASES, 0.001) | {"sink": sink_s}
    return Sample(batch_size=plan_n, wall_s=wall, cpu_s=dict.fromkeys(PHASES, 0.0), process_cpu_s=0.0,
                  tasks_s=0.0, batches=10, sink_workers=workers)


def test_a_run_of_the_plan_lowers_its_prediction_to_what_it_showed() -> None:
    # The lines say 4 sink threads keep pace; the run shows each thread twice as slow (contention).
    model = _model({"compute": Line(0.0, 0.0001), "sink": Line(0.0, 0.0004)})
    limits = Limits(cores=16)
    plan = plan_for(model, limits, 64)
    assert plan.sink_workers == 4
    slower = anchor(model, limits, plan, _run_of(64, 2 * model.wall("sink", 64), plan.sink_workers))
    again = plan_for(slower, limits, 64)
    assert again.tasks_s == pytest.approx(plan.tasks_s / 2)
    assert (again.batch_size, again.sink_workers) == (plan.batch_size, plan.sink_workers)


def test_a_run_faster_than_the_lines_does_not_raise_the_prediction() -> None:
    model = _model({"compute": Line(0.0, 0.0001), "sink": Line(0.0, 0.0004)})
    limits = Limits(cores=16)
    plan = plan_for(model, limits, 64)
    faster = anchor(model, limits, plan, _run_of(64, model.wall("sink", 64) / 3, plan.sink_workers))
    assert plan_for(faster, limits, 64).tasks_s == pytest.approx(plan.tasks_s)
