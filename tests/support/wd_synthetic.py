"""A deterministic synthetic snapshot stream, for the control room's benchmarks and snapshot tests.

The decision this module protects: the screen shows only what a snapshot carries, so a recorded
stream must be a pure function of ``(seed, t)``: the same call gives the same snapshot, and one
for a million tasks costs a few milliseconds. State columns are filled by slicing, never per task;
keys are built once and shared by every snapshot, as the engine's append-only key list is.

The model is a conveyor. Tasks leave the queue in key order, in blocks of ``lanes * batch``; each
block spends one period in each phase, so a task makes six transitions (queued → fill → h2d →
compute → d2h → sink → done) and the period is ``6 · lanes · batch / transitions_per_s``. Every
``stalled_every``-th task sticks at the phase its stall reason belongs to, once the conveyor
would have moved it on (memory and control in the queue, worker_lost and hung in compute,
backpressure in d2h); every ``failed_every``-th task fails in compute. Lanes record batches whose
phases overlap, with compute the bottleneck, so the timeline has bars and idle gaps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from warpdeck.engine.api import (
    BatchRecord,
    ControlView,
    Counts,
    DetailState,
    DeviceWaits,
    EngineSnapshot,
    FeederView,
    Figures,
    LaneView,
    Phase,
    PhaseName,
    SlotState,
    SlotView,
    StalledTask,
    StallName,
    StallReason,
    State,
    TaskAttempt,
    TaskDetail,
    TaskFailure,
    TaskView,
    WorkerState,
    WorkerView,
    describe_bottleneck,
)

__all__ = ["SyntheticRun"]

_STEPS = 6
_PHASES: tuple[PhaseName, ...] = tuple(p.label for p in Phase if p)
_START = np.array([0.0, 0.6, 0.9, 1.87, 2.15])
"""Per phase: where it starts in a batch's slot and its mean length, in periods. Compute is the bottleneck; each phase
ends before the next one starts, and before the same phase of the next batch, even at the longest jitter (x1.05)."""
_SHARE = np.array([0.55, 0.25, 0.92, 0.25, 0.40])
_STALL_AT = np.array([0, 0, 0, Phase.D2H, Phase.COMPUTE, Phase.COMPUTE], np.int64)
"""Where a stall holds a task, by reason (0: queued; otherwise the running phase)."""
_NOTES = ("", "source starved: input not ready", "paused by the operator", "sink full: output cannot move",
          "worker gpu-c/cuda:1 stopped heartbeating", "compute exceeded its 30 s deadline")
_TASK_BYTES = 3 * 224 * 224
_TRACEBACK = ('  File "stages/decode.py", line 41, in stage\n    out[...] = xp.asarray(img)[..., :3]\n'
              "ValueError: could not broadcast input array from shape (224,224,4) into shape (224,224,3)\n")


_Scalar = TypeVar("_Scalar", bound=np.generic)


def _frozen(a: npt.NDArray[_Scalar]) -> npt.NDArray[_Scalar]:
    a.setflags(write=False)
    return a


class SyntheticRun:
    """A run of ``tasks`` synthetic tasks, ``transitions_per_s`` state changes a second over
    ``lanes`` lanes; ``snapshot_at(t)`` is the engine as of ``t`` seconds in. Keys are ``prefix``
    and the task's number in ``digits`` digits (``img-0000123``)."""

    T0 = 1000.0
    """The synthetic engine's start on the (fake) perf_counter clock the timeline uses."""

    def __init__(self, tasks: int, lanes: int = 2, *, seed: int = 0, transitions_per_s: float = 10_000,
                 stalled_every: int = 499, failed_every: int = 997, batch: int = 64, depth: int = 3,
                 prefix: str = "img-", digits: int = 7) -> None:
        self.n, self.lanes, self.batch, self.depth = tasks, lanes, batch, depth
        self._lost = 1 / stalled_every + 1 / failed_every
        self.block = lanes * batch
        self.period = _STEPS * self.block / transitions_per_s
        rng = np.random.default_rng(seed)
        self.prefix = prefix
        self.keys = [f"{prefix}{i:0{digits}d}" for i in range(tasks)]
        self._stall_rows = np.arange(int(rng.integers(stalled_every)), tasks, stalled_every)
        self._stall_reason = (np.arange(len(self._stall_rows)) % 5 + 1).astype(np.int8)
        failed = np.arange(int(rng.integers(failed_every)), tasks, failed_every)
        self._fail_rows = failed[~np.isin(failed, self._stall_rows)]
        self._retried = self._fail_rows[1::3] + 1  # a neighbour of every third failure needed a retry
        self._jitter = rng.uniform(0.8, 1.05, size=(1024, 5))
        self._records: dict[tuple[int, int], BatchRecord] = {}

    # -- the conveyor ------------------------------------------------------------------------------
    def _done_end(self, t: float) -> int:
        """Rows before this one have left the conveyor (done, or failed/stalled on the way)."""
        return min(self.n, int(t / self.period) * self.block)

    def _stage(self, rows: npt.NDArray[np.int64], done_end: int) -> npt.NDArray[np.int64]:
        """Where the conveyor alone would have each row: 0 queued, 1..5 a phase, 6 done."""
        return np.where(rows < done_end, 6, np.clip(5 - (rows - done_end) // self.block, 0, 5))

    def _reached(self, rows: npt.NDArray[np.int64], stage: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """When each row reached ``stage`` (seconds since start)."""
        # (numpy's stubs make this product Any: the annotation says what it is)
        reached: npt.NDArray[np.float64] = np.maximum(0, rows // self.block - 5 + stage) * self.period
        return reached

    def _columns(self, t: float) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int8], npt.NDArray[np.int8],
                                          npt.NDArray[np.int16]]:
        """The task table's state, phase, stall and attempt columns as of ``t``."""
        n, d = self.n, self._done_end(t)
        state = np.full(n, State.QUEUED, np.int8)
        phase = np.zeros(n, np.int8)
        state[:d] = State.DONE
        state[d:d + 5 * self.block] = State.RUNNING
        for p in range(1, 6):
            phase[d + (5 - p) * self.block:d + (6 - p) * self.block] = p
        stall = np.zeros(n, np.int8)
        attempt = np.ones(n, np.int16)
        attempt[self._retried[self._retried < n]] = 2
        rows, at = self._active_stalls(d)
        reason = self._stall_reason[at]
        hold = _STALL_AT[reason]
        state[rows] = np.where(hold > 0, State.RUNNING, State.QUEUED)
        phase[rows], stall[rows] = hold, reason
        failed = self._failed(d)
        state[failed], phase[failed] = State.FAILED, Phase.NONE
        return state, phase, stall, attempt

    def _active_stalls(self, done_end: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Stalled rows (the conveyor has passed their stall point) and their index among stall rows."""
        at = np.flatnonzero(self._stage(self._stall_rows, done_end) > _STALL_AT[self._stall_reason])
        return self._stall_rows[at], at

    def _tally(self, done_end: int, stalled: npt.NDArray[np.int64],
               reason: npt.NDArray[np.int8]) -> npt.NDArray[np.int64]:
        """Tasks per ``state * 6 + phase``, from the conveyor's ranges and the few rows off it (a
        bincount over a million rows would cost more than the rest of the snapshot)."""
        by = np.zeros(30, np.int64)
        edges = np.clip(done_end + np.arange(6) * self.block, 0, self.n)
        by[State.RUNNING * 6 + np.arange(5, 0, -1)] = np.diff(edges)
        by[State.DONE * 6] = done_end
        by[State.QUEUED * 6] = self.n - edges[-1]
        off = np.concatenate([stalled, self._failed(done_end)])
        np.subtract.at(by, self._code(self._stage(off, done_end)), 1)
        hold = _STALL_AT[reason]
        np.add.at(by, np.where(hold > 0, State.RUNNING * 6 + hold, State.QUEUED * 6), 1)
        by[State.FAILED * 6] += len(off) - len(stalled)
        return by

    @staticmethod
    def _code(stage: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """A conveyor stage as ``state * 6 + phase``."""
        return np.where(stage == 6, State.DONE * 6, np.where(stage > 0, State.RUNNING * 6 + stage, State.QUEUED * 6))

    def _failed(self, done_end: int) -> npt.NDArray[np.int64]:
        """Rows that have failed: the conveyor took them past compute."""
        return self._fail_rows[self._stage(self._fail_rows, done_end) > Phase.COMPUTE]

    # -- the snapshot ------------------------------------------------------------------------------
    def snapshot_at(self, t: float, seq: int | None = None) -> EngineSnapshot:
        """The engine as of ``t`` seconds in (``seq`` defaults to the milliseconds of ``t``)."""
        state, phase, stall, attempt = self._columns(t)
        d = self._done_end(t)
        rows, at = self._active_stalls(d)
        reason = self._stall_reason[at]
        by, stalled_n = self._tally(d, rows, reason), np.bincount(reason, minlength=6)
        counts = Counts(queued=int(by[0]), running={name: int(by[6 + i + 1]) for i, name in enumerate(_PHASES)},
                        done=int(by[12]), failed=int(by[18]), cancelled=int(by[24]),
                        stalled={r.label: int(stalled_n[r]) for r in StallReason if r},
                        total=self.n, expected=self.n)
        since = self._reached(rows, _STALL_AT[reason] + 1)
        # Weighted, the counts are float64 (numpy's stubs type every bincount as intp).
        stall_s = np.asarray(np.bincount(reason, weights=t - since, minlength=6), np.float64)
        stalled = tuple(StalledTask(self.keys[r], StallReason(s).label, t - float(w),
                                    State(int(state[r])).label, Phase(int(phase[r])).label, _NOTES[s])
                        for r, s, w in zip(rows[:500].tolist(), reason[:500].tolist(), since[:500].tolist(),
                                           strict=True))
        failures = tuple(TaskFailure(self.keys[r], "ValueError: could not broadcast input array", 1)
                         for r in self._failed(d).tolist())
        timeline = self._timeline(t)
        view = TaskView(self.keys, _frozen(state), _frozen(phase), _frozen(stall), _frozen(attempt))
        return EngineSnapshot(
            seq=round(t * 1000) if seq is None else seq, t=t, t0=self.T0, pipeline="synthetic-img",
            status="running", backend="numpy", backend_reason="synthetic stream: no engine behind it",
            device="cpu", counts=counts, tasks=view, stalled=stalled, lanes=self._lanes(t), feeder=self._feeder(d),
            timeline=timeline, figures=self._figures(t, counts, stall_s), failures=failures,
            workers=self._workers(t, counts), control=self._control(t),
        )

    def stream(self, dt: float, count: int | None = None) -> Iterator[EngineSnapshot]:
        """Snapshots at ``dt``, 2·dt, … (``count`` of them, or without end), seq 1, 2, …"""
        i = 1
        while count is None or i <= count:
            yield self.snapshot_at(i * dt, seq=i)
            i += 1

    # -- lanes, timeline, figures, workers -----------------------------------------------------------
    @staticmethod
    def _control(t: float) -> ControlView:
        """A plane on a shared broker that has dropped a few malformed messages by now."""
        return ControlView(broker="mqtt://broker.lab:1883", connected=True, commands_applied=int(t // 5),
                           commands_refused={"expired": 1} if t > 8 else {}, dropped={"invalid": int(t // 3)},
                           reconnects=0)

    def _record(self, j: int, lane: int) -> BatchRecord:
        """Batch ``j`` of ``lane``: it ends a little before its block leaves the conveyor."""
        rec = self._records.get((j, lane))
        if rec is None:
            p = self.period
            start = self.T0 + (j - 1.6) * p - lane * p * 0.3 / self.lanes
            lengths = _SHARE * self._jitter[(j * self.lanes + lane) % len(self._jitter)] * p
            phases = tuple((start + a * p, start + a * p + w) for a, w in zip(_START.tolist(), lengths.tolist(),
                                                                            strict=True))
            rec = BatchRecord(j * self.lanes + lane, lane, j % self.depth, self.batch, "uint8(3, 224, 224)",
                              start - 0.1 * p, phases, True, self.batch * _TASK_BYTES)
            self._records[j, lane] = rec
        return rec

    def _timeline(self, t: float) -> tuple[BatchRecord, ...]:
        """The last 512 finished batches in the order they finished, as the engine keeps them."""
        last = min(int(t / self.period), math.ceil(self.n / self.block) - 1)
        first = max(2, last - 512 // self.lanes - 2)
        now = self.T0 + t
        recs = [r for j in range(first, last + 1) for lane in range(self.lanes)
                if (r := self._record(j, lane)).end <= now]
        if len(self._records) > 4096:  # only the window is ever asked for again
            self._records = {k: v for k, v in self._records.items() if k[0] >= first}
        recs.sort(key=lambda r: r.end)
        return tuple(recs[-512:])

    def _lanes(self, t: float) -> tuple[LaneView, ...]:
        j = int(t / self.period)
        names: tuple[SlotState, ...] = ("filling", "h2d", "computing")
        done = max(0, j - 2)
        return tuple(LaneView(lane, self.depth, "filling", False, done, done * self.batch * _TASK_BYTES,
                              tuple(SlotView(s, names[s % 3], ((j + s) * self.lanes + lane,) * 2 + (-1, -1))
                                    for s in range(self.depth)))
                     for lane in range(self.lanes))

    def _feeder(self, done_end: int) -> FeederView:
        queued = max(0, self.n - done_end - 5 * self.block)
        return FeederView("running", min(queued, 8 * self.block), 2 * self.block, 8 * self.block, self.n,
                          True, True, 3)

    def _figures(self, t: float, c: Counts, stall_s: npt.NDArray[np.float64]) -> Figures:
        p, rate = self.period, self.block / self.period
        means = _SHARE * self._jitter.mean(axis=0) * p
        bound = self.lanes * self.batch / float(means.max())
        steady = rate * (1 - self._lost)
        serial = 0.04
        base = 1 / (serial + (1 - serial) / self.lanes)
        amdahl = {f"p={q if q != math.inf else 'inf'}": (1 / (serial + (1 - serial) / q)) / base
                  for q in (self.lanes + 1, 2 * self.lanes, math.inf)}
        occupancy: dict[int, dict[str, float]] = {
            lane: {name: float(m / p) * (1 - 0.02 * lane) for name, m in zip(_PHASES, means, strict=True)}
            for lane in range(self.lanes)}
        batches = c.done // self.batch
        busy = sum(occ["compute"] for occ in occupancy.values()) / self.lanes
        return Figures(
            elapsed_s=t, tasks_done=c.done, tasks_failed=c.failed, batches=batches,
            throughput_tasks_s=c.done / max(t, 1e-9), throughput_bytes_s=c.done * _TASK_BYTES / max(t, 1e-9),
            steady_tasks_s=steady, recent_tasks_s=rate * (0.95 + 0.05 * math.sin(t)),
            latency_p50_s=float(_START[-1] + _SHARE[-1]) * p + 5 * p, latency_p99_s=9.5 * p,
            mean_phase_s={name: float(m) for name, m in zip(_PHASES, means, strict=True)},
            bound_tasks_s=bound, serial_bound_tasks_s=self.batch / float(means.sum()),
            overlap_efficiency=steady / bound, occupancy=occupancy,
            stall_s={r.label: float(stall_s[r]) for r in StallReason if r},
            divergence=1, max_divergence=2, serial_fraction=serial, amdahl=amdahl,
            device_busy=busy, device_busy_by_lane={str(lane): occ["compute"] for lane, occ in occupancy.items()},
            bottleneck_phase="compute",
            # The device waits for inputs as the stalled tasks do: a share of the run that grows with it.
            bottleneck=describe_bottleneck("compute", float(means[_PHASES.index("compute")]) * 1e3, None, busy, 2.0,
                                           waits=DeviceWaits(round(0.02 * t, 1), 0.0, 0.6)),
        )

    def _workers(self, t: float, c: Counts) -> tuple[WorkerView, ...]:
        """One online, one late, one dead worker: the workers screen's three cases."""
        batches = c.done // self.batch
        share = (c.done * 6 // 10, c.done * 4 // 10)
        return (
            WorkerView("gpu-a/cuda:0", WorkerState.ONLINE, "gpu-a", 4101, "cuda:0 H100", 1, self.lanes, self.lanes,
                       batches * 6 // 10, share[0], c.failed, 0.1 + 0.3 * (t * 2 % 1), 0.4, 93.0, 31_250.0, 81_559.0,
                       61.0, 512.0),
            WorkerView("gpu-b/cuda:0", WorkerState.LATE, "gpu-b", 4177, "cuda:0 H100", 1, self.lanes, 1,
                       batches * 4 // 10, share[1], 0, 1.6, 3.4, 71.0, 29_800.0, 81_559.0, 58.0, 431.0),
            WorkerView("gpu-c/cuda:1", WorkerState.DEAD, "gpu-c", 3990, "cuda:1 H100", 2, self.lanes, 0, 12,
                       12 * self.batch, 0, 5.0 + t, 16.0, None, None, None),
        )

    # -- detail ------------------------------------------------------------------------------------
    def detail(self, key: str, t: float) -> TaskDetail:
        """What the detail screen shows for ``key`` as of ``t`` (the same state as ``snapshot_at``)."""
        r = int(key.removeprefix(self.prefix))
        d = self._done_end(t)
        row = np.array([r])
        stage = int(self._stage(row, d)[0])
        state: DetailState = "queued"
        phase: PhaseName = "none"
        stall: StallName = "none"
        note, error, tb = "", "", ""
        if 0 < stage < 6:
            state, phase = "running", _PHASES[stage - 1]
        elif stage == 6:
            state = "done"
        hit = np.flatnonzero(self._stall_rows == r)
        if len(hit) and stage > _STALL_AT[self._stall_reason[hit[0]]]:
            reason = int(self._stall_reason[hit[0]])
            stall, note = StallReason(reason).label, _NOTES[reason]
            hold = int(_STALL_AT[reason])
            state, phase = ("running", _PHASES[hold - 1]) if hold else ("queued", "none")
        elif r in self._fail_rows and stage > Phase.COMPUTE:
            state, phase, error, tb = "failed", "none", _TRACEBACK.splitlines()[-1], _TRACEBACK
        attempt = 2 if r in self._retried else 1
        history = (TaskAttempt(1, "failed", float(self._reached(row, np.array([3]))[0]), "ValueError", _TRACEBACK),
                   ) if attempt == 2 else ()
        if state == "failed":
            history = (*history, TaskAttempt(attempt, "failed", float(self._reached(row, np.array([4]))[0]),
                                             "ValueError", _TRACEBACK))
        batch = r // self.batch if stage > 0 else -1
        return TaskDetail(key, state, phase, attempt, batch, stall, note, error, tb, history)
