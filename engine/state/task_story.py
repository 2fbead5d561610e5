"""A task's whole story as its detail tells it: each attempt with where and when it ran, its stalls.

The decisions this module protects:
- The story is made of plain frozen values (no arrays, no engine objects), so a ``TaskDetail`` that
  carries it can be read on any thread, compared in tests and rendered by a control room that never
  loads the run's parts. Telemetry does not carry stories: an attached room's detail leaves them
  empty (their defaults) and says so in its note.
- Every time in a story is in seconds on one base: since the run's start, on ``time.perf_counter``'s
  clock (the batch records' clock; the table's admission and attempt times, on ``time.monotonic``,
  are converted once, engine/state/batch_log.py). ``None`` means not known (a batch whose record the
  batch log no longer keeps, an attempt of an earlier run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from warpdeck.engine.state.task_states import PhaseName, StallName
from warpdeck.engine.state.tasks import AttemptOutcome

__all__ = ["AttemptStory", "PhaseTime", "StallEpisode", "StoryOutcome", "seconds_text"]

_MS, _TEN_MS, _MINUTE, _HOUR = 1e-3, 1e-2, 60.0, 3600.0

StoryOutcome = AttemptOutcome | Literal["queued", "running"]
"""How an attempt stands: ended (``AttemptOutcome``), or still ``queued`` / ``running``."""


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """When an attempt's batch entered one phase and how long the phase took (the batch's interval:
    every task of a batch shares it)."""

    phase: PhaseName
    start_s: float
    """Seconds since the run's start."""
    took_s: float


@dataclass(frozen=True, slots=True)
class AttemptStory:
    """One attempt: which batch carried it, on which lane, slot, worker and epoch, how long it waited
    in the queue and how long each phase took. ``kept`` is False when the batch log no longer holds its
    batch (the oldest batches of a long run): then only ``batch`` and the outcome are known."""

    attempt: int
    """The attempt's number; the first is 1."""
    outcome: StoryOutcome
    batch: int = -1
    lane: int = -1
    slot: int = -1
    worker: str = ""
    epoch: int = -1
    queued_at_s: float | None = None
    """When the attempt entered the ready queue (admitted, or retried), seconds since the run's start."""
    queue_wait_s: float | None = None
    """From entering the queue to its batch's fill starting."""
    phases: tuple[PhaseTime, ...] = ()
    """The phases its batch reached, in order (a failed batch stops at the phase that failed)."""
    ended_at_s: float | None = None
    """When the attempt ended (done, failed, cancelled, requeued), seconds since the run's start."""
    reason: str = ""
    """Why it ended when it did not end done (the failure, the cancel, the lost worker)."""
    kept: bool = True

    @property
    def total_s(self) -> float | None:
        """From entering the queue to its end (None while it runs or when either is unknown)."""
        if self.queued_at_s is None or self.ended_at_s is None:
            return None
        return max(0.0, self.ended_at_s - self.queued_at_s)


@dataclass(frozen=True, slots=True)
class StallEpisode:
    """One finished stall of a task's batch (or of the task while it was queued): why and how long."""

    reason: StallName
    at_s: float
    """When it began, seconds since the run's start."""
    lasted_s: float
    attempt: int
    """The attempt whose batch stalled."""
    note: str = ""
    queued: bool = False
    """True for a stall the task had while it waited in the queue (paused, an outage)."""


def seconds_text(s: float, *, compact: bool = False) -> str:
    """A duration as a person reads it: ``850 µs``, ``1.5 ms``, ``11 ms``, ``1.2 s``, ``2 min 05 s``
    (``compact``: no space before the unit, for table cells). The why line and the detail screen both
    write durations with it, so the two read alike."""
    if s < _MS:
        text = f"{s * 1e6:.0f} µs"
    elif s < _TEN_MS:
        text = f"{s * 1e3:.1f} ms"
    elif s < 1:
        text = f"{s * 1e3:.0f} ms"
    elif s < _MINUTE:
        text = f"{s:.1f} s"
    elif s < _HOUR:
        text = f"{int(s // _MINUTE)} min {int(s % _MINUTE):02d} s"
    else:
        text = f"{int(s // _HOUR)} h {int(s % _HOUR // _MINUTE):02d} min"
    return text.replace(" ", "") if compact else text
