"""Device busy, the bound and the bottleneck (engine/state/metrics.py), from batch records.

Records are made by hand here because the property under test is arithmetic: whatever the
phases did, the bound is never below the steady rate (so overlap efficiency never exceeds 1),
and device busy is the union of compute intervals. Real runs check the same on every report
(tests/conftest.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from warpdeck.engine.api import BatchRecord, HostThreads, StallReason, more_lanes_words
from warpdeck.engine.state.metrics import MetricsAccumulator

_NONE = (0.0, 0.0)


def _rec(batch: int, lane: int, fill: tuple[float, float], compute: tuple[float, float],
         sink: tuple[float, float], cpu: tuple[float, ...] = (), tasks: int = 4) -> BatchRecord:
    phases = (fill, _NONE, compute, _NONE, sink)
    return BatchRecord(batch, lane, 0, tasks, "k", fill[0], phases, True, tasks * 8, cpu)


def _pipeline(n: int, fill_s: float, threads: int, compute_s: float, rng: np.random.Generator,
              lane: int = 0, burn: bool = False) -> list[BatchRecord]:
    """Records of a lane whose fill runs on ``threads`` threads and whose compute runs in order."""
    free = [0.0] * threads
    c_end = 0.0
    out = []
    for i in range(n):
        k = int(np.argmin(free))
        f0 = free[k]
        f1 = f0 + fill_s * float(rng.uniform(0.5, 1.5))
        free[k] = f1
        c0 = max(f1, c_end)
        c_end = c0 + compute_s
        cpu = (f1 - f0 if burn else 0.0, 0.0, compute_s * 0.01, 0.0, 0.0)
        out.append(_rec(i, lane, (1 + f0, 1 + f1), (1 + c0, 1 + c_end), (1 + c_end, 1 + c_end + 1e-4), cpu))
    return out


def _figures(acc: MetricsAccumulator, threads: dict[int, tuple[HostThreads, HostThreads]], cores: float = 2.0):  # type: ignore[no-untyped-def]
    return acc.figures(now=1e3, started=0.0, done=acc.tasks, failed=0, divergence=0, max_divergence=0,
                       threads=threads, cores=cores, finished=True)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("threads", "why"), [(1, "pinned"), (3, "tuned"), (3, "saturated"), (2, "cpu")])
def test_the_bound_is_never_below_the_steady_rate(seed: int, threads: int, why: str) -> None:
    rng = np.random.default_rng(seed)
    acc = MetricsAccumulator(lanes=1)
    for r in _pipeline(60, 0.030, threads, 0.010, rng, burn=why == "cpu"):
        acc.add(r)
    ht = HostThreads(threads, 8 if why == "tuned" else threads, why)  # type: ignore[arg-type]
    f = _figures(acc, {0: (ht, HostThreads(1, 1, "pinned"))})
    assert f.bound_tasks_s >= f.steady_tasks_s * (1 - 1e-9)
    assert 0 < f.overlap_efficiency <= 1.0
    assert f.bottleneck_phase in (("fill",) if threads < 3 else ("fill", "compute"))


def test_device_busy_is_the_union_of_the_lanes_compute() -> None:
    acc = MetricsAccumulator(lanes=2)
    # Lane 0 computes 1.0-1.5 and 2.0-2.5; lane 1 computes 1.25-1.75: union 1.25 s of 1.5 s.
    acc.add(_rec(0, 0, (0.9, 1.0), (1.0, 1.5), (1.5, 1.6)))
    acc.add(_rec(1, 1, (1.2, 1.25), (1.25, 1.75), (1.75, 1.8)))
    acc.add(_rec(2, 0, (1.9, 2.0), (2.0, 2.5), (2.5, 2.6)))
    f = _figures(acc, {})
    assert f.device_busy == pytest.approx(1.25 / 1.5)
    assert f.device_busy_by_lane == {"0": pytest.approx(1.0 / 1.5), "1": pytest.approx(1.0)}


def test_a_loading_bound_lane_names_its_loader_and_what_to_do() -> None:
    acc = MetricsAccumulator(lanes=1)
    for r in _pipeline(40, 0.030, 1, 0.010, np.random.default_rng(1)):
        acc.add(r)
    f = _figures(acc, {0: (HostThreads(1, 1, "pinned"), HostThreads(1, 1, "pinned"))})
    assert f.bottleneck_phase == "fill"
    assert f.bottleneck.startswith("bottleneck: fill ") and "on 1 thread" in f.bottleneck
    assert "pinned at 1" in f.bottleneck
    assert f.device_busy < 0.5
    tuned = _figures(acc, {0: (HostThreads(1, 8, "tuned"), HostThreads(1, 1, "pinned"))})
    assert tuned.overlap_efficiency < 0.5  # 8 threads could load far faster: the bound says so
    assert "the tuner is adding fill threads" in tuned.bottleneck


def test_a_burning_loader_is_judged_against_the_cores() -> None:
    acc = MetricsAccumulator(lanes=1)
    for r in _pipeline(40, 0.030, 2, 0.010, np.random.default_rng(2), burn=True):
        acc.add(r)
    on_two = _figures(acc, {0: (HostThreads(2, 2, "cpu"), HostThreads(1, 1, "pinned"))}, cores=2.0)
    on_eight = _figures(acc, {0: (HostThreads(2, 2, "cpu"), HostThreads(1, 1, "pinned"))}, cores=8.0)
    assert on_eight.bound_tasks_s > on_two.bound_tasks_s
    assert "at its cap (2 cores)" in on_two.bottleneck


def test_a_run_too_short_for_a_steady_window_is_judged_over_every_batch() -> None:
    # A full batch, then a short last one, on a machine that starts fast: 300 tasks over 31 ms. The
    # window (the batches after the first) holds only the short batch's 44 tasks per 10 ms compute,
    # a bound far below the run's rate; seen on a 16-core card's host as an efficiency of 2.28.
    acc = MetricsAccumulator(lanes=1)
    acc.add(_rec(0, 0, (1.000, 1.001), (1.001, 1.011), (1.011, 1.0111), tasks=256))
    acc.add(_rec(1, 0, (1.001, 1.002), (1.011, 1.021), (1.021, 1.0211), tasks=44))
    f = acc.figures(now=1.0212, started=0.990, done=300, failed=0, divergence=0, max_divergence=0, finished=True)
    assert f.bound_tasks_s >= f.steady_tasks_s
    assert 0 < f.overlap_efficiency <= 1.0


@pytest.mark.parametrize("threads", [1, 3])
def test_occupancy_is_a_share_of_each_phases_threads_never_above_all_of_them(threads: int) -> None:
    # Fill on ``threads`` threads, always busy (the compute keeps up): each thread's share is near
    # 100%, and so is the phase's, on one thread or three (issue 29: ``sink 117%`` on one thread).
    rng = np.random.default_rng(3)
    records = sorted(_pipeline(120, 0.030, threads, 0.004, rng), key=lambda r: r.end)
    acc = MetricsAccumulator(lanes=1)
    ht = {0: (HostThreads(threads, threads, "pinned"), HostThreads(1, 1, "pinned"))}
    t, i = 1.0, 0
    while i < len(records):  # readings every 0.1 s, each after the records that ended by then
        t += 0.1
        while i < len(records) and records[i].end <= t:
            acc.add(records[i])
            i += 1
        f = acc.figures(now=t, started=1.0, done=acc.tasks, failed=0, divergence=0, max_divergence=0,
                        threads=ht, cores=8.0)
        assert all(v <= 1.0 + 1e-6 for v in f.occupancy[0].values()), f.occupancy
    assert f.occupancy[0]["fill"] > 0.8
    assert f.occupancy[0]["compute"] < 0.5


def test_a_device_busy_nearly_all_the_time_is_the_bottleneck_whatever_the_host_threads_say() -> None:
    # Fills ran on three threads; the tuner has since cut them to one, so the fill's capacity
    # "now" reads lower than the compute's. The device is busy ~98%: it, not the fill, is the bound
    # (issue 29: ``device busy 98% · fill-bound``).
    rng = np.random.default_rng(5)
    acc = MetricsAccumulator(lanes=1)
    for r in _pipeline(80, 0.030, 3, 0.0101, rng):
        acc.add(r)
    f = _figures(acc, {0: (HostThreads(1, 1, "pinned"), HostThreads(1, 1, "pinned"))})
    assert f.device_busy >= 0.9
    assert f.bottleneck_phase == "compute" and "the device is the bound" in f.bottleneck


def test_more_lanes_offer_nothing_the_busy_cores_cannot_give() -> None:
    # Fill burns the CPU on both cores: Amdahl's law alone (no serial work) says more lanes would
    # be limitless (issue 29: ``∞ → x33.76`` on a busy 2-core run); the cores say no gain.
    rng = np.random.default_rng(6)
    acc = MetricsAccumulator(lanes=2)
    for r in _pipeline(80, 0.030, 2, 0.002, rng, burn=True):
        acc.add(r)
    f = _figures(acc, {0: (HostThreads(2, 2, "cpu"), HostThreads(1, 1, "pinned"))}, cores=2.0)
    assert f.lanes_limit == "cores"
    assert max(f.amdahl.values()) < 1.2, f.amdahl
    words = more_lanes_words(f.amdahl, f.lanes_limit)
    assert words.endswith("(the cores are busy)"), words
    # On eight cores the same run has room: more lanes may help, up to what the cores leave.
    roomy = _figures(acc, {0: (HostThreads(2, 2, "cpu"), HostThreads(1, 1, "pinned"))}, cores=8.0)
    assert max(roomy.amdahl.values()) > 3.0


def test_the_rate_is_never_above_its_bound() -> None:
    # Process CPU time that overstates the work (other threads' time counted): the cores' cap
    # would put the bound below what the run did.
    rng = np.random.default_rng(8)
    acc = MetricsAccumulator(lanes=1)
    for r in _pipeline(60, 0.010, 1, 0.002, rng):
        acc.add(dataclasses.replace(r, cpu=(0.5, 0.0, 0.0, 0.0, 0.0)))
    f = _figures(acc, {0: (HostThreads(1, 1, "pinned"), HostThreads(1, 1, "pinned"))}, cores=1.0)
    assert f.bound_tasks_s >= f.steady_tasks_s > 0
    assert f.overlap_efficiency <= 1.0


@pytest.mark.parametrize("phase", ["fill", "sink"])
def test_a_gil_bound_host_phase_is_offered_processes_and_one_in_processes_says_so(phase: str) -> None:
    from warpdeck.engine.state.bottleneck import describe_bottleneck

    other = "sink" if phase == "fill" else "fill"
    on_threads = describe_bottleneck(phase, 40.0, HostThreads(3, 3, "saturated"), 0.4, 2.0)
    assert "on 3 threads" in on_threads and f'{phase}_pool = "processes"' in on_threads
    assert f"{other}_pool" not in on_threads
    in_processes = describe_bottleneck(phase, 40.0, HostThreads(2, 2, "saturated", processes=True), 0.4, 2.0)
    assert "on 2 processes" in in_processes and "_pool" not in in_processes
    tuned = describe_bottleneck(phase, 40.0, HostThreads(2, 8, "tuned"), 0.4, 2.0)
    assert "_pool" not in tuned  # threads still being added: too early to say


def _gappy(acc: MetricsAccumulator, n: int = 60) -> None:
    """Compute (10 ms) is the slowest phase, yet runs only every 20 ms: the device busy half the time."""
    for i in range(n):
        t = 1.0 + 0.02 * i
        acc.add(_rec(i, 0, (t, t + 0.005), (t + 0.005, t + 0.015), (t + 0.015, t + 0.0151)))


@pytest.mark.parametrize(("stall", "seconds", "words"), [
    ("memory", 0.5, "it waited 0.5 s for inputs"),
    ("backpressure", 0.4, "it waited 0.4 s for the sink to free an output slot"),
    (None, 0.0, "the gaps between batches are the engine's own"),
])
def test_a_device_busy_under_90_percent_is_never_called_the_bound(stall: str | None, seconds: float,
                                                                   words: str) -> None:
    # Issue 31, item 7: a run kept the device 67-71 % busy and said "the device is the bound".
    acc = MetricsAccumulator(lanes=1)
    _gappy(acc)
    if stall is not None:
        acc.add_stall(StallReason[stall.upper()], seconds)
    f = _figures(acc, {0: (HostThreads(1, 1, "pinned"), HostThreads(1, 1, "pinned"))})
    assert f.device_busy < 0.9 and f.bottleneck_phase == "compute"
    assert "the device is the bound" not in f.bottleneck
    assert "under 90%" in f.bottleneck and words in f.bottleneck, f.bottleneck


@pytest.mark.parametrize(("waited_s", "words"), [
    (0.0, "the gaps between batches are the engine's own"),
    (0.5, "the lanes waited 0.5 s for batches: the source or the feeder"),
])
def test_phases_that_idle_most_of_the_time_are_not_called_the_bottleneck(waited_s: float, words: str) -> None:
    # A no-op run at batch 1 was told "sink 0.009 ms/batch on 2 threads ...: add cores or a faster
    # sink" with its sink busy 2 % of the time: every phase takes microseconds and a batch comes
    # each millisecond. The line names what hands the phases work instead.
    acc = MetricsAccumulator(lanes=1)
    for i in range(100):
        t = 1.0 + 0.001 * i
        acc.add(_rec(i, 0, (t, t + 2e-5), (t + 3e-5, t + 4e-5), (t + 5e-5, t + 8e-5), cpu=(2e-5, 0, 1e-5, 0, 3e-5)))
    if waited_s:
        acc.add_stall(StallReason.MEMORY, waited_s)
    f = acc.figures(now=1.1, started=0.0, done=acc.tasks, failed=0, divergence=0, max_divergence=0,
                    threads={0: (HostThreads(1, 8, "tuned"), HostThreads(1, 8, "tuned"))}, cores=2.0, finished=True)
    assert f.bottleneck_phase == "engine", f.bottleneck
    head = "bottleneck: none of the phases (the busiest, sink, ran 3% of the time)"
    assert f.bottleneck.startswith(head), f.bottleneck
    assert words in f.bottleneck, f.bottleneck
    assert "add cores" not in f.bottleneck and "the device is the bound" not in f.bottleneck


def test_a_run_too_short_for_a_steady_window_blames_no_engine() -> None:
    # Two batches: the rate is every task over the elapsed time, the run's start in it. That the
    # phases idled then says nothing about the loop.
    acc = MetricsAccumulator(lanes=1)
    for i in range(2):
        t = 1.0 + 0.001 * i
        acc.add(_rec(i, 0, (t, t + 2e-5), (t + 3e-5, t + 4e-5), (t + 5e-5, t + 8e-5), cpu=(2e-5, 0, 1e-5, 0, 3e-5)))
    f = acc.figures(now=1.1, started=0.0, done=acc.tasks, failed=0, divergence=0, max_divergence=0,
                    threads={0: (HostThreads(1, 8, "tuned"), HostThreads(1, 8, "tuned"))}, cores=2.0, finished=True)
    assert f.bottleneck_phase != "engine", f.bottleneck
