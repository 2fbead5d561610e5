"""The autotuner (engine/run/autotune.py) against a model of a lane, on a controlled clock.

Each window the model says what a lane with the tuner's settings would measure: a host phase on
w threads delivers w / (its time per batch) batches/s (or less, when CPU- or GIL-bound); compute
runs as often as the slowest host phase lets it. The tuner must converge, stay there, and never
pass its thread cap, its CPU budget or its memory budget.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest

from warpdeck.engine.run.autotune import Autotuner, DepthTuner, LaneSettings, Window
from warpdeck.engine.state.task_states import Phase

MB = 1 << 20
N = 16  # batches per window


@dataclass
class Model:
    fill_s: float
    compute_s: float
    sink_s: float = 0.001
    fill_cpu: float = 0.02  # share of a core one loading thread burns while it runs
    gil_threads: int | None = None  # beyond this many threads, loading gets no faster
    floor: float = 0.0  # the device idles at least this share whatever the settings (engine gaps)
    compute_cpu: float = 0.0  # share of a core compute burns while it runs (NumPy, torch on the CPU)

    def fill_rate(self, w: int, processes: bool = False) -> float:
        # Worker processes each have their own GIL: only threads share one.
        useful = w if self.gil_threads is None or processes else min(w, self.gil_threads)
        return useful / self.fill_s

    def window(self, s: LaneSettings) -> Window:
        """What the lane measures over N batches with settings ``s`` (a controlled clock: no sleep)."""
        rate = min(self.fill_rate(s.fill, s.fill_processes), 1 / self.compute_s, s.sink / self.sink_s)
        span = max(N / rate, N * self.compute_s / (1 - self.floor))
        # A GIL-bound phase's threads wait for each other: each batch takes longer per thread.
        fill_mean = s.fill / self.fill_rate(s.fill, s.fill_processes)
        means = (fill_mean, 0.0005, self.compute_s, 0.0005, self.sink_s)
        cpu = (self.fill_cpu * self.fill_s, 0.0, self.compute_cpu * self.compute_s, 0.0, 0.0)
        busy = tuple(m * N for m in means)
        spans = (span, span, span, span, span)
        return Window(means, cpu, busy, spans)


def _tune(model: Model, tuner: Autotuner, slot_bytes: int = MB, windows: int = 40) -> list[LaneSettings]:
    now = LaneSettings(2, 1, 1)
    seen = [now]
    for _ in range(windows):
        used = now.depth * slot_bytes
        now = tuner.decide(0, now, model.window(now), slot_bytes, used)
        seen.append(now)
    return seen


def _tuner(cores: float = 2.0, max_workers: int = 8, budget_mb: float = 1024, max_depth: int = 16) -> Autotuner:
    return Autotuner(DepthTuner(max_depth, int(budget_mb * MB)), max_workers, cores)


@pytest.mark.parametrize(("fill_s", "compute_s"), [(0.030, 0.010), (0.025, 0.010), (0.012, 0.010), (0.070, 0.010)])
def test_waiting_loads_get_just_enough_threads_and_the_tuner_then_holds_still(fill_s: float, compute_s: float) -> None:
    model = Model(fill_s, compute_s)
    seen = _tune(model, _tuner())
    final = seen[-1]
    # Enough threads to keep up, with at most the tuner's 25 % margin on top.
    assert math.ceil(fill_s / compute_s - 1e-9) <= final.fill <= math.ceil(1.25 * fill_s / compute_s - 1e-9)
    assert final.depth >= final.fill + 2
    assert seen[-10:] == [final] * 10, "the tuner kept changing its mind"
    w = model.window(final)
    assert w.device_idle <= 0.02


def test_a_cpu_bound_load_never_takes_more_cores_than_the_budget() -> None:
    # Decoding burns a whole core per thread and needs 5 threads to keep up: 2 cores allow 2.
    model = Model(0.050, 0.010, fill_cpu=1.0)
    tuner = _tuner(cores=2.0)
    seen = _tune(model, tuner)
    assert max(s.fill for s in seen) == 2
    assert tuner.cores_used() <= 2.0 + 1e-9
    held = tuner.threads([_Lane(seen[-1])])[0][0]
    assert held.why == "cpu" and held.cap == 2


def test_a_core_partly_spare_buys_one_thread_on_trial_where_the_budget_is_the_machine() -> None:
    # Decoding burns a core per thread (120 ms a batch); compute burns one too, 50 ms a batch, so at
    # one fill thread it is busy 42 % and 0.6 of the 2 cores is spare: less than a thread's share,
    # but a core idle while the device waits is wasted. One more thread, kept as it loads faster;
    # then nothing is spare and the budget holds.
    model = Model(0.120, 0.050, fill_cpu=0.96, compute_cpu=0.94)
    tuner = Autotuner(DepthTuner(16, 1 << 40), 8, 2.0, machine_cores=2.0)
    seen = _tune(model, tuner)
    assert seen[-1].fill == 2 and max(s.fill for s in seen) == 2
    assert tuner.threads([_Lane(seen[-1])])[0][0].why == "cpu"
    assert seen[-10:] == [seen[-1]] * 10
    # A budget set below the machine's cores ([host] cpu_cores = 2 on 4) is never passed.
    held = Autotuner(DepthTuner(16, 1 << 40), 8, 2.0, machine_cores=4.0)
    assert {s.fill for s in _tune(model, held)} == {1}


def test_a_jump_that_helps_less_than_its_threads_is_trimmed_to_what_helped() -> None:
    # GIL-bound: threads past the second add nothing. The tuner jumps at once to the 5 threads that
    # would keep up with compute; they load only 2x faster than 1, so it trims to 2 and stays.
    model = Model(0.040, 0.010, gil_threads=2)
    tuner = _tuner()
    seen = _tune(model, tuner)
    assert seen[-1].fill == 2
    assert max(s.fill for s in seen) == 5
    assert sum(1 for a, b in itertools.pairwise(seen) if b.fill > a.fill) == 1
    assert tuner.threads([_Lane(seen[-1])])[0][0].why == "saturated"
    assert any("5 ran only 2x faster than 1" in d.reason for d in tuner.decisions)


def test_threads_that_do_not_help_at_all_are_taken_back_and_not_tried_again() -> None:
    model = Model(0.040, 0.010, gil_threads=1)
    tuner = _tuner()
    seen = _tune(model, tuner)
    assert seen[-1].fill == 1
    assert tuner.threads([_Lane(seen[-1])])[0][0].why == "saturated"
    assert any("did not help" in d.reason for d in tuner.decisions)


def test_the_first_step_reaches_the_threads_compute_needs_in_one_trial() -> None:
    # A load 6x compute that scales: 8 threads keep up (6 x the 1.25 margin), reached in one step,
    # where doubling took three (1, 2, 4, 8) and a trial window each.
    model = Model(0.060, 0.010)
    seen = _tune(model, _tuner(cores=16.0))
    steps = [b.fill for a, b in itertools.pairwise(seen) if b.fill != a.fill]
    assert steps == [8]


def test_the_memory_budget_caps_the_slots_threads_need() -> None:
    # Each slot is 100 MB and the budget 500 MB: at most 5 slots, so at most 3 loading threads.
    model = Model(0.080, 0.010)
    tuner = _tuner(budget_mb=500)
    seen = _tune(model, tuner, slot_bytes=100 * MB)
    assert all(s.depth * 100 <= 500 for s in seen)
    assert seen[-1].fill == 3
    assert tuner.threads([_Lane(seen[-1])])[0][0].why == "memory"


def test_max_workers_and_pins_are_respected() -> None:
    seen = _tune(Model(0.200, 0.010), _tuner(max_workers=4))
    assert max(s.fill for s in seen) == 4
    pinned = Autotuner(DepthTuner(16, 1 << 40), 8, 2.0, pinned=frozenset({Phase.FILL}))
    seen = _tune(Model(0.030, 0.010), pinned)
    assert {s.fill for s in seen} == {1}


def test_a_device_bound_lane_is_left_alone() -> None:
    seen = _tune(Model(0.005, 0.010), _tuner())
    assert seen[-1] == LaneSettings(2, 1, 1)


def test_with_the_depth_set_by_hand_threads_fit_inside_it() -> None:
    tuner = _tuner()
    now = LaneSettings(4, 1, 1)
    model = Model(0.050, 0.010)
    for _ in range(20):
        now = tuner.decide(0, now, model.window(now), MB, now.depth * MB, tune_depth=False)
    assert now == LaneSettings(4, 2, 1)
    assert tuner.threads([_Lane(now)])[0][0].why == "depth"


@dataclass
class _Lane:
    """What ``Autotuner.threads`` reads of a lane."""

    s: LaneSettings
    id: int = 0

    def workers(self, phase: Phase) -> int:
        return self.s.workers(phase)

    @property
    def fill_in_processes(self) -> bool:
        return self.s.fill_processes


def test_a_deeper_ring_that_leaves_the_device_as_idle_is_taken_back_and_not_tried_again() -> None:
    # The device idles 4 % whatever the ring (the engine's own gaps): one deeper ring is tried,
    # judged, taken back; no thread is added either (loading keeps up with margin to spare).
    tuner = _tuner()
    seen = _tune(Model(0.004, 0.010, floor=0.04), tuner)
    assert max(s.depth for s in seen) > 2
    assert seen[-1] == LaneSettings(2, 1, 1)
    assert seen[-10:] == [seen[-1]] * 10
    assert any("did not help" in d.reason for d in tuner.decisions)


def test_phases_that_idle_most_of_the_time_get_no_thread_and_two_slots_once() -> None:
    # A no-op pipeline at batch 1: every phase takes microseconds and the device idles 95 % of the
    # time, waiting for the engine's loop to hand the lane its next batch. The fill is slower than
    # compute (it would get threads), but its one thread ran a tenth of the time: a second would
    # idle too. Two slots more let the loop move more batches per wake-up; one slot per 5 % idle
    # (depth 16 here) would not. The tuner says why, deepens once, and holds still.
    tuner = _tuner()
    model = Model(0.0002, 0.0001, sink_s=0.0001, floor=0.95)
    assert model.window(LaneSettings(2, 1, 1)).device_idle > 0.9
    seen = _tune(model, tuner)
    assert seen[1:] == [LaneSettings(4, 1, 1)] * (len(seen) - 1)
    said = [d.reason for d in tuner.decisions]
    assert said == ["fill threads idle most of the window: the device waits for the engine, not the fill",
                    "depth 4: the phases idle, the loop hands on more per wake-up"], said
    assert tuner.threads([_Lane(seen[-1])])[0][0].why == "idle"
    # Within the memory budget: no room for two more slots, no deeper ring.
    tight = _tuner(budget_mb=2.5)
    assert {s.depth for s in _tune(model, tight)} == {2}
    # The same fill, busy: it idles no more than the device waits on it, and gets its threads.
    busy = _tuner()
    assert _tune(Model(0.0002, 0.0001, sink_s=0.0001), busy)[-1].fill > 1


def test_a_phase_with_no_cpu_measured_still_gets_threads() -> None:
    # A remote (Ray) lane's records carry no CPU times: the phase costs no budget, it is not infinite.
    seen = _tune(Model(0.030, 0.010, fill_cpu=0.0), _tuner())
    assert 3 <= seen[-1].fill <= 4


def test_a_gil_bound_fill_moves_to_processes_where_auto_allows_and_grows_there() -> None:
    # Threads past the first add nothing (one GIL); processes each have their own. With
    # fill_pool = "auto" the tuner tries processes once threads stopped helping, keeps them as they
    # are faster, and then grows them to what compute needs.
    model = Model(0.040, 0.010, gil_threads=1)
    tuner = _tuner(cores=16.0)
    tuner.fill_auto = True
    seen = _tune(model, tuner)
    assert seen[-1].fill_processes and seen[-1].fill == 5
    reasons = [d.reason for d in tuner.decisions]
    assert any("processes on trial" in r for r in reasons) and any("processes kept" in r for r in reasons)
    assert model.window(seen[-1]).device_idle <= 0.02


def _measured(fill_mean: float, fill_share: float, threads: int, compute_s: float = 0.0318) -> Window:
    """A window as the gil-bound benchmark measured it: per-thread fill time and CPU share; compute
    runs as often as the fill lets it."""
    rate = threads / fill_mean
    span = N / rate
    means = (fill_mean, 0.001, compute_s, 0.003, 0.003)
    cpu = (fill_share * fill_mean, 0.0, 0.0001, 0.0, 0.0)
    busy = tuple(m * N for m in means)
    return Window(means, cpu, busy, (span,) * 5)


@pytest.mark.parametrize(("share_on_two", "process_cores", "idle_cores", "to_processes"), [
    (0.45, 1.1, None, True),  # 2 threads burned 0.9 cores where 1 burned 0.73, 0.9 cores of 2 spare: a GIL
    (0.45, 1.1, 0.85, True),  # and the machine says so too
    (0.70, 1.1, None, False),  # 2 threads burned nearly twice the CPU: they ran side by side
    (0.45, 1.9, None, False),  # the process used the machine's cores: they, not a GIL, may hold it
    (0.45, 1.1, 0.2, False),  # another process used the rest of them
])
def test_threads_that_burn_no_more_cpu_than_one_take_turns_on_a_gil_and_go_to_processes(
        share_on_two: float, process_cores: float, idle_cores: float | None, to_processes: bool) -> None:
    # The gil-bound profile (a user's pure-Python load) on 2 cores: 2 threads got 21 % more batches
    # through than 1, enough to keep them, and the tuner went on adding threads to the cap while each
    # held the GIL in turn; a 60-batch run ended before processes were tried.
    tuner = _tuner(cores=2.0)
    tuner.fill_auto = True
    now = tuner.decide(0, LaneSettings(2, 1, 1), _measured(0.0436, 0.73, 1), MB, 2 * MB)
    assert now.fill == 2 and not now.fill_processes
    tuner.process_cores = process_cores
    tuner.idle_cores = idle_cores
    judged = tuner.decide(0, now, _measured(0.0719, share_on_two, 2), MB, now.depth * MB)
    assert judged.fill_processes is to_processes
    if to_processes:
        assert judged.fill == 2
        assert any("share a GIL" in d.reason for d in tuner.decisions)


def test_processes_that_do_not_help_go_back_to_threads_for_good() -> None:
    # CPU-bound on 1 core: neither threads nor processes help.
    model = Model(0.040, 0.010, gil_threads=1)
    model_cpu = Model(0.040, 0.010, gil_threads=1, fill_cpu=1.0)
    tuner = _tuner(cores=16.0)
    tuner.fill_auto = True
    now = LaneSettings(2, 1, 1)
    for _ in range(40):
        w = (model_cpu if now.fill_processes else model).window(now)
        if now.fill_processes:  # as slow in processes as on threads: the cores, not the GIL, hold it
            w = model.window(LaneSettings(now.depth, now.fill, now.sink))
        now = tuner.decide(0, now, w, MB, now.depth * MB)
    assert not now.fill_processes and now.fill == 1
    assert any("back on 1 threads" in d.reason for d in tuner.decisions)



def test_the_first_window_is_judged_after_three_slow_batches_or_five_fast_ones() -> None:
    # A short run of slow batches (16 batches of images at 150 ms) must not spend half of itself on
    # one thread before the first decision; two fast batches of a jittery load say too little.
    tuner = _tuner()
    assert not tuner.window_ready(0, 2, 1.0)  # the warm-up batch and one more: never
    assert tuner.window_ready(0, 3, 0.45)  # three slow batches span a trial's length
    assert not tuner.window_ready(0, 3, 0.04)  # three fast ones do not
    assert not tuner.window_ready(0, 4, 0.05)
    assert tuner.window_ready(0, 5, 0.12)  # five fast ones over the shortest window
    assert tuner.records_needed(0) == 2  # of which the warm-up batch is left out
    tuner.decide(0, LaneSettings(2, 1, 1), Model(0.030, 0.010).window(LaneSettings(2, 1, 1)), MB, 2 * MB)
    assert tuner.records_needed(0) == 4  # later windows are the tuner's own
    assert tuner.window_ready(0, tuner.window, 10.0)


@pytest.mark.parametrize(("cores", "max_workers", "lanes", "depth", "first"), [
    (2.0, 8, 1, None, 2),  # one per core
    (16.0, 8, 1, None, 8),  # within max_workers
    (16.0, 8, 4, None, 4),  # the cores shared by the lanes
    (2.0, 8, 4, None, 1),  # never none
    (1.5, 8, 1, None, 1),  # a budget of part of a core: whole threads only
    (16.0, 8, 1, 4, 2),  # a depth set by hand: a slot per thread and two more
    (16.0, 8, 1, 2, 1),
])
def test_the_fill_starts_with_a_thread_per_core(cores: float, max_workers: int, lanes: int, depth: int | None,
                                                first: int) -> None:
    # Every slot of a new ring needs filling before the device starts: a decoder that started on one
    # thread waited for the tuner's first window (16 batches of images ran 0.1-0.15 s longer).
    assert _tuner(cores=cores, max_workers=max_workers).first_fill(lanes, depth) == first


def test_a_gil_bound_fill_started_on_a_thread_per_core_goes_to_processes_at_once() -> None:
    # Two threads from the start burn one core between them while the other is spare: with no count
    # of one thread to compare with, a single thread is taken to burn a core at most.
    model = Model(0.040, 0.010, gil_threads=1, fill_cpu=1.0)
    tuner = _tuner(cores=2.0)
    tuner.fill_auto = True
    tuner.idle_cores = 0.95  # the machine left the other core idle
    start = LaneSettings(4, tuner.first_fill(1), 1)
    first = tuner.decide(0, start, model.window(start), MB, 4 * MB)
    assert first.fill_processes and first.fill == 2
    reasons = [d.reason for d in tuner.decisions]
    assert reasons[:2] == ["fill threads share a GIL: 2 burned 1.00 cores",
                           "fill in 2 processes on trial: its threads take turns on one GIL"]
    kept = tuner.decide(0, first, model.window(first), MB, 4 * MB)
    assert kept.fill_processes and "processes kept" in tuner.decisions[-1].reason


@pytest.mark.parametrize(("fill_cpu", "process_cores", "idle_cores", "why"), [
    (1.9, 0.0, None, "two threads burned nearly two cores: they ran side by side (a decoder that lets the GIL go)"),
    (1.0, 1.9, None, "the process kept both cores busy: the cores, not a GIL, may hold the fill"),
    (0.4, 0.0, None, "the threads mostly wait (I/O): more threads, not processes"),
    (1.0, 0.0, 0.1, "another process kept the other core busy (a CI job beside image decoding): no core was spare"),
])
def test_a_fill_started_wide_that_is_not_gil_bound_stays_on_threads(fill_cpu: float, process_cores: float,
                                                                    idle_cores: float | None, why: str) -> None:
    model = Model(0.040, 0.010, gil_threads=1, fill_cpu=fill_cpu)
    tuner = _tuner(cores=2.0)
    tuner.fill_auto = True
    tuner.process_cores = process_cores
    tuner.idle_cores = idle_cores
    start = LaneSettings(4, 2, 1)
    after = tuner.decide(0, start, model.window(start), MB, 4 * MB)
    assert not after.fill_processes, why
    assert not any("GIL" in d.reason for d in tuner.decisions), why


def test_a_gil_bound_fill_goes_to_processes_even_where_compute_looks_busy() -> None:
    # Compute waits for the GIL the fill's threads hold, and its wall time then reads as the
    # device's: the gil-bound profile's 10 ms compute measured 29 ms, the device "busy 93 %", and
    # the first window grew the ring instead.
    tuner = _tuner(cores=2.0)
    tuner.fill_auto = True
    tuner.idle_cores = 0.97
    fill_mean, compute = 0.060, 0.030
    rate = 2 / fill_mean
    span = N / rate
    means = (fill_mean, 0.001, compute, 0.001, 0.003)
    w = Window(means, (0.5 * fill_mean, 0.0, 0.0, 0.0, 0.0), tuple(m * N for m in means), (span,) * 5)
    assert w.device_idle < 0.02  # compute looks always busy
    after = tuner.decide(0, LaneSettings(4, 2, 1), w, MB, 4 * MB)
    assert after.fill_processes and after.fill == 2
