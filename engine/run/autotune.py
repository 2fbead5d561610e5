"""The autotuner: each lane's fill and sink threads and its slot depth, set from what the device waits for.

The decisions this module protects:
- The goal is the device's busy time. Each window of a lane's batches, the tuner measures how
  long compute sat idle; below ``idle_threshold`` it changes nothing.
- When the device idles, the host phase slowest per thread (its mean time over its threads) gets
  threads while they get through fewer than 1.25x compute's batches per second (a heavy-tailed
  load whose mean equals compute's needs a second thread to get ahead of its tail): as many as
  would: the first time a phase grows, all of them at once (a run converges in one trial); later,
  at most twice as many as it has; within the CPU budget. A thread of a phase that burns
  CPU (decoding) costs a core, one that waits (I/O, sleep) almost none, measured as its CPU time
  over its wall time; since that undercounts a thread waiting for a core or the GIL, a burning
  phase also needs the whole process to have cores spare. Less than a thread's share spare still
  buys one thread on trial where the budget is the whole machine (a core idle while the device
  waits is wasted); a budget set below the machine's cores (``[host] cpu_cores``) is never passed.
  The ring grows so every thread has a slot (depth >= threads + 2), within the memory budget.
  A phase whose threads ran less than half of the window gets none: the device waits for what
  hands the lane work (the engine's loop), and another thread would idle too.
  Otherwise the device waits for jitter, which a deeper ring absorbs (``DepthTuner``), or for the
  engine itself: there the ring gets two slots more, once (more batches in flight, more moved per
  wake-up of the loop).
- The fill starts on one thread per core of the CPU budget, shared by the lanes (``first_fill``):
  a new ring's every slot needs filling before the device starts. Each needs a slot the memory
  budget holds (``first_fill_fits``, asked at the first batch). Threads that then burn together
  hardly more than one core while cores are spare (this process's count, and the machine's idle
  cores: another process's load is no GIL, ``idle_cores.py``) take turns on one GIL; under
  ``fill_pool = "auto"`` they go to processes on trial at once (``_gil_from_the_start``).
- Every change is on trial for one window of at least 0.3 s: threads stay if the phase got at
  least 10 % faster (a jump that sped it up far less than its threads is trimmed to the threads
  that gain needs, and the phase grows no more), a deeper ring if the device idles at least 20 %
  less; else the change is taken back and not tried again on that lane (threads of a CPU- or
  GIL-bound phase wait for each other, and their CPU time alone looks like waiting). A count the
  spec pins is never changed.
- Pure arithmetic on measurements (``Window``): the dispatcher measures, this module decides, so
  the tests drive it with a model of a pipeline and a controlled clock.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.run.lane_protocols import LaneLike
from warpdeck.engine.state.bottleneck import HostThreads, ThreadCap
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.task_states import RUN_PHASES, Phase

__all__ = ["Autotuner", "DepthTuner", "LaneSettings", "TunerDecision", "Window", "default_cores", "measure_window"]

_COMPUTE = Phase.COMPUTE - 1
_HOST = (Phase.FILL, Phase.SINK)
_MARGIN = 1.25
"""A host phase gets threads until they get through this many times compute's batches per second."""
_TRIAL_GAIN = 1.1
"""Threads on trial stay if the phase then gets through at least this much more per second."""
_SCALING = 0.8
"""A jump of threads that sped the phase up by less than this share of its threads is trimmed."""
_DEPTH_GAIN = 0.8
"""A deeper ring stays if the device then idles at most this share of what it idled before."""
_WINDOW_S = 0.1
"""A window spans at least this long; one that judges a trial, this long."""
_TRIAL_S = 0.3
_LOOP_STEP = 2
"""Slots a ring whose phases idle gets, once: at batch 1 and 256, depth 4 ran 1.15-1.2x depth 2, 6 no faster."""
_FIRST_WINDOW = 5
"""Batches of a lane's first window: its first (warm-up: a model built, modules imported) is left out, the other four
measured; or, once its batches span a trial's length (slow batches), the other two (``_FIRST_SHORT``): a short run is
over before a longer window is (issue 31: 16 batches of images, most of them on one thread while the first window
filled), and two fast batches of a jittery load say too little (a run misjudged so went from 0.91 to 0.83 busy)."""
_FIRST_SHORT = 3
_MIN_RECORDS = 4
"""Fewer successful batches than this in a later window say nothing about the bottleneck's idle time."""
_BURNS = 0.3
"""A thread using at least this share of a core burns CPU: it needs a core the process has spare."""
_GIL_GROWTH = 0.4
"""Threads whose CPU grew by less than this share of their number's growth take turns on one GIL."""
_SPARE_FOR_GIL = 0.5
"""Cores the process must have spare for a fill's slow scaling to be put down to the GIL."""
_MOSTLY = 0.5
"""Host threads running at least this share of the window count as always running."""
_SPARE_MIN = 0.1
"""Spare cores below a whole thread's share still buy one thread on trial, when the budget is the whole machine and at
least this much of a core is spare: a core left idle while the device waits is wasted, the kernel shares the cores among
the threads, and the trial keeps the thread only if the phase got faster. (Measured on a 2-core VM, images decoded for a
CPU-torch CNN: the compute thread busy 45 % of a core left 0.5 spare, one fill thread; two ran 1.36x faster. Issue 31:
the same run later measured 0.2 spare, so 0.25 held the fill at one thread, 484 images/s, where two pinned ran 625,
level with the best DataLoader.)"""


def default_cores() -> float:
    """Cores this process may run on."""
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return float(os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class TunerDecision:
    """One decision of the tuner and the figure it was made from (``idle_fraction``: the device's
    idle share for a thread, the bottleneck's for depth)."""

    lane: int
    depth: int
    idle_fraction: float
    reason: str


class DepthTuner:
    """Grows a lane's ring while its bottleneck phase idles, within a memory budget.

    Each window of ``window`` batches, the lane reports the bottleneck phase's busy time and
    the span it covered; idle = 1 - busy/span. Idle above ``idle_threshold`` with every phase's
    mean below the bottleneck's means jitter, not a slower phase, so a deeper ring helps; grow
    by one slot per 5 % idle, then watch another window. Never above ``max_depth`` or the budget.
    """

    def __init__(self, max_depth: int, budget_bytes: int, idle_threshold: float = 0.02, window: int = 8) -> None:
        self.max_depth = max_depth
        self.budget_bytes = budget_bytes
        self.idle_threshold = idle_threshold
        self.window = window
        self.decisions: list[TunerDecision] = []

    def decide(self, lane: int, depth: int, idle_fraction: float, slot_bytes: int, used_bytes: int) -> int:
        """The depth to use next given one window's measurements."""
        if idle_fraction <= self.idle_threshold or depth >= self.max_depth:
            return depth
        if used_bytes + slot_bytes > self.budget_bytes:
            if not self.decisions or self.decisions[-1].reason != "budget":
                self.decisions.append(TunerDecision(lane, depth, idle_fraction, "budget"))
            return depth
        # Grow in proportion to the idle share (one slot per 5 % idle), so a heavy-tailed phase
        # reaches a useful depth within a few windows instead of one slot per window.
        step = max(1, int(idle_fraction / 0.05))
        new = min(self.max_depth, depth + step)
        while new > depth + 1 and used_bytes + (new - depth) * slot_bytes > self.budget_bytes:
            new -= 1
        self.decisions.append(TunerDecision(lane, new, idle_fraction, "bottleneck idle"))
        return new


@dataclass(frozen=True, slots=True)
class Window:
    """One lane's window of batches, measured: per phase (RUN_PHASES order) the mean wall and CPU
    seconds per batch and the busy span; the compute phase's idle share."""

    mean_s: tuple[float, ...]
    cpu_s: tuple[float, ...]
    busy_s: tuple[float, ...]
    span_s: tuple[float, ...]

    @property
    def device_idle(self) -> float:
        """Share of the window's compute span the compute phase did not run."""
        span = self.span_s[_COMPUTE]
        return max(0.0, 1.0 - self.busy_s[_COMPUTE] / span) if span > 0 else 0.0

    def cpu_share(self, phase: Phase) -> float:
        """Cores one thread of ``phase`` keeps busy while it runs (CPU time over wall time, 0..1)."""
        wall = self.mean_s[phase - 1]
        return min(1.0, self.cpu_s[phase - 1] / wall) if wall > 0 else 0.0


def _slots_for(s: LaneSettings) -> int:
    """The ring a lane's threads need: a slot each and one for the device (2 with one of each)."""
    return max([2] + [w + 2 for w in (s.fill, s.sink) if w > 1])


def _with(s: LaneSettings, phase: Phase, threads: int) -> LaneSettings:
    return LaneSettings(s.depth, threads if phase is Phase.FILL else s.fill, threads if phase is Phase.SINK else s.sink,
                        s.fill_processes)


def measure_window(records: list[BatchRecord]) -> Window:
    """The ``Window`` of a lane's successful batch records."""
    spans = np.array([r.phases for r in records], dtype=float).reshape(len(records), len(RUN_PHASES), 2)
    ran = spans[:, :, 0] > 0
    dur = np.where(ran, np.maximum(0.0, spans[:, :, 1] - spans[:, :, 0]), 0.0)
    n = np.maximum(1, ran.sum(axis=0))
    cpu = np.array([r.cpu or (0.0,) * len(RUN_PHASES) for r in records], dtype=float)
    starts = np.where(ran, spans[:, :, 0], np.inf).min(axis=0)
    ends = np.where(ran, spans[:, :, 1], -np.inf).max(axis=0)
    span = np.where(np.isfinite(starts) & np.isfinite(ends), ends - starts, 0.0)
    return Window(tuple((dur.sum(axis=0) / n).tolist()), tuple((cpu.sum(axis=0) / n).tolist()),
                  tuple(dur.sum(axis=0).tolist()), tuple(np.maximum(0.0, span).tolist()))


@dataclass(frozen=True, slots=True)
class LaneSettings:
    """What the tuner sets on one lane."""

    depth: int
    fill: int
    sink: int
    fill_processes: bool = False
    """Fills run in worker processes (``[host] fill_pool``; "auto": the tuner's choice)."""

    def workers(self, phase: Phase) -> int:
        return self.fill if phase is Phase.FILL else self.sink


@dataclass(slots=True)
class Autotuner:
    """Every lane's host threads and depth, within ``max_workers`` per phase, ``cpu_cores`` for
    the run and the depth tuner's memory budget. ``pinned`` holds the phases the spec fixed."""

    depth: DepthTuner
    max_workers: int
    cpu_cores: float
    pinned: frozenset[Phase] = frozenset()
    cores_by_lane: dict[int, float] = field(default_factory=dict)
    """Cores each lane's host threads keep busy, as last measured (the CPU budget is shared)."""
    trial: dict[int, tuple[Phase, int, float, float]] = field(default_factory=dict)
    """Threads just added, per lane: (phase, threads before, the phase's batches/s before), judged on the next
    window."""
    saturated: set[tuple[int, Phase]] = field(default_factory=set)
    """(lane, phase) that a thread did not speed up: CPU- or GIL-bound, never grown again."""
    depth_trial: dict[int, tuple[int, float]] = field(default_factory=dict)
    """A deeper ring on trial, per lane: (depth before, device idle before)."""
    depth_done: set[int] = field(default_factory=set)
    """Lanes whose ring a deeper one did not help: not deepened again."""
    loop_tried: set[int] = field(default_factory=set)
    """Lanes whose ring was deepened once for the loop (``_deepen_for_the_loop``)."""
    process_cores: float = 0.0
    """Cores the whole process kept busy over each lane's last window (every thread, the loop too)."""
    peak: dict[tuple[int, Phase], int] = field(default_factory=dict)
    """The most threads a (lane, phase) has had: a thread taken back still did work in the window."""
    held: dict[tuple[int, Phase], ThreadCap] = field(default_factory=dict)
    """Why a (lane, phase) got no thread the last time it asked for one."""
    idle_cores: float | None = None
    """Cores the machine left idle over the lane's last window, every process counted (None: not measured)."""
    machine_cores: float = field(default_factory=default_cores)
    """Cores the machine lets this process use (the bound counts these; the budget may be less)."""
    fill_processes: bool = False
    """Each fill thread hands its batch to a worker process (``[host] fill_pool = "processes"``)."""
    sink_processes: bool = False
    """Each sink thread hands its batch to a worker process (``[host] sink_pool = "processes"``)."""
    fill_auto: bool = False
    """``[host] fill_pool = "auto"`` with a source that can load in processes: a fill that threads do not speed up (GIL-
    or CPU-bound) is tried in processes, which stay if they are faster."""
    pool_tried: set[int] = field(default_factory=set)
    """Lanes whose fill was tried in processes (kept or not): not tried again."""
    pool_trial: dict[int, tuple[float, int]] = field(default_factory=dict)
    """A switch of the fill's pool on trial, per lane: (fill batches/s before, threads)."""

    @classmethod
    def for_spec(cls, spec: PipelineSpec) -> Autotuner:
        """The tuner a spec asks for: its memory budget, thread cap, CPU budget and pinned counts."""
        host = spec.host
        pinned = frozenset(p for p, n in ((Phase.FILL, host.fill_workers), (Phase.SINK, host.sink_workers))
                           if n is not None)
        return cls(DepthTuner(spec.feeder.max_depth, int(spec.feeder.memory_budget_mb * 2**20)),
                   host.max_workers, host.cpu_cores or default_cores(), pinned,
                   fill_processes=host.fill_pool == "processes" and spec.executor.kind == "local",
                   sink_processes=host.sink_pool == "processes" and spec.executor.kind == "local")

    def first_fill(self, lanes: int, depth: int | None = None) -> int:
        """Threads (or processes) each lane's fill starts with: one per core of the CPU budget, shared
        by the lanes, within ``max_workers``, and within a ``depth`` set by hand (a slot for each
        thread and two more). Every slot of a new ring needs filling before the device can start,
        and a decoder starting on one thread waited for the tuner's first window: 16 batches of
        images ran 0.1-0.15 s longer than on two threads pinned (issue 31)."""
        n = max(1, min(self.max_workers, math.floor(self.cpu_cores / max(1, lanes) + 1e-9)))
        return n if depth is None else max(1, min(n, depth - 2))

    def first_fill_fits(self, lanes: int, threads: int) -> Callable[[int], int]:
        """How many of a lane's ``threads`` starting fill threads the memory budget, shared by the
        ``lanes``, leaves a slot for (each thread its own, the device two more), given a slot's bytes."""
        share = self.depth.budget_bytes // max(1, lanes)

        def fits(slot_bytes: int) -> int:
            return threads if slot_bytes <= 0 else max(1, min(threads, share // slot_bytes - 2))

        return fits

    def _unit(self, s: LaneSettings, phase: Phase) -> str:
        """What ``phase`` runs on under ``s``, as a decision says it."""
        return "processes" if (s.fill_processes if phase is Phase.FILL else self.sink_processes) else "threads"

    def threads(self, lanes: Sequence[LaneLike]) -> dict[int, tuple[HostThreads, HostThreads]]:
        """Each lane's fill and sink threads: how many now, how many it may reach, why not more."""
        return {lane.id: (self._threads(lane, Phase.FILL), self._threads(lane, Phase.SINK)) for lane in lanes}

    def _threads(self, lane: LaneLike, phase: Phase) -> HostThreads:
        now = lane.workers(phase)
        peak = max(now, self.peak.get((lane.id, phase), 0))
        procs = (self.fill_processes or lane.fill_in_processes) if phase is Phase.FILL else self.sink_processes
        if phase in self.pinned:
            return HostThreads(now, peak, "pinned", procs)
        if (lane.id, phase) in self.saturated:
            return HostThreads(now, peak, "saturated", procs)
        why = self.held.get((lane.id, phase))
        if why is not None:
            return HostThreads(now, peak, why, procs)
        return HostThreads(now, max(peak, self.max_workers), "tuned", procs)

    @property
    def window(self) -> int:
        return self.depth.window

    def window_ready(self, lane: int, batches: int, span_s: float) -> bool:
        """Whether ``lane``'s window of ``batches`` batches over ``span_s`` seconds is judged now: the
        tuner's window (longer while a change is on trial); before the first decision, few batches
        (``_FIRST_WINDOW``, or ``_FIRST_SHORT`` of slow ones)."""
        if lane in self.cores_by_lane:
            return batches >= self.window and span_s >= self.min_window_s(lane)
        return ((batches >= _FIRST_WINDOW and span_s >= _WINDOW_S)
                or (batches >= _FIRST_SHORT and span_s >= _TRIAL_S))

    def records_needed(self, lane: int) -> int:
        """Successful batches a window of ``lane`` must hold to be judged (its warm-up batch left out)."""
        return _FIRST_SHORT - 1 if lane not in self.cores_by_lane else _MIN_RECORDS

    def first_decision(self, lane: int) -> bool:
        """No decision was made for ``lane`` yet (its window still holds its first batch)."""
        return lane not in self.cores_by_lane

    @property
    def decisions(self) -> list[TunerDecision]:
        return self.depth.decisions

    def cores_used(self) -> float:
        """Cores every lane's threads keep busy, as last measured."""
        return sum(self.cores_by_lane.values())

    def decide(self, lane: int, now: LaneSettings, w: Window, slot_bytes: int, used_bytes: int,
               tune_depth: bool = True) -> LaneSettings:
        """The settings for ``lane``'s next window, from one window's measurements; with
        ``tune_depth`` off (an operator set the depth) the depth stays and threads fit in it."""
        self.cores_by_lane[lane] = self._lane_cores(now, w)
        judged = self._judge_trial(lane, now, w)
        if judged is not None:
            return judged
        per_thread = [w.mean_s[i] / (now.workers(p) if p in _HOST else 1) for i, p in enumerate(RUN_PHASES)]
        worst = RUN_PHASES[int(np.argmax(per_thread))]
        idle = w.device_idle
        compute = w.mean_s[_COMPUTE]
        open_ = [p for p in _HOST if p not in self.pinned and (lane, p) not in self.saturated]
        if Phase.FILL in open_ and self._ran(Phase.FILL, now, w) >= _MOSTLY and self._gil_from_the_start(lane, now, w):
            # Whatever the device's idle says: threads taking turns on the GIL also hold up every
            # other thread of the process, compute's among them, whose wall time then looks like
            # the device's (the gil-bound profile's compute read 29 ms for 10, "busy 93 %").
            fill_s = w.mean_s[Phase.FILL - 1]
            return self._try_processes(lane, now, Phase.FILL, now.fill / fill_s if fill_s > 0 else 0.0, now.fill, w,
                                       "its threads take turns on one GIL")
        if idle > self.depth.idle_threshold and open_ and compute > 0:
            # The host phase slowest per thread, if its threads get through fewer batches than
            # compute with a margin (a heavy-tailed load whose mean equals compute's needs a
            # second thread to get ahead of its tail); else the device waits for jitter, or for
            # the engine itself: threads would not help, depth might.
            host = max(open_, key=lambda p: per_thread[p - 1])
            ran = self._ran(host, now, w)
            if per_thread[host - 1] * _MARGIN > compute and ran < _MOSTLY:
                # Its threads sat idle most of the window: the device waits for what hands them work
                # (the engine's own loop, a batch of one task), and another thread would idle too (a
                # no-op run at batch 1 went to 6 fill and 6 sink threads, each switch costing the loop).
                name = host.name.lower()
                if self.held.get((lane, host)) != "idle":  # said once while it lasts
                    self._hold((lane, host), "idle", now.depth, idle,
                               f"{name} {self._unit(now, host)} idle most of the window: the device waits for "
                               f"the engine, not the {name}")
            elif per_thread[host - 1] * _MARGIN > compute:
                grown = self._add_thread(lane, now, host, w, idle, slot_bytes, used_bytes, tune_depth)
                if grown is not None:
                    return grown
                if host is Phase.FILL and self.held.get((lane, host)) == "max":
                    # No thread left to add and the device still waits for the fill: each process
                    # has its own GIL, which no further thread would (the GIL-bound profile kept
                    # max_workers threads for seconds without this).
                    fill_s = w.mean_s[Phase.FILL - 1]
                    rate = now.fill / fill_s if fill_s > 0 else 0.0
                    moved = self._try_processes(lane, now, Phase.FILL, rate, now.fill, w)
                    if moved is not now:
                        return moved
        if not tune_depth or lane in self.depth_done:
            return now
        # The bottleneck's own idle share: a phase on n threads is busy n x its span at most.
        i = worst - 1
        span = w.span_s[i] * (now.workers(worst) if worst in _HOST else 1)
        b_idle = max(0.0, 1.0 - w.busy_s[i] / span) if span > 0 else 0.0
        if all(self._ran(p, now, w) < _MOSTLY for p in RUN_PHASES):
            # Every phase idled most of the window: not jitter that a ring of one slot per 5 % idle
            # absorbs (a no-op run at batch 1 went to depth 16), but too little work handed on.
            return self._deepen_for_the_loop(lane, now, w, slot_bytes, used_bytes)
        depth = self.depth.decide(lane, now.depth, b_idle, slot_bytes, used_bytes)
        if depth > now.depth:
            self.depth_trial[lane] = (now.depth, idle)
        return LaneSettings(depth, now.fill, now.sink, now.fill_processes)

    def _deepen_for_the_loop(self, lane: int, now: LaneSettings, w: Window, slot_bytes: int,
                             used_bytes: int) -> LaneSettings:
        """The phases idle, waiting for the engine's loop to hand the lane work: more batches in
        flight let one wake-up of the loop move several on (no-op runs at batch 1 and 256 went
        1.15-1.2x faster at depth 4 than at 2, their device idle all the same, so the depth trial's
        measure cannot judge it, and a window's rate is too noisy to). Once per lane, the ring gets
        ``_LOOP_STEP`` slots more, within the memory budget, and keeps them."""
        new = now.depth + _LOOP_STEP
        if (lane in self.loop_tried or new > self.depth.max_depth
                or used_bytes + _LOOP_STEP * slot_bytes > self.depth.budget_bytes):
            return now
        self.loop_tried.add(lane)
        self.decisions.append(TunerDecision(lane, new, w.device_idle,
                                            f"depth {new}: the phases idle, the loop hands on more per wake-up"))
        return LaneSettings(new, now.fill, now.sink, now.fill_processes)

    def min_window_s(self, lane: int) -> float:
        """How long the lane's next window must span: longer while threads or slots are on trial
        (one noisy short window must not decide for the rest of the run)."""
        return _TRIAL_S if lane in self.trial or lane in self.depth_trial or lane in self.pool_trial else _WINDOW_S

    def _judge_trial(self, lane: int, now: LaneSettings, w: Window) -> LaneSettings | None:
        """After a thread was added: keep it if the phase got at least 10 % faster (batches/s over
        its threads), else take it back and grow that phase no more. Threads of a phase bound by
        the CPU or by Python's GIL wait for each other, and CPU time alone does not show it."""
        switched = self.pool_trial.pop(lane, None)
        if switched is not None:
            return self._judge_pool(lane, now, w, *switched)
        deeper = self.depth_trial.pop(lane, None)
        if deeper is not None and w.device_idle > _DEPTH_GAIN * deeper[1]:
            # A deeper ring that left the device as idle as before: the idle is not jitter a ring
            # absorbs (the engine's own gaps, say). Back to the depth before, and no deeper.
            self.depth_done.add(lane)
            self.decisions.append(TunerDecision(
                lane, max(deeper[0], _slots_for(now)), w.device_idle,
                f"depth {now.depth} did not help (device idle {deeper[1]:.1%} -> {w.device_idle:.1%})"))
            return LaneSettings(max(deeper[0], _slots_for(now)), now.fill, now.sink, now.fill_processes)
        trial = self.trial.pop(lane, None)
        if trial is None:
            return None
        phase, had, before, burned = trial
        have = now.workers(phase)
        mean = w.mean_s[phase - 1]
        after = have / mean if mean > 0 else 0.0
        if not now.fill_processes and self._shares_a_gil(phase, had, have, burned, w):
            # More threads, hardly more CPU, and cores to spare: they take turns holding one GIL (a
            # user's pure-Python load). Processes each have their own; try them now rather than
            # after threads have been added up to the cap (a 60-batch run ended first).
            keep = have if after >= _TRIAL_GAIN * before else had
            self.decisions.append(TunerDecision(
                lane, now.depth, w.device_idle,
                f"fill threads share a GIL: {have} burned {w.cpu_share(phase) * have:.2f} cores, {had} {burned:.2f}"))
            return self._try_processes(lane, _with(now, phase, keep), phase, max(before, after), have, w)
        if after >= _TRIAL_GAIN * before:
            gain = after / before if before > 0 else 0.0
            if have > 2 * had and gain < _SCALING * have / had:
                # A jump that helped, but far less than its threads: the phase stops scaling near
                # the gain (a GIL or the cores). Trim to the threads that gain needs; grow no more.
                trimmed = min(have, max(had + 1, math.ceil(had * gain - 0.05)))
                self.saturated.add((lane, phase))
                self.decisions.append(TunerDecision(
                    lane, now.depth, w.device_idle,
                    f"{phase.name.lower()} {trimmed} {self._unit(now, phase)}: "
                    f"{have} ran only {gain:.2g}x faster than {had}"))
                return self._try_processes(lane, _with(now, phase, trimmed), phase, after, have, w)
            return None
        self.saturated.add((lane, phase))
        self.held.pop((lane, phase), None)
        name = phase.name.lower()
        self.decisions.append(TunerDecision(
            lane, now.depth, w.device_idle,
            f"{name} back to {had} {self._unit(now, phase)}: {have} did not help ({before:.3g} -> {after:.3g} "
            "batches/s; CPU- or GIL-bound)"))
        return self._try_processes(lane, _with(now, phase, had), phase, before, have, w)

    def _shares_a_gil(self, phase: Phase, had: int, have: int, burned: float, w: Window) -> bool:
        """Whether the fill's threads on trial burned little more CPU than before while the process
        had cores spare: threads that take turns holding the GIL, where processes would not (the
        caller asks only of threads: worker processes' CPU is not in ``process_cores``)."""
        if phase is not Phase.FILL or not self.fill_auto or have <= had or burned < _BURNS * had:
            return False
        if not self._cores_spare():
            return False  # the cores, not the GIL, may hold it: processes would not help
        return w.cpu_share(phase) * have < burned * (1 + _GIL_GROWTH * (have / had - 1))

    def _gil_from_the_start(self, lane: int, now: LaneSettings, w: Window) -> bool:
        """Whether the fill's threads, as many as it started with (``first_fill``), burned together
        hardly more than the one core a single thread can, while the process had cores spare: the
        threads take turns holding one GIL (a user's pure-Python load). With no count of fewer threads
        to compare with (``_shares_a_gil``), one thread is taken to burn a whole core at most; where
        the threads in fact wait for I/O, the processes' trial finds them no faster and they go."""
        n = now.fill
        if now.fill_processes or (lane, Phase.FILL) in self.peak or lane in self.pool_tried:
            return False
        burned = w.cpu_share(Phase.FILL) * n
        if burned < _BURNS * n or self.cores_used() > self.cpu_cores - _SPARE_FOR_GIL:
            return False
        if not self._shares_a_gil(Phase.FILL, 1, n, 1.0, w):  # against one thread burning a whole core
            return False
        self.decisions.append(TunerDecision(lane, now.depth, w.device_idle,
                                            f"fill threads share a GIL: {n} burned {burned:.2f} cores"))
        return True

    def _cores_spare(self) -> bool:
        """Whether the last window left cores spare for a GIL to be what held the fill: this process
        used less than its budget, and the machine (other processes too) left cores idle."""
        if self.process_cores > self.cpu_cores - _SPARE_FOR_GIL:
            return False
        return self.idle_cores is None or self.idle_cores >= _SPARE_FOR_GIL

    @staticmethod
    def _ran(phase: Phase, now: LaneSettings, w: Window) -> float:
        """Share of the window ``phase``'s threads ran a job (1: every thread always busy)."""
        i = phase - 1
        span = w.span_s[i] * (now.workers(phase) if phase in _HOST else 1)
        return min(1.0, w.busy_s[i] / span) if span > 0 else 1.0

    def _try_processes(self, lane: int, then: LaneSettings, phase: Phase, rate: float, workers: int,
                       w: Window, why: str = "threads do not speed it up") -> LaneSettings:
        """``then``, or, where threads stopped speeding the fill up and ``[host] fill_pool = "auto"``
        allows it (once per lane), the fill in ``workers`` processes on trial (the count the
        threads' trial had: each process has its own GIL); ``then`` is where a failed trial goes."""
        if phase is not Phase.FILL or not self.fill_auto or then.fill_processes or lane in self.pool_tried:
            return then
        self.pool_tried.add(lane)
        self.pool_trial[lane] = (rate, then.fill)
        self.decisions.append(TunerDecision(lane, then.depth, w.device_idle,
                                            f"fill in {workers} processes on trial: {why}"))
        return LaneSettings(max(then.depth, workers + 2), workers, then.sink, fill_processes=True)

    def _judge_pool(self, lane: int, now: LaneSettings, w: Window, before: float, threads: int) -> LaneSettings:
        """After the fill moved to processes: keep them if the fill got at least 10 % faster, and let
        it grow again (each process has its own GIL); else back to threads, for good."""
        mean = w.mean_s[Phase.FILL - 1]
        after = now.fill / mean if mean > 0 else 0.0
        if after >= _TRIAL_GAIN * before:
            self.saturated.discard((lane, Phase.FILL))
            self.peak[(lane, Phase.FILL)] = max(self.peak.get((lane, Phase.FILL), 0), now.fill)
            self.decisions.append(TunerDecision(
                lane, now.depth, w.device_idle,
                f"fill in processes kept: {before:.3g} -> {after:.3g} batches/s on {now.fill}"))
            return now
        self.decisions.append(TunerDecision(
            lane, now.depth, w.device_idle,
            f"fill back on {threads} threads: processes did not help ({before:.3g} -> {after:.3g} batches/s)"))
        return LaneSettings(now.depth, threads, now.sink, fill_processes=False)

    def _lane_cores(self, s: LaneSettings, w: Window) -> float:
        """Cores the lane keeps busy: its host threads as if always running (the budget's worst
        case) where they run most of the time, else as measured (a sink that writes for 1 % of the
        window does not hold a core: counted whole, it kept a GIL-bound fill in processes at one
        worker on 2 cores); its device phases' threads as measured (on NumPy compute burns a core)."""
        host = 0.0
        for p in _HOST:
            i, n = p - 1, s.workers(p)
            running = min(float(n), w.busy_s[i] / w.span_s[i]) if w.span_s[i] > 0 else float(n)
            host += w.cpu_share(p) * (n if running >= _MOSTLY * n else running)
        dev = sum(w.cpu_share(p) * min(1.0, w.busy_s[p - 1] / w.span_s[p - 1])
                  for p in RUN_PHASES if p not in _HOST and w.span_s[p - 1] > 0)
        return host + dev

    def _add_thread(self, lane: int, now: LaneSettings, phase: Phase, w: Window, idle: float,
                    slot_bytes: int, used_bytes: int, tune_depth: bool) -> LaneSettings | None:
        name = phase.name.lower()
        have = now.workers(phase)
        key = (lane, phase)
        if have >= self.max_workers:
            self._hold(key, "max", now.depth, idle, f"{name} at max_workers ({self.max_workers})")
            return None
        share = w.cpu_share(phase)
        # As many threads as keep up with compute (its mean over this phase's per batch). The first
        # step jumps there at once (a run converges in one trial, not log2(need) of them); later
        # steps at most double: a phase that stops scaling is caught within a step or two, and a
        # first jump that did not help is taken back whole by its trial.
        compute = w.mean_s[_COMPUTE]
        need = math.ceil(_MARGIN * w.mean_s[phase - 1] / compute - 1e-9) if compute > 0 else have + 1
        step = need if key not in self.peak else 2 * have
        want = max(have + 1, min(need, step, self.max_workers))
        # CPU time over wall time undercounts a thread that waits for a core or the GIL, so a phase
        # that burns CPU also needs the whole process (the loop, every thread) to have cores spare.
        used = max(self.cores_used(), self.process_cores if share >= _BURNS else 0.0)
        if share > 0:  # a phase measured as using no CPU (or not measured: a remote lane) costs none
            spare = self.cpu_cores - used
            fits = max(0, math.floor(spare / share + 1e-9))
            if fits == 0 and spare >= _SPARE_MIN and self.cpu_cores >= self.machine_cores:
                fits = 1  # on trial: the kernel shares the machine's cores, the trial judges the gain
            want = min(want, have + fits)
        if want <= have:
            self._hold(key, "cpu", now.depth, idle, f"{name} at the CPU budget ({self.cpu_cores:g} cores)")
            return None
        if want + 2 > now.depth and not tune_depth:
            want = now.depth - 2
            if want <= have:
                why = f"{name}: depth {now.depth} set by hand leaves no slot for a thread"
                self._hold(key, "depth", now.depth, idle, why)
                return None
        while want > have and (want + 2 > self.depth.max_depth
                               or used_bytes + (want + 2 - now.depth) * slot_bytes > self.depth.budget_bytes):
            want -= 1
        if want <= have:
            self._hold(key, "memory", now.depth, idle, f"{name}: no memory for another slot")
            return None
        depth = max(now.depth, want + 2)
        self.held.pop(key, None)
        self.cores_by_lane[lane] = self.cores_by_lane.get(lane, 0.0) + share * (want - have)
        mean = w.mean_s[phase - 1]
        unit = self._unit(now, phase)
        self.trial[lane] = (phase, have, have / mean if mean > 0 else 0.0, share * have)
        self.peak[key] = max(self.peak.get(key, 0), want)
        self.decisions.append(TunerDecision(
            lane, depth, idle, f"{name} {want} {unit} ({mean * 1e3:.3g} ms/batch on {have}, {share:.0%} CPU)"))
        return _with(LaneSettings(depth, now.fill, now.sink, now.fill_processes), phase, want)

    def _hold(self, key: tuple[int, Phase], why: ThreadCap, depth: int, idle: float, reason: str) -> None:
        """No thread for ``key`` this window, because of ``why`` (said once per reason)."""
        self.held[key] = why
        if not self.decisions or self.decisions[-1].reason != reason:
            self.decisions.append(TunerDecision(key[0], depth, idle, reason))
