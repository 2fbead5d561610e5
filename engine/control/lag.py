"""How far the monitor's own input runs behind, told by heartbeats this process sent itself.

A monitor that hears late convicts the innocent. When its thread is starved of CPU, its process
stops for a garbage collection, the broker falls behind, or a backlog sits in its socket, every
worker's heartbeats arrive late together, and a second and a half of that looks like death to the
phi detector. Workers elsewhere cannot tell the monitor's lag from their own silence; but the
engine's own workers heartbeat through the same broker from this process, so for each of their
heartbeats we know when it left (``Heartbeater.outbox``, on ``time.monotonic``) and whether the
plane has heard it yet. The oldest one sent and not yet heard says how far behind the input runs
now, before the backlog is read: exactly when a verdict would be wrong.

When the lag reaches ``hold_s`` the monitor is told the input has lagged since the oldest unheard
heartbeat left, and until the lag is below ``resume_s`` again; that span counts as nobody's
silence (``WorkerMonitor.on_input_lag``), which keeps those spans (``LagSpans``) and takes them
out of every silence it judges. Wills still convict at once: a Will is evidence, not the absence of
it. ``hold_s`` must be well inside the phi budget (about 1.8 s): a worker last heard up to an
interval before the input stalled, and the first unheard probe sent up to an interval after, leave
hold_s + 1 s of silence counted at worst. A hold lasts at most ``max_hold_s``: a probe that
never arrives (lost on a connection nobody noticed breaking yet) must not blind the monitor for
good.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["InputLag", "LagChange", "LagSpans"]

Sent = tuple[int, int, float]
"""One heartbeat in an outbox: (epoch, seq, time.monotonic() when it was sent)."""


@dataclass(frozen=True, slots=True)
class LagChange:
    """The hold began (``holding``) or ended, at ``at``, with the lag measured then: a hold began
    ``lag_s`` before ``at``, when the oldest unheard heartbeat left."""

    holding: bool
    at: float
    lag_s: float


class InputLag:
    """Tracks what was heard of each probe worker and turns the lag into hold / resume changes."""

    def __init__(self, hold_s: float | None = 0.5, resume_s: float = 0.25, max_hold_s: float = 10.0) -> None:
        """``hold_s`` None: measure, never hold."""
        if hold_s is not None and not 0 < resume_s <= hold_s < max_hold_s:
            raise ValueError(f"need 0 < resume_s ({resume_s}) <= hold_s ({hold_s}) < max_hold_s ({max_hold_s})")
        self.hold_s = hold_s
        self.resume_s = resume_s
        self.max_hold_s = max_hold_s
        self.lag_s = 0.0
        """The lag at the last ``update``, in seconds."""
        self.holds = 0
        """Holds begun so far, and the longest lag seen."""
        self.worst_s = 0.0
        self._heard: dict[str, tuple[int, int]] = {}
        self._held_since: float | None = None
        self._spent = False
        """After a hold ran out, no new one until the lag has once fallen below ``resume_s``."""

    @property
    def holding(self) -> bool:
        return self._held_since is not None

    def on_heard(self, worker_id: str, epoch: int, seq: int) -> None:
        """The plane heard this heartbeat of a probe worker (on the plane's loop)."""
        self._heard[worker_id] = (epoch, seq)

    def behind(self, worker_id: str, sent: Sequence[Sent], now: float) -> float:
        """Seconds since the oldest heartbeat of ``worker_id`` in ``sent`` (its outbox, oldest
        first) that has not been heard; 0.0 when every one has been. Only the newest epoch counts:
        the outbox is emptied when a connection breaks, and an older epoch's leftovers never come."""
        if not sent:
            return 0.0
        epoch = sent[-1][0]
        heard = self._heard.get(worker_id)
        first = 0
        if heard is not None and heard[0] == epoch:
            for i in range(len(sent) - 1, -1, -1):
                if sent[i][0] == epoch and sent[i][1] == heard[1]:
                    first = i + 1
                    break
        for e, _seq, at in sent[first:]:
            if e == epoch:
                return max(now - at, 0.0)
        return 0.0

    def update(self, outboxes: Iterable[tuple[str, Sequence[Sent]]], now: float) -> LagChange | None:
        """Measure the lag over every probe worker's outbox at ``now``; return the change of hold,
        if any."""
        lag = max((self.behind(wid, sent, now) for wid, sent in outboxes), default=0.0)
        self.lag_s = lag
        self.worst_s = max(self.worst_s, lag)
        if self._held_since is None:
            if lag < self.resume_s:
                self._spent = False
            if self.hold_s is not None and lag >= self.hold_s and not self._spent:
                self._held_since = now
                self.holds += 1
                return LagChange(True, now, lag)
            return None
        if lag < self.resume_s or now - self._held_since >= self.max_hold_s:
            self._spent = lag >= self.resume_s
            self._held_since = None
            return LagChange(False, now, lag)
        return None


class LagSpans:
    """The spans of time during which the monitor's input lagged, oldest first: nobody's silence.
    The last one is open (ends at inf) while the input lags; at most ``limit`` are kept (older ones
    lie before any silence still being judged)."""

    __slots__ = ("limit", "spans")

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self.spans: list[list[float]] = []
        """Spans [start, end]. ``WorkerMonitor`` tests it for emptiness on every heartbeat."""

    @property
    def lagging(self) -> bool:
        """Whether the input lags now (the last span is still open)."""
        return bool(self.spans) and self.spans[-1][1] == math.inf

    def begin(self, start: float) -> None:
        """The input lags since ``start``; a span it overlaps is reopened rather than repeated."""
        spans = self.spans
        if spans and start <= spans[-1][1]:
            spans[-1][1] = math.inf
        else:
            spans.append([start, math.inf])
        del spans[:-self.limit]

    def end(self, now: float) -> None:
        """The input caught up at ``now``."""
        self.spans[-1][1] = now

    def held(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which the input lagged."""
        total = 0.0
        for start, end in reversed(self.spans):
            if end <= t0:
                break
            total += max(min(end, t1) - max(start, t0), 0.0)
        return total
