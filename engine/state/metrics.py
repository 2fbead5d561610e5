"""Figures of merit (DESIGN.md section 4), computed from the lanes' real batch records.

The decisions this module protects: every figure comes from measured phase intervals, never
from configured or assumed times; throughput for overlap efficiency is the steady-state rate
(first batch done to last batch done), so a pipeline's fill-up and drain latency does not pass
for a lack of overlap; the Amdahl ceiling uses the measured serial share of the work.

- The headline is **device busy**: the share of wall time the compute phase runs, from the first
  compute to the last (now, while running), per lane and over all lanes (the union of their
  compute intervals).
- The bound is what the pipeline could reach with its host phases parallel, counting what the
  machine has: per lane, each phase's tasks over its busy time, times the threads it may have
  (device phases: one stream; a host phase: the tuner's cap, ``HostThreads``), and for the run,
  the cores over the CPU time a batch costs. It is taken over the same batches and the same
  window as the steady rate (busy time clipped to the window), so a phase on k threads can never
  have done more than k times its window: overlap efficiency cannot exceed 1.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from warpdeck.engine.state.bottleneck import (
    DEVICE_BOUND,
    DeviceWaits,
    HostThreads,
    describe_bottleneck,
    describe_engine_bound,
)
from warpdeck.engine.state.read_only import LaneFigures, NamedFigures, read_only_by_lane, set_read_only
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.task_states import RUN_PHASES, Phase, StallReason

__all__ = ["Figures", "MetricsAccumulator", "amdahl_speedup"]

_STEADY_MIN = 3
"""Batches needed before a steady-state rate means anything (first done to last done)."""
_PHASE_NAMES = tuple(p.name.lower() for p in RUN_PHASES)
_COMPUTE = Phase.COMPUTE - 1
_HOST = {Phase.FILL - 1: 0, Phase.SINK - 1: 1}
_BURNS = 0.3
"""A host phase whose CPU time is at least this share of its busy time burns CPU: cores cap it."""
_MERGE_EVERY = 256
"""Compute intervals kept unmerged before a merge (a reading merges them too)."""
LaneThreads = Mapping[int, tuple[HostThreads, HostThreads]]
"""Per lane: the fill and the sink threads (the tuner's, engine/run/autotune.py)."""


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
    """What the pipeline could reach with its host phases on every thread they may have and
    perfect overlap, within the machine's cores (module docstring)."""
    serial_bound_tasks_s: float
    """1 / sum(mean phase times): no overlap at all."""
    overlap_efficiency: float
    occupancy: LaneFigures
    """Per lane, the share of each phase's thread time it was busy: busy time over the time its
    threads were there (a device phase: one stream), from the lane's first batch. At most 1: a sink
    on two threads, both always busy, is 100%, not 200%."""
    stall_s: NamedFigures
    divergence: int
    max_divergence: int
    serial_fraction: float
    amdahl: NamedFigures
    """Most speedup more lanes could give over the current count: p = lanes+1, 2x, infinity.
    Amdahl's law over the measured serial share, within what the cores and the device leave
    (``lanes_limit``): more lanes never share more cores or devices than there are."""
    device_busy: float = 0.0
    """Share of wall time the compute phase runs, first compute to last: the headline."""
    device_busy_by_lane: NamedFigures = field(default_factory=dict)
    """The same per lane (keys: lane ids as text)."""
    cpu_phase_s: NamedFigures = field(default_factory=dict)
    """Mean CPU seconds per batch of each phase's thread (a host phase that waits shows little)."""
    bottleneck_phase: str = ""
    """The phase that holds the device back ("" before enough batches; "cpu" for the cores)."""
    bottleneck: str = ""
    """The bottleneck, the device's busy share and what to change, in one line."""
    lanes_limit: str = ""
    """What caps ``amdahl`` below Amdahl's law: "cores", "device", or "" (the serial share)."""

    def __post_init__(self) -> None:
        # A snapshot's figures are shared by every reader: read-only (engine/state/read_only.py).
        set_read_only(self, "mean_phase_s", "stall_s", "amdahl", "device_busy_by_lane", "cpu_phase_s")
        object.__setattr__(self, "occupancy", read_only_by_lane(self.occupancy))


class MetricsAccumulator:
    """Folds batch records and task latencies into running sums; ``figures`` reads them."""

    def __init__(self, lanes: int, latency_window: int = 100_000, recent_s: float = 3.0) -> None:
        self.lanes = lanes
        self.batches = 0
        self.tasks = 0
        self.nbytes = 0
        # Per-phase sums are Python lists, not arrays: they grow by one element at a time, per
        # batch, on the loop, where a NumPy element costs several times a list's.
        self.phase_sum = _zeros()
        self.phase_n = [0] * len(RUN_PHASES)
        self.busy: dict[int, list[float]] = {}
        self.first_end = 0.0
        self.first_tasks = 0
        self.last_end = 0.0
        self.first_start = 0.0
        self.stall_s = dict.fromkeys((r.name.lower() for r in StallReason if r), 0.0)
        self._lat = np.zeros(latency_window)
        self._lat_n = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._recent_tasks = 0
        """The tasks in ``_recent``, kept as it changes: at batch 1 it holds thousands of batches, summed 10 times a
        second."""
        self._recent_s = recent_s
        self.serial_s = 0.0
        self.failed = 0
        self.cpu_sum = _zeros()
        # The steady window (records done after the first): per lane, tasks and busy time per
        # phase clipped to the window; CPU per phase, clipped alike.
        self.w_tasks: dict[int, int] = {}
        self.w_busy: dict[int, list[float]] = {}
        # ... and the time at least one job of the phase ran (a pool's jobs start in order).
        self.w_union: dict[int, list[float]] = {}
        self._union_end: dict[int, list[float]] = {}
        self.w_cpu = _zeros()
        self.w_lane_cpu: dict[int, list[float]] = {}
        self.device = _DeviceBusy()
        # Per lane, the thread-seconds each phase had since the first batch began (a device phase:
        # one stream; a host phase: its threads, which the tuner changes), read at every reading.
        self.thread_s: dict[int, np.ndarray] = {}
        self._lane_start: dict[int, float] = {}
        self._counted_to: dict[int, float] = {}

    def add(self, rec: BatchRecord) -> None:
        """Count one batch's record (failed batches count for occupancy, not throughput)."""
        c0, c1 = rec.phases[_COMPUTE]
        if c0:
            self.device.add(rec.lane, c0, c1)
        busy = _row(self.busy, rec.lane)
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
        if start and start < self._lane_start.get(rec.lane, math.inf):
            self._lane_start[rec.lane] = start
        if not rec.ok:
            return
        self.batches += 1
        self.tasks += rec.tasks
        self.nbytes += rec.nbytes
        end = rec.end
        if rec.cpu:
            cpu_sum = self.cpu_sum
            for i, c in enumerate(rec.cpu):
                cpu_sum[i] += c
        if not self.first_end:
            self.first_end, self.first_tasks = end, rec.tasks
        else:
            self._add_steady(rec)
        self.last_end = max(self.last_end, end)
        self._recent.append((end, rec.tasks))
        self._recent_tasks += rec.tasks

    def _add_steady(self, rec: BatchRecord) -> None:
        # Per batch, on the loop: comparisons, not max() calls (a third of this method's cost).
        w0 = self.first_end
        self.w_tasks[rec.lane] = self.w_tasks.get(rec.lane, 0) + rec.tasks
        wb, wu, ue = _row(self.w_busy, rec.lane), _row(self.w_union, rec.lane), _row(self._union_end, rec.lane)
        cpu = rec.cpu
        for i, (t0, t1) in enumerate(rec.phases):
            if not t0 or t1 <= t0:
                continue
            begin = t0 if t0 > w0 else w0
            inside = t1 - begin if t1 > begin else 0.0
            wb[i] += inside
            end_before = ue[i]
            if t1 > end_before:
                ue[i] = t1
                lo = begin if begin > end_before else end_before
                if t1 > lo:
                    wu[i] += t1 - lo
            if cpu:  # at least this much of its CPU time fell in the window (one thread)
                c = cpu[i] - (t1 - t0 - inside)
                if c > 0:
                    self.w_cpu[i] += c
                    _row(self.w_lane_cpu, rec.lane)[i] += c

    def add_latencies(self, latencies: np.ndarray) -> None:
        """Record done tasks' queued-to-done times (a ring of the most recent)."""
        cap = len(self._lat)
        vals = latencies[-cap:]
        start = self._lat_n % cap
        end = start + len(vals)
        if end <= cap:  # slices, not an index array: this runs per batch, on the loop
            self._lat[start:end] = vals
        else:
            self._lat[start:] = vals[: cap - start]
            self._lat[: end - cap] = vals[cap - start:]
        self._lat_n += len(vals)

    def add_stall(self, reason: StallReason, seconds: float) -> None:
        """Time some work spent stalled for ``reason``."""
        if reason:
            self.stall_s[reason.name.lower()] += max(0.0, seconds)

    def figures(self, now: float, started: float, done: int, failed: int, divergence: int,
                max_divergence: int, threads: LaneThreads | None = None, cores: float = 1.0,
                finished: bool = False) -> Figures:
        """Every figure as of ``now`` (perf_counter clock); ``started`` is the engine's start.
        ``threads``: each lane's fill and sink threads (absent: one each, none to add); ``cores``:
        what the machine lets the run use; ``finished``: device busy ends at the last compute."""
        elapsed = max(1e-9, now - started)
        threads = threads or {}
        n = np.array(self.phase_n)
        means = np.divide(self.phase_sum, n, out=np.zeros(len(RUN_PHASES)), where=n > 0)
        cpu_means = np.divide(self.cpu_sum, n, out=np.zeros(len(RUN_PHASES)), where=n > 0)
        mean_batch = self.tasks / self.batches if self.batches else 0.0
        worst = float(means.max()) if self.batches else 0.0
        bound, caps_now, cpu_cap = self._bound(threads, cores)
        if bound <= 0 or self.batches < _STEADY_MIN:
            # No steady window yet, so the rate is every task over the elapsed time: measure the bound
            # over every batch too (the slowest phase's mean, one thread each). The window's bound
            # leaves the first batch out, and a full first batch ahead of a short last one would put
            # the rate above it.
            bound = self.lanes * mean_batch / worst if worst > 0 else 0.0
        total = float(means.sum())
        serial_bound = mean_batch / total if total > 0 else 0.0
        span = self.last_end - self.first_end
        steady = (self.tasks - self.first_tasks) / span if self.batches >= _STEADY_MIN and span > 0 else done / elapsed
        # What the run did, it could: a bound below it (CPU time that a thread's clock overstates,
        # a window too short) would show a rate above its bound.
        bound = max(bound, steady) if bound > 0 else bound
        while self._recent and self._recent[0][0] < now - self._recent_s:
            self._recent_tasks -= self._recent.popleft()[1]
        recent = self._recent_tasks / self._recent_s
        self._count_threads(now, threads)
        occupancy = {lane: {name: float(b[i] / ts[i]) if (ts := self.thread_s.get(lane)) is not None and ts[i] > 0
                            else 0.0 for i, name in enumerate(_PHASE_NAMES)}
                     for lane, b in sorted(self.busy.items())}
        lat = self._lat[: min(self._lat_n, len(self._lat))]
        p50, p99 = (float(np.percentile(lat, 50)), float(np.percentile(lat, 99))) if len(lat) else (0.0, 0.0)
        # Serial share: event-loop bookkeeping and source enumeration (one of each, whatever the
        # lane count) against the lanes' bottleneck work, which more lanes would split.
        parallel = sum(max(b) for b in self.busy.values())
        s = self.serial_s / (self.serial_s + parallel) if self.serial_s + parallel > 0 else 0.0
        device_busy, by_lane = self.device.busy(None if finished else now)
        headroom, lanes_limit = self._headroom(steady, cpu_cap, device_busy)
        base = amdahl_speedup(s, self.lanes)
        amdahl = {f"p={p if not math.isinf(p) else 'inf'}": min(amdahl_speedup(s, p) / base, headroom)
                  for p in (self.lanes + 1, 2 * self.lanes, math.inf)}
        bottleneck_phase, bottleneck = self._bottleneck(caps_now, cpu_cap, threads, means, device_busy, cores, steady,
                                                        elapsed)
        return Figures(
            elapsed_s=elapsed, tasks_done=done, tasks_failed=failed, batches=self.batches,
            throughput_tasks_s=done / elapsed, throughput_bytes_s=self.nbytes / elapsed,
            steady_tasks_s=steady, recent_tasks_s=recent, latency_p50_s=p50, latency_p99_s=p99,
            mean_phase_s={name: float(means[i]) for i, name in enumerate(_PHASE_NAMES)},
            bound_tasks_s=bound, serial_bound_tasks_s=serial_bound,
            overlap_efficiency=steady / bound if bound > 0 else 0.0,
            occupancy=occupancy, stall_s=dict(self.stall_s), divergence=divergence,
            max_divergence=max_divergence, serial_fraction=s, amdahl=amdahl,
            device_busy=device_busy, device_busy_by_lane=by_lane,
            cpu_phase_s={name: float(cpu_means[i]) for i, name in enumerate(_PHASE_NAMES)},
            bottleneck_phase=bottleneck_phase, bottleneck=bottleneck, lanes_limit=lanes_limit,
        )

    def _headroom(self, steady: float, cpu_cap: float, device_busy: float) -> tuple[float, str]:
        """The most any number of lanes could multiply the rate by, whatever Amdahl's law says, and
        what holds it: ``cores`` (every lane's host work shares them) or ``device`` (a compute
        that runs on a device, not on the host's CPU, is busy that share of the time). Lanes add
        streams and threads, not cores or devices."""
        limits = [(math.inf, "")]
        if steady > 0 and math.isfinite(cpu_cap):
            limits.append((max(1.0, cpu_cap / steady), "cores"))
        on_device = self.cpu_sum[_COMPUTE] < _BURNS * self.phase_sum[_COMPUTE]
        if on_device and device_busy > 0:
            limits.append((max(1.0, 1.0 / device_busy), "device"))
        return min(limits)

    def _count_threads(self, now: float, threads: LaneThreads) -> None:
        """Add the thread-seconds since the last reading (from the first batch's start), at the
        threads each phase has now: readings come a tenth of a second apart, and the tuner changes a
        count seldom, so the sum is the time each phase's threads were there."""
        for lane, start in self._lane_start.items():
            dt = now - max(self._counted_to.get(lane, 0.0), start)
            if dt <= 0:
                continue
            self._counted_to[lane] = now
            ts = self.thread_s.setdefault(lane, np.zeros(len(RUN_PHASES)))
            ht = threads.get(lane)
            for i in range(len(RUN_PHASES)):
                ts[i] += dt * (ht[_HOST[i]].now if ht is not None and i in _HOST else 1)

    def _bottleneck(self, caps_now: dict[int, float], cpu_cap: float, threads: LaneThreads, means: np.ndarray,
                    device_busy: float, cores: float, steady: float, elapsed: float) -> tuple[str, str]:
        """The phase with the least capacity now (or the cores, when the CPU all phases need is the
        bound and no one phase needs most of it; or ``engine`` when even that phase idled most of the
        time at the ``steady`` rate), and its sentence."""
        if not caps_now:
            return "", ""
        if device_busy >= DEVICE_BOUND:
            # Nothing else can hold back a device this busy (the phases' capacities are estimates:
            # a device busy this much of the time has no room left for a faster host).
            return "compute", describe_bottleneck("compute", float(means[_COMPUTE]) * 1e3, None, device_busy, cores)
        i = min(caps_now, key=caps_now.__getitem__)
        burning = int(np.argmax(self.w_cpu))
        waits = DeviceWaits(self.stall_s.get("memory", 0.0), self.stall_s.get("backpressure", 0.0),
                            self.serial_s / self.batches * 1e3 if self.batches else 0.0)
        if self.batches >= _STEADY_MIN and steady < _IDLE_PHASES * min(caps_now[i], cpu_cap):
            # Neither a phase nor the cores: what hands the phases work (the loop, the inputs) holds them
            # (judged on a steady window: before one, the rate counts the run's start).
            return "engine", describe_engine_bound(_PHASE_NAMES[i], steady / caps_now[i], device_busy, waits, elapsed)
        if cpu_cap < caps_now[i]:
            if burning not in _HOST or self.w_cpu[burning] < 0.5 * sum(self.w_cpu):
                return "cpu", (f"bottleneck: CPU ({cores:g} cores busy with host and stage work); device busy "
                               f"{device_busy:.0%}: add cores, or cheaper loading/decoding")
            i = burning
        first = threads.get(min(threads)) if threads else None
        ht = None
        if i in _HOST:
            ht = first[_HOST[i]] if first is not None else HostThreads(1, 1, "pinned")
            if i == burning and cpu_cap <= caps_now[i] * (1 + 1e-9) and ht.why in ("tuned", "saturated"):
                ht = HostThreads(ht.now, ht.now, "cpu", ht.processes)  # the cores, not the threads, hold it
        text = describe_bottleneck(_PHASE_NAMES[i], float(means[i]) * 1e3, ht, device_busy, cores,
                                   self.stall_s.get("memory", 0.0) > 0, waits)
        return _PHASE_NAMES[i], text

    def _bound(self, threads: LaneThreads, cores: float) -> tuple[float, dict[int, float], float]:
        """The bound (tasks/s), each phase's capacity with its threads now (tasks/s, all lanes),
        and the cores' capacity, over the steady window; zeros before it has a batch."""
        bound = 0.0
        caps_now = dict.fromkeys(range(len(RUN_PHASES)), 0.0)
        for lane, tasks in self.w_tasks.items():
            busy, union = self.w_busy[lane], self.w_union[lane]
            lane_cpu = self.w_lane_cpu.get(lane) or _zeros()
            ht = threads.get(lane)
            most = math.inf
            for i in range(len(RUN_PHASES)):
                if busy[i] <= 0:
                    caps_now[i] = math.inf
                    continue
                per_thread = tasks / busy[i]
                h = ht[_HOST[i]] if i in _HOST and ht is not None else None
                now_k = h.now if h is not None else 1
                caps_now[i] += now_k * per_thread
                most = min(most, _capacity(h, tasks, busy[i], union[i], lane_cpu[i], cores))
            bound += most if math.isfinite(most) else 0.0
        cpu = float(sum(self.w_cpu))
        cpu_cap = cores * sum(self.w_tasks.values()) / cpu if cpu > 0 else math.inf
        if not self.w_tasks:
            return 0.0, {}, cpu_cap
        return min(bound, cpu_cap), {i: c for i, c in caps_now.items() if math.isfinite(c)}, cpu_cap


def _capacity(h: HostThreads | None, tasks: int, busy: float, union: float, cpu: float, cores: float) -> float:
    """Tasks/s one phase of one lane could reach over the window, never below what it did.

    A device stream, or a host phase shown not to speed up with threads: its tasks over the time
    it had a job running (<= the window). A host phase that burns CPU (its CPU time at least
    ``_BURNS`` of its busy time): the cores over its CPU time per task (its CPU time fits in
    cores x window). One that waits: its threads (the most it may have, or has had) over its busy
    time per task (busy <= threads x window)."""
    if h is None or (h.why == "saturated" and cpu < _BURNS * busy):
        return tasks / union
    if cpu >= _BURNS * busy:
        return cores * tasks / cpu
    return h.cap * tasks / busy


class _DeviceBusy:
    """The compute phase's busy time, per lane and as the union over lanes.

    A lane's compute intervals arrive in order and never overlap; across lanes they interleave.
    An interval that starts before every lane's latest start can meet no later one, so it is
    merged for good; the few after that wait, sorted, for the next reading."""

    def __init__(self) -> None:
        self.lane_busy: dict[int, float] = {}
        self.lane_first: dict[int, float] = {}
        self.lane_last_start: dict[int, float] = {}
        self.lane_last_end: dict[int, float] = {}
        self.last_end = 0.0
        self.first = 0.0
        self._pending: list[tuple[float, float]] = []
        self._merged = 0.0
        self._merged_end = 0.0

    def add(self, lane: int, t0: float, t1: float) -> None:
        t1 = max(t0, t1)
        self.lane_busy[lane] = self.lane_busy.get(lane, 0.0) + (t1 - t0)
        self.lane_first.setdefault(lane, t0)
        self.lane_last_start[lane] = t0
        self.lane_last_end[lane] = max(self.lane_last_end.get(lane, 0.0), t1)
        self.first = t0 if not self.first else min(self.first, t0)
        self.last_end = max(self.last_end, t1)
        self._pending.append((t0, t1))
        if len(self._pending) > _MERGE_EVERY:
            self._merge(min(self.lane_last_start.values()))

    def _merge(self, horizon: float) -> None:
        self._pending.sort()
        keep = []
        for t0, t1 in self._pending:
            if t0 >= horizon:
                keep.append((t0, t1))
                continue
            start = max(t0, self._merged_end)
            if t1 > start:
                self._merged += t1 - start
            self._merged_end = max(self._merged_end, t1)
        self._pending = keep

    def busy(self, now: float | None) -> tuple[float, dict[str, float]]:
        """Device busy over all lanes and per lane, up to ``now`` (None: up to the last compute)."""
        if not self.first:
            return 0.0, {}
        end = self.last_end if now is None else max(now, self.last_end)
        self._merge(min(self.lane_last_start.values()))
        union = self._merged
        tail_end = self._merged_end
        for t0, t1 in self._pending:  # not merged for good: counted for this reading only
            start = max(t0, tail_end)
            if t1 > start:
                union += t1 - start
            tail_end = max(tail_end, t1)
        by_lane = {str(lane): min(1.0, b / max(1e-9, (self.lane_last_end[lane] if now is None else end)
                                                  - self.lane_first[lane]))
                   for lane, b in sorted(self.lane_busy.items())}
        return min(1.0, union / max(1e-9, end - self.first)), by_lane


_IDLE_PHASES = 0.5
"""A bottleneck phase that ran less than this share of the time at the steady rate holds nothing."""


def _zeros() -> list[float]:
    return [0.0] * len(RUN_PHASES)


def _row(rows: dict[int, list[float]], lane: int) -> list[float]:
    """``rows[lane]``, a phase-long row of zeros the first time (made only then: this runs per batch)."""
    row = rows.get(lane)
    if row is None:
        row = rows[lane] = _zeros()
    return row
