"""Snapshot → telemetry frames, telemetry → snapshots, and the events a run's stream implies.

The decisions this module protects:
- A frame fits a slow link. At most ``FRAME_BUDGET`` bytes on the wire (DESIGN.md section 9: an
  attach over 1 Mbit/s; 16 KB at 1 M tasks and 10 k transitions/s), whatever the run: the frame is
  compressed JSON (``wire.encode_telemetry``), batch records are arrays and key samples runs
  (engine/control/compact.py), and when a frame would still pass its budget (long keys that do
  not follow one another, long failure reasons) its samples shrink, level by level (``LEVELS``),
  until it fits. What the samples leave out is counted in the frame.
- What the attached room draws is never sampled: counts, figures, lanes, feeder and workers are
  exact in every frame. Every frame stands alone (no deltas): at 10 k transitions a second every
  live column's head turns over between two frames, so a delta would save little, and a frame lost
  on the way (telemetry is QoS 0) would cost the attached room more than its bytes.
- Stalls are told per batch, not per task. They come from the run's event stream
  (engine/state/run_events.py), heard on the engine's loop and told on the plane's (``StallEvents``):
  a stall that holds a batch of 256 tasks is one event with its count, its batch and its lane.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Final, TypeVar

import numpy as np
import numpy.typing as npt

from warpdeck.engine.control.compact import ColumnName, PackedRecord, expand_keys, key_runs, pack_record, unpack_record
from warpdeck.engine.control.wire import Event, Telemetry, encode_telemetry
from warpdeck.engine.state.board_columns import CANCELLED, COLUMN_CODES, DONE, FAILED, QUEUED, STALLED
from warpdeck.engine.state.part_views import LinkView
from warpdeck.engine.state.read_only import read_only
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.run_events import RunEvent, StallEvent, WorkerGone, WorkerWaiting
from warpdeck.engine.state.snapshot import ControlView, EngineSnapshot, TaskDetail, TaskFailure, TaskView
from warpdeck.engine.state.task_states import RUN_PHASES, Phase, StallReason, State

__all__ = [
    "COLUMN_SAMPLE",
    "FRAME_BUDGET",
    "FROM_TELEMETRY",
    "LEVELS",
    "NOT_SAMPLED",
    "RECORDS_PER_FRAME",
    "EventTracker",
    "StallEvents",
    "TelemetryFrames",
    "detail_from",
    "snapshot_from",
    "summarize",
]

COLUMN_SAMPLE: Final = 200
"""Keys sent per board column at most: more than any terminal shows at once."""
FRAME_BUDGET: Final = 12 * 1024
"""The most bytes a frame may take on the wire (compressed): under the 16 KB target, with room for the MQTT header and a
figure that grew."""
LEVELS: Final = ((COLUMN_SAMPLE, 200, 100), (100, 100, 50), (50, 50, 20), (20, 20, 5))
"""Samples per frame, level by level: keys per column, stalled tasks, failures. A frame takes the first level that fits
its budget (the last one whatever it takes)."""
RECORDS_PER_FRAME: Final = 128
"""Batch records per frame at most (the newest): at batch 1 and 10 k transitions/s, 400 finish between two frames, more
than a terminal's timeline can tell apart."""
_TEXT = 4096
_RETRY_LARGEST = 16
"""Every this many frames, a frame tries the largest samples again (else it starts where the last fitted)."""
_REASON = 512
"""A failure's reason on the wire (its whole reason and traceback stay in the engine's detail)."""
_FAILED_MEMORY = 100_000

_SAMPLED: dict[ColumnName, tuple[int, bool]] = {
    "queued": (QUEUED, False), "fill": (1, False), "h2d": (2, False), "compute": (3, False),
    "d2h": (4, False), "sink": (5, False), "stalled": (STALLED, False), "failed": (FAILED, True),
    "cancelled": (CANCELLED, True), "done": (DONE, True)}
"""Telemetry's columns, each with its board column code (engine/state/board_columns.py), and whether its sample is the
newest (finished columns) or the oldest (the head of a live one)."""


@dataclass(frozen=True, slots=True)
class _Parts:
    """What every level of one frame shares: the key samples at their largest, the records."""

    columns: dict[ColumnName, list[str]]
    totals: dict[ColumnName, int]
    """Every column's size (the samples are a few of them): an attached board's titles."""
    records: tuple[PackedRecord, ...]
    records_left_out: int
    newest: float
    """The newest record's end among those looked at (``perf_counter``): the next frame's ``since``."""


def _first(codes: npt.NDArray[np.uint8], code: int, k: int, newest: bool) -> npt.NDArray[np.int64]:
    """The first (``newest``: the last) ``k`` rows of ``code`` in table order. One pass finds where
    they begin; only the rows from there on are listed (a million queued rows are never listed)."""
    n = len(codes)
    hit = (codes[::-1] if newest else codes) == code
    at = int(hit.argmax())
    if not hit[at]:
        return np.zeros(0, np.int64)
    found, got, step = [], 0, 4 * k
    while got < k and at < n:
        rows = np.flatnonzero(hit[at:at + step]) + at
        found.append(rows)
        got, at, step = got + len(rows), at + step, step * 4
    first = np.concatenate(found)[:k]
    return (n - 1 - first)[::-1] if newest else first


def _codes(tv: TaskView, n: int) -> npt.NDArray[np.uint8]:
    """Each task's board column code: ``board_columns.column_codes``'s table, indexed in place
    (its version makes four temporary arrays: at a million tasks, a third of a frame's cost)."""
    code, spare = np.empty(n, np.uint8), np.empty(n, np.uint8)
    np.left_shift(tv.state[:n].view(np.uint8), 3, out=code)
    np.bitwise_and(code, 0x3F, out=code)
    np.bitwise_and(tv.phase[:n].view(np.uint8), 7, out=spare)
    np.bitwise_or(code, spare, out=code)
    np.not_equal(tv.stall[:n], 0, out=spare.view(np.bool_))
    np.left_shift(spare, 6, out=spare)
    np.bitwise_or(code, spare, out=code)
    return np.take(COLUMN_CODES, code, out=code)


def _parts(snap: EngineSnapshot, since: float) -> _Parts:
    tv = snap.tasks
    n = len(tv)
    columns: dict[ColumnName, list[str]] = {}
    totals: dict[ColumnName, int] = {}
    if n:
        codes = _codes(tv, n)
        sizes = np.bincount(codes, minlength=256)
        totals = {name: int(sizes[code]) for name, (code, _) in _SAMPLED.items()}
        # The columns other than queued and done are few rows (a few lanes' batches): one scan finds them.
        few = np.flatnonzero((codes != QUEUED) & (codes != DONE))
        few_codes = codes[few]
        for name, (code, newest) in _SAMPLED.items():
            if code in (QUEUED, DONE):
                rows = _first(codes, code, COLUMN_SAMPLE, newest)
            else:
                rows = few[few_codes == code]
                rows = rows[-COLUMN_SAMPLE:] if newest else rows[:COLUMN_SAMPLE]
            columns[name] = [tv.keys[r] for r in rows.tolist()]
    fresh = [(r, end) for r in snap.timeline if (end := r.end) > since]
    kept = fresh[-RECORDS_PER_FRAME:]
    return _Parts(columns, totals, tuple(pack_record(r, snap.t0) for r, _ in kept), len(fresh) - len(kept),
                  max((end for _, end in fresh), default=since))


def _telemetry(snap: EngineSnapshot, parts: _Parts, control: ControlView | None, level: tuple[int, int, int],
               sent: float, frame: int) -> Telemetry:
    keys, n_stalled, n_failures = level
    stalled = tuple(dataclasses.replace(s, key=s.key[:_TEXT], stalled_s=round(s.stalled_s, 3), note=s.note[:_TEXT])
                    for s in snap.stalled[:n_stalled])
    failures = tuple(TaskFailure(f.key[:_TEXT], f.reason[:_REASON], f.attempt)
                     for f in (snap.failures[-n_failures:] if n_failures else ()))
    columns = {name: key_runs(sample[-keys:] if _SAMPLED[name][1] else sample[:keys])
               for name, sample in parts.columns.items()}
    c = snap.counts
    return Telemetry(
        seq=snap.seq, t=snap.t, pipeline=snap.pipeline, status=snap.status, backend=snap.backend,
        backend_reason=snap.backend_reason[:_TEXT], device=snap.device, counts=c, figures=snap.figures,
        lanes=snap.lanes, feeder=snap.feeder, workers=snap.workers, stalled=stalled, failures=failures,
        timeline=parts.records, columns=columns, column_totals=parts.totals,
        control=control if control is not None else snap.control,
        outage=snap.outage, stalled_left_out=max(0, sum(c.stalled.values()) - len(stalled)),
        failures_left_out=max(0, c.failed - len(failures)), records_left_out=parts.records_left_out,
        sent=sent, frame=frame)


def summarize(snap: EngineSnapshot, since: float, control: ControlView | None = None, *, level: int = 0,
              sent: float = 0.0, frame: int = 0) -> Telemetry:
    """Telemetry for ``snap`` with the samples of ``LEVELS[level]``; ``since`` is the perf_counter
    time of the previous message's newest batch record (only newer records are sent)."""
    return _telemetry(snap, _parts(snap, since), control, LEVELS[level], sent, frame)


class TelemetryFrames:
    """The plane's telemetry, frame after frame: each the largest level of samples that fits
    ``budget`` bytes, compressed. Keeps which records were sent and how many frames."""

    def __init__(self, budget: int = FRAME_BUDGET) -> None:
        self.budget = budget
        self.since = 0.0
        self.frames = 0
        self.level = 0
        """The last frame's level (an index of ``LEVELS``) and size on the wire."""
        self.size = 0

    def frame(self, snap: EngineSnapshot, control: ControlView | None = None) -> bytes:
        """The next frame's bytes on the wire, for ``snap``."""
        parts = _parts(snap, self.since)
        sent = time.time()
        # From the level the last frame fitted at (frames change slowly: one encode, not two), and
        # from the largest every ``_RETRY_LARGEST`` frames, in case the run's frames have shrunk.
        first = 0 if self.frames % _RETRY_LARGEST == 0 else self.level
        for level in range(first, len(LEVELS)):
            body = encode_telemetry(_telemetry(snap, parts, control, LEVELS[level], sent, self.frames))
            self.level, self.size = level, len(body)
            if len(body) <= self.budget:
                break
        self.since, self.frames = parts.newest, self.frames + 1
        return body


_N = TypeVar("_N", bound=np.generic)
_PHASE_OF = {p.label: p for p in RUN_PHASES}
_STALL_OF = {r.label: r for r in StallReason if r}


def snapshot_from(tel: Telemetry, timeline: tuple[BatchRecord, ...] | None = None,
                  link: LinkView | None = None) -> EngineSnapshot:
    """An ``EngineSnapshot`` an attached control room can draw: counts, figures, lanes and workers
    are exact; the task table holds the sampled keys of each board column, so unlike the engine's
    own its rows are not stable: from one frame to the next a row holds whichever key the sample
    put there (a reader that follows a task across snapshots follows its key). ``timeline`` is the
    batch records gathered from earlier telemetry (each message carries only the new ones; None:
    this message's); their times, like ``t``, are seconds since the engine started (``t0`` 0)."""
    rows: list[tuple[str, int, int, int]] = []  # key, state, phase, stall
    stalled = {s.key: s for s in tel.stalled}
    for column, runs in tel.columns.items():
        if column not in _SAMPLED:  # a column a later build samples
            continue
        for key in expand_keys(runs):
            if column == "queued":
                rows.append((key, State.QUEUED, Phase.NONE, StallReason.NONE))
            elif column in _PHASE_OF:
                rows.append((key, State.RUNNING, _PHASE_OF[column], StallReason.NONE))
            elif column == "stalled":
                s = stalled.get(key)
                if s is None:  # sampled in the column, its detail left out of ``stalled``
                    rows.append((key, State.QUEUED, Phase.NONE, StallReason.CONTROL))
                else:
                    rows.append((key, State.RUNNING if s.state == "running" else State.QUEUED,
                                 _PHASE_OF.get(s.phase, Phase.NONE), _STALL_OF.get(s.reason, StallReason.CONTROL)))
            else:
                rows.append((key, {"done": State.DONE, "failed": State.FAILED}.get(column, State.CANCELLED),
                             Phase.NONE, StallReason.NONE))
    failed = {f.key: f.attempt for f in tel.failures}
    keys = [r[0] for r in rows]
    state = [r[1] for r in rows]
    # Attempts are numbered from 1; telemetry carries them for failures only.
    attempt = [failed.get(k, 1) if s == State.FAILED else 1 for k, s in zip(keys, state, strict=True)]
    view = TaskView(keys, _ro(np.array(state, np.int8)), _ro(np.array([r[2] for r in rows], np.int8)),
                    _ro(np.array([r[3] for r in rows], np.int8)), _ro(np.array(attempt, np.int16)))
    records = timeline if timeline is not None else tuple(unpack_record(p) for p in tel.timeline)
    return EngineSnapshot(
        seq=tel.seq, t=tel.t, t0=0.0, pipeline=tel.pipeline, status=tel.status, backend=tel.backend,
        backend_reason=tel.backend_reason, device=tel.device, counts=tel.counts, tasks=view, stalled=tel.stalled,
        lanes=tel.lanes, feeder=tel.feeder, timeline=records, figures=tel.figures,
        failures=tel.failures, workers=tel.workers, control=tel.control, outage=tel.outage, link=link,
        column_totals=read_only(tel.column_totals) if tel.column_totals else None)


FROM_TELEMETRY = "from telemetry: the task's history and traceback stay with the engine"
"""What an attached detail says of where it comes from."""
NOT_SAMPLED = (f"not among the tasks telemetry samples (at most {COLUMN_SAMPLE} per board column, fewer when a"
               " frame would pass its budget): its detail stays with the engine; a command naming it is answered"
               " by the engine")


def detail_from(snap: EngineSnapshot, key: str) -> TaskDetail:
    """A task's detail as far as an attached snapshot (``snapshot_from``) tells it: failures carry
    their reason and attempt, stalled tasks their stall, sampled keys their state and phase. A key
    outside all of them is not called unknown (telemetry never carries the engine's table): its
    state is "unknown" and ``note`` says why."""
    for f in reversed(snap.failures):
        if f.key == key:
            return TaskDetail(key, "failed", "none", f.attempt, -1, "none", "", f.reason, "", (), note=FROM_TELEMETRY)
    for st in snap.stalled:
        if st.key == key:
            return TaskDetail(key, st.state, st.phase, 1, -1, st.reason, st.note, "", "", (), note=FROM_TELEMETRY)
    tv = snap.tasks
    if key not in tv.keys:
        return TaskDetail(key, "unknown", "none", 1, -1, "none", "", "", "", (), admitted=False, note=NOT_SAMPLED)
    r = tv.keys.index(key)
    return TaskDetail(key, State(int(tv.state[r])).label, Phase(int(tv.phase[r])).label,
                      int(tv.attempt[r]), -1, StallReason(int(tv.stall[r])).label, "", "", "", (),
                      note=FROM_TELEMETRY)


@dataclass(slots=True)
class EventTracker:
    """Turns successive snapshots into ``task_failed`` events (stalls come from the run's event
    stream: ``StallEvents``)."""

    _failed: set[tuple[str, int]] = field(default_factory=set)

    def events(self, snap: EngineSnapshot) -> list[Event]:
        now = time.time()
        out: list[Event] = []
        for f in snap.failures:
            k = (f.key, f.attempt)
            if k not in self._failed:
                self._failed.add(k)
                out.append(Event(what="task_failed", subject=f.key[:_TEXT], reason=f.reason[:_TEXT], t=now))
        if len(self._failed) > _FAILED_MEMORY:  # the snapshot keeps the last 200 failures; forget old ones
            self._failed = {(f.key, f.attempt) for f in snap.failures}
        return out


class StallEvents:
    """The run's stall events (``StallEvent``: one per batch, with its task count), and its workers
    waiting to be restarted or gone for good (Ray actors: ``WorkerWaiting``, ``WorkerGone``; a loss
    and a return are the monitor's verdicts), heard on the engine's loop (``on_run_event``: an
    append, nothing more) and told as wire events on the plane's (``drain``). At most ``limit``
    wait; past that the oldest go, counted in ``lost``."""

    def __init__(self, limit: int = 1000) -> None:
        self._heard: deque[StallEvent | WorkerWaiting | WorkerGone] = deque(maxlen=limit)
        self.heard = 0
        self.told = 0

    def on_run_event(self, event: RunEvent) -> None:
        """A run event (engine's loop): keep it if it is a stall, a worker's wait or its end."""
        if isinstance(event, StallEvent | WorkerWaiting | WorkerGone):
            self._heard.append(event)
            self.heard += 1

    @property
    def lost(self) -> int:
        """Stall events that went before they were told (more than ``limit`` waited)."""
        return self.heard - self.told - len(self._heard)

    def drain(self) -> list[Event]:
        """Every stall heard since the last call, as wire events (plane's loop)."""
        out: list[Event] = []
        # Run events are stamped on perf_counter; the wire speaks Unix seconds.
        to_wall = time.time() - time.perf_counter()
        while self._heard:
            ev = self._heard.popleft()
            if isinstance(ev, WorkerWaiting):
                out.append(Event(what="worker_waiting", subject=ev.worker[:_TEXT], reason=ev.note[:_TEXT],
                                 t=ev.t + to_wall))
                continue
            if isinstance(ev, WorkerGone):
                out.append(Event(what="worker_gone", subject=ev.worker[:_TEXT], reason=ev.reason[:_TEXT],
                                 t=ev.t + to_wall))
                continue
            where = f"batch {ev.batch} on lane {ev.lane}" if ev.batch >= 0 else "tasks in the queue"
            out.append(Event(what="stall_began" if ev.began else "stall_ended",
                             subject=(f"{where}: {ev.note}" if ev.note else where)[:_TEXT], reason=ev.reason,
                             t=ev.t + to_wall, count=ev.tasks, batch=ev.batch, lane=ev.lane,
                             lasted_s=max(0.0, ev.lasted_s)))
        self.told += len(out)
        return out


def _ro(a: npt.NDArray[_N]) -> npt.NDArray[_N]:
    a.setflags(write=False)
    return a
