"""Snapshot → telemetry, and the events a stream of snapshots implies.

Telemetry carries what an attached control room needs to draw every screen: counts, figures, lanes,
feeder, workers, stalled tasks, failures, the batch records finished since the last message, and a
sample of keys per board column (the whole task table of a million tasks stays at home).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from warpdeck.engine.control.wire import Event, Telemetry
from warpdeck.engine.state.board_columns import CANCELLED, DONE, FAILED, STALLED, column_codes
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.snapshot import ControlView, EngineSnapshot, TaskDetail, TaskView
from warpdeck.engine.state.tasks import RUN_PHASES, Phase, StallName, StallReason, State

__all__ = [
    "COLUMN_SAMPLE",
    "FROM_TELEMETRY",
    "NOT_SAMPLED",
    "EventTracker",
    "detail_from",
    "snapshot_from",
    "summarize",
]

#: Keys sent per board column: more than any terminal shows at once.
COLUMN_SAMPLE = 200
_STALLED_SAMPLE = 500
_FAILURES_SAMPLE = 200
_FAILED_MEMORY = 100_000


#: Telemetry's column names, each with the board's column codes it samples (engine/state/board_columns.py).
_SAMPLED = {"queued": (0,), "fill": (1,), "h2d": (2,), "compute": (3,), "d2h": (4,), "sink": (5,),
            "stalled": (STALLED,), "done": (DONE,), "failed": (FAILED, CANCELLED)}


def _columns(snap: EngineSnapshot) -> dict[str, tuple[str, ...]]:
    tv = snap.tasks
    n = len(tv)
    if n == 0:
        return {}
    codes = column_codes(tv.state[:n], tv.phase[:n], tv.stall[:n])
    out: dict[str, tuple[str, ...]] = {}
    for name, wanted in _SAMPLED.items():
        rows = np.flatnonzero(np.isin(codes, wanted))
        # Finished columns show the newest; live ones the oldest (the head of the queue).
        pick = rows[-COLUMN_SAMPLE:] if name in ("done", "failed") else rows[:COLUMN_SAMPLE]
        out[name] = tuple(tv.keys[r] for r in pick.tolist())
    return out


def summarize(snap: EngineSnapshot, since: float, control: ControlView | None = None) -> Telemetry:
    """Telemetry for ``snap``; ``since`` is the perf_counter time of the previous message's newest
    batch record (only newer records are sent)."""
    records = tuple(r for r in snap.timeline if r.end > since)[-4096:]
    return Telemetry(
        seq=snap.seq,
        t=snap.t,
        pipeline=snap.pipeline,
        status=snap.status,
        backend=snap.backend,
        backend_reason=snap.backend_reason[:4096],
        device=snap.device,
        counts=snap.counts,
        figures=snap.figures,
        lanes=snap.lanes,
        feeder=snap.feeder,
        workers=snap.workers,
        stalled=snap.stalled[:_STALLED_SAMPLE],
        failures=snap.failures[-_FAILURES_SAMPLE:],
        timeline=records,
        columns=_columns(snap),
        control=control if control is not None else snap.control,
        outage=snap.outage,
    )


@dataclass(slots=True)
class EventTracker:
    """Turns successive snapshots into events: a task failed, a stall began or ended."""

    _failed: set[tuple[str, int]] = field(default_factory=set)
    _stalled: dict[str, StallName] = field(default_factory=dict)

    def events(self, snap: EngineSnapshot) -> list[Event]:
        now = time.time()
        out: list[Event] = []
        for f in snap.failures:
            k = (f.key, f.attempt)
            if k not in self._failed:
                self._failed.add(k)
                out.append(Event(what="task_failed", subject=f.key[:4096], reason=f.reason[:4096], t=now))
        stalled = {s.key: s.reason for s in snap.stalled}
        for key, reason in stalled.items():
            if self._stalled.get(key) != reason:
                out.append(Event(what="stall_began", subject=key[:4096], reason=reason, t=now))
        out.extend(
            Event(what="stall_ended", subject=key[:4096], reason=reason, t=now)
            for key, reason in self._stalled.items()
            if key not in stalled
        )
        self._stalled = stalled
        if len(self._failed) > _FAILED_MEMORY:  # the snapshot keeps the last 200 failures; forget old ones
            self._failed = {(f.key, f.attempt) for f in snap.failures}
        return out


_N = TypeVar("_N", bound=np.generic)
_PHASE_OF = {p.label: p for p in RUN_PHASES}
_STALL_OF = {r.label: r for r in StallReason if r}


def snapshot_from(tel: Telemetry, timeline: tuple[BatchRecord, ...] = ()) -> EngineSnapshot:
    """An ``EngineSnapshot`` an attached control room can draw: counts, figures, lanes and workers
    are exact; the task table holds the sampled keys of each board column. ``timeline`` is the
    batch records gathered from earlier telemetry (each message carries only the new ones)."""
    rows: list[tuple[str, int, int, int]] = []  # key, state, phase, stall
    stalled = {s.key: s for s in tel.stalled}
    failed = {f.key: f.attempt for f in tel.failures}
    for column, sample in tel.columns.items():
        for key in sample:
            if column == "queued":
                rows.append((key, State.QUEUED, Phase.NONE, StallReason.NONE))
            elif column in _PHASE_OF:
                rows.append((key, State.RUNNING, _PHASE_OF[column], StallReason.NONE))
            elif column == "stalled":
                s = stalled.get(key)
                if s is None:
                    rows.append((key, State.QUEUED, Phase.NONE, StallReason.CONTROL))
                else:
                    rows.append((key, State.RUNNING if s.state == "running" else State.QUEUED,
                                 _PHASE_OF.get(s.phase, Phase.NONE), _STALL_OF.get(s.reason, StallReason.CONTROL)))
            elif column == "done":
                rows.append((key, State.DONE, Phase.NONE, StallReason.NONE))
            else:
                rows.append((key, State.FAILED if key in failed else State.CANCELLED, Phase.NONE, StallReason.NONE))
    keys = [r[0] for r in rows]
    state = [r[1] for r in rows]
    phase = [r[2] for r in rows]
    stall = [r[3] for r in rows]
    # Attempts are numbered from 1; telemetry carries them for failures only.
    attempt = [failed.get(k, 1) if s == State.FAILED else 1 for k, s in zip(keys, state, strict=True)]
    view = TaskView(keys, _ro(np.array(state, np.int8)), _ro(np.array(phase, np.int8)),
                    _ro(np.array(stall, np.int8)), _ro(np.array(attempt, np.int16)))
    return EngineSnapshot(
        seq=tel.seq, t=tel.t, t0=0.0, pipeline=tel.pipeline, status=tel.status, backend=tel.backend,
        backend_reason=tel.backend_reason, device=tel.device, counts=tel.counts, tasks=view, stalled=tel.stalled,
        lanes=tel.lanes, feeder=tel.feeder, timeline=timeline or tel.timeline, figures=tel.figures,
        failures=tel.failures, workers=tel.workers, control=tel.control, outage=tel.outage)


#: What an attached detail says of where it comes from.
FROM_TELEMETRY = "from telemetry: the task's history and traceback stay with the engine"
NOT_SAMPLED = (f"not among the tasks telemetry samples (at most {COLUMN_SAMPLE} per board column): its detail"
               " stays with the engine; a command naming it is answered by the engine")


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


def _ro(a: npt.NDArray[_N]) -> npt.NDArray[_N]:
    a.setflags(write=False)
    return a
