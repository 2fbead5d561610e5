"""Telling one task's story from the task table and the batch log: attempts, stalls, input, output, why.

The decisions this module protects:
- Nothing is stored per task for a story. The table's row gives the current attempt (its batch,
  admission and end times), the row's history the closed attempts (each with the batch that carried
  it), and the batch log (engine/state/batch_log.py) everything a batch shares with its tasks. A task
  whose batch the log no longer keeps is told from the table alone, and says so.
- An attempt of an earlier run (a resumed run directory) has no batch in this run: it is listed with
  its outcome and reason, without times.
- A story is bounded: at most ``MAX_STALLS`` stalls (the longest, in the order they happened).
- Where an input came from and where an output went is the source's and the sink's to say
  (``source_describes``, ``sink_describes``); the shape and dtype are the batch's key.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from warpdeck.engine.edges.sinks import Sink, sink_describes
from warpdeck.engine.edges.sources import Source, source_describes
from warpdeck.engine.state.batch_log import BatchLog, LoggedStall
from warpdeck.engine.state.batches import BatchKey
from warpdeck.engine.state.task_states import RUN_PHASES, StallReason, State
from warpdeck.engine.state.task_story import AttemptStory, PhaseTime, StallEpisode, StoryOutcome
from warpdeck.engine.state.tasks import TaskTable
from warpdeck.engine.state.why_slow import CAUSE_SHARE, explain

__all__ = ["MAX_STALLS", "Story", "input_line", "output_line", "tell"]

MAX_STALLS = 16
"""The most stalls one task's story lists (its longest)."""


@dataclass(frozen=True, slots=True)
class Story:
    """What ``tell`` found: the attempts, the stalls, the why line, the admission time, the batch key."""

    attempts: tuple[AttemptStory, ...]
    stalls: tuple[StallEpisode, ...]
    why: str
    admitted_at_s: float
    key: BatchKey | None


def tell(table: TaskTable, r: int, log: BatchLog) -> Story:
    """Row ``r``'s story."""
    attempts, key = _attempts(table, r, log)
    now = log.since_start(time.perf_counter())
    why = explain(attempts, lambda a, b, lane: _cause(log, a, b, lane), now)
    admitted = log.since_start(log.from_table(float(table.t_queued[r])))
    return Story(tuple(attempts), _stalls(log, attempts), why, admitted, key)


def input_line(source: Source, task: str, key: BatchKey | None) -> str:
    """Where a task's input comes from and what it is: ``/data/a.npy · float32 [256, 256]``."""
    parts = [where] if (where := source_describes(source, task)) else []
    if key is not None:
        parts.append(f"{key.dtype} {list(key.shape)}")
    return " · ".join(parts)


def output_line(sink: Sink | None, task: str, state: State) -> str:
    """Where a task's output landed (``written to /run/outputs/a.npy``), or why it has none."""
    where = sink_describes(sink, task) if sink is not None else ""
    if state is State.DONE:
        return where
    if state is State.FAILED:
        return "none: the task failed"
    if state is State.CANCELLED:
        return "none: the task was cancelled"
    return f"not yet; then {where}" if where else "not yet"


# -- attempts ----------------------------------------------------------------------------------------
def _attempts(table: TaskTable, r: int, log: BatchLog) -> tuple[list[AttemptStory], BatchKey | None]:
    t_queued = float(table.t_queued[r])
    out: list[AttemptStory] = []
    key: BatchKey | None = None
    prev_end: float | None = None  # when this run's previous attempt ended (the next one queued then)
    for h in table.history(r):
        if h.batch < 0:  # an earlier run's attempt (or one that never reached a lane)
            out.append(AttemptStory(h.attempt, h.outcome, reason=h.reason, kept=False))
            continue
        story, k = _attempt(log, h.attempt, h.outcome, h.batch, _or(prev_end, t_queued), h.at, h.reason)
        out.append(story)
        key = k or key
        prev_end = h.at
    state = table.state_of(r)
    ended = float(table.t_end[r]) if state.terminal else None
    reason = table.error(r) if state in (State.FAILED, State.CANCELLED) else ""
    story, k = _attempt(log, int(table.attempt[r]), state.label, int(table.batch[r]), _or(prev_end, t_queued),
                        ended, reason)
    out.append(story)
    return out, k or key


def _attempt(log: BatchLog, n: int, outcome: StoryOutcome, batch: int, queued: float, ended: float | None,
             reason: str) -> tuple[AttemptStory, BatchKey | None]:
    """One attempt; ``queued`` and ``ended`` on the table's clock."""
    queued_s = log.since_start(log.from_table(queued))
    ended_s = None if ended is None else log.since_start(log.from_table(ended))
    lb = log.get(batch)
    if lb is None:
        return AttemptStory(n, outcome, batch, queued_at_s=queued_s, ended_at_s=ended_s, reason=reason,
                            kept=batch < 0), None
    # Only the phases the task reached: a task whose own load failed ended with the fill, while the
    # rest of its batch went on to compute and sink.
    end = math.inf if ended is None else log.from_table(ended)
    phases = tuple(PhaseTime(p.label, log.since_start(span[0]), max(0.0, span[1] - span[0]))
                   for p, span in zip(RUN_PHASES, lb.phases, strict=True)
                   if span is not None and math.isfinite(span[1]) and span[0] < end)
    fill = lb.phases[0]
    wait = None if fill is None else max(0.0, fill[0] - log.from_table(queued))
    return AttemptStory(n, outcome, batch, lb.lane, lb.slot, lb.worker, lb.epoch, queued_s, wait, phases,
                        ended_s, reason), lb.key


def _or(t: float | None, default: float) -> float:
    return default if t is None else t


# -- stalls ------------------------------------------------------------------------------------------
def _stalls(log: BatchLog, attempts: list[AttemptStory]) -> tuple[StallEpisode, ...]:
    by_batch = {a.batch: a.attempt for a in attempts if a.batch >= 0}
    if not by_batch:
        return ()
    found = log.stalls_of(by_batch)
    longest = sorted(found, key=lambda e: e.end - e.start, reverse=True)[:MAX_STALLS]
    longest.sort(key=lambda e: e.start)
    return tuple(StallEpisode(e.reason.label, log.since_start(e.start), max(0.0, e.end - e.start),
                              by_batch[e.batch], e.note, e.queued) for e in longest)


_LANE_PHRASES = {StallReason.CONTROL: "while the lanes were held (paused, an outage or a quarantine)",
                 StallReason.MEMORY: "while its batch filled up (lanes idle until batch_timeout_s)"}
"""What held a task, by (a lane's wait for a batch, the reason); a batch's own stall otherwise."""
_PHRASES = {StallReason.BACKPRESSURE: "behind backpressure", StallReason.MEMORY: "behind slow fills",
            StallReason.HUNG: "behind a hung compute", StallReason.WORKER_LOST: "behind a lost worker",
            StallReason.CONTROL: "held by control"}


def _cause(log: BatchLog, start_s: float, end_s: float, lane: int | None) -> str:
    """The phrase for what covered most of ``[start_s, end_s]`` (at least ``CAUSE_SHARE`` of it);
    ``lane``: only stalls of batches on that lane."""
    start, end = start_s + log.origin, end_s + log.origin
    span = end - start
    if span <= 0:
        return ""
    groups: dict[tuple[bool, StallReason], list[LoggedStall]] = {}
    for e in log.overlapping(start, end):
        if lane is None or (e.lane == lane and not e.lane_wait):
            groups.setdefault((e.lane_wait, e.reason), []).append(e)
    best, phrase = 0.0, ""
    for (lane_wait, reason), eps in groups.items():
        covered = _union(eps, start, end)
        if covered > best:
            note = next((e.note for e in eps if e.note), "")
            best = covered
            phrase = _LANE_PHRASES.get(reason, "") if lane_wait else _PHRASES.get(reason, reason.label)
            if reason is StallReason.CONTROL and note and not lane_wait:
                phrase += f" ({note})"
    return phrase if best >= CAUSE_SHARE * span else ""


def _union(eps: list[LoggedStall], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` covered by at least one of ``eps``."""
    spans = sorted((max(start, e.start), min(end, e.end)) for e in eps)
    covered, reach = 0.0, start
    for a, b in spans:
        lo = max(a, reach)
        if b > lo:
            covered += b - lo
            reach = b
    return covered
