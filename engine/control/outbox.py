"""Events on their way out: one bounded queue for every event the plane publishes, and refusals and
drops told per reason, at most once a second.

The decisions this module protects:
- Refusing costs the engine less than sending costs the sender. A refused command or a dropped
  message is counted by reason; of each reason at most one event goes out per ``period_s``: the
  first at once (for a command, with its nonce as ``ref``, so a lone sender whose command was
  refused hears why), the rest as one summary with their ``count`` once the period has passed.
  Never an event, a task or a publish per refused message.
- Every event waits in one bounded queue, drained by a few long-lived publishers (``send_events``,
  ``EVENT_PUBLISHERS`` of them): when it is full the oldest event is dropped and counted, so a burst
  (thousands of failures at once, a broker that stalls) neither grows memory nor piles up QoS-1
  publishes awaiting acknowledgement; an event whose publish failed goes back to the queue's head.
  Per-task events (failures, stalls: thousands a second in a run held by backpressure) go out after
  the others and are dropped first, so they never crowd out or hold back a verdict, a command's
  answer or a summary.
- What is left when the engine stops goes out then (``flush_events``), the untold summaries first
  (they are the counts a listener adds up), for at most half a second.

Reasons are the engine's own words (``WireError`` and ``CommandRefused`` reasons, ``wrong_topic``),
never a sender's, so the tallies stay a handful.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiomqtt

from warpdeck.engine.control.wire import Event, encode

__all__ = [
    "EVENT_PUBLISHERS",
    "EVENT_QUEUE_LIMIT",
    "PER_TASK",
    "EventQueue",
    "Summaries",
    "SummaryKind",
    "flush_events",
    "send_events",
]

EVENT_QUEUE_LIMIT = 1000
"""Events waiting at most; each is a few hundred bytes (at most ~8 KiB)."""
EVENT_PUBLISHERS = 4
"""Long-lived publishers draining the event queue, so at most this many QoS-1 events await their acknowledgement at once
(aiomqtt warns above 10 pending calls, telemetry's and deaths' included)."""
_TEXT = 4096

SummaryKind = Literal["command_refused", "message_dropped"]


PER_TASK: Final = frozenset(("task_failed", "stall_began", "stall_ended"))
"""Events told per task or per batch: as many as the run has failures and stalled batches (one per batch under
backpressure). They go out after the others and, when the queue is full, are dropped first, so they never crowd out or
hold back the few an operator must hear: verdicts, command outcomes (a sender waits for its answer), summaries of
refusals and drops."""


class EventQueue:
    """Events in order of arrival, bounded: ``put`` never waits. Per-task events (``PER_TASK``) wait
    behind all the others. When the queue is full it drops its oldest per-task event, or its oldest
    event when it holds none, and counts it (``dropped``). Any number of consumers ``get``. Used on one
    event loop only (the plane's)."""

    def __init__(self, limit: int = EVENT_QUEUE_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"an event queue holds at least 1 event, not {limit}")
        # Two FIFOs sharing the bound: the others first, then the per-task events.
        self._others: deque[Event] = deque()
        self._tasks: deque[Event] = deque()
        self.limit = limit
        self._ready = asyncio.Event()
        self.dropped = 0
        """Events dropped because the queue was full."""

    def __len__(self) -> int:
        return len(self._tasks) + len(self._others)

    def put(self, ev: Event) -> None:
        """Queue ``ev`` behind the others; when full, the oldest per-task event goes (else the oldest)."""
        if len(self) >= self.limit:
            (self._tasks or self._others).popleft()
            self.dropped += 1
        (self._tasks if ev.what in PER_TASK else self._others).append(ev)
        self._ready.set()

    def put_back(self, ev: Event) -> None:
        """Return ``ev`` to the head (its publish failed); dropped instead when the queue is full."""
        if len(self) >= self.limit:
            self.dropped += 1
            return
        (self._tasks if ev.what in PER_TASK else self._others).appendleft(ev)
        self._ready.set()

    async def get(self) -> Event:
        """The oldest event that is not per-task, else the oldest per-task one; waits for one."""
        while not (self._others or self._tasks):
            self._ready.clear()
            await self._ready.wait()
        return (self._others or self._tasks).popleft()


@dataclass(slots=True)
class _Tally:
    told_at: float
    """When the last event of this reason went out (``clock``)."""
    pending: int = 0
    """Counted since then, not yet told."""
    detail: str = ""
    """The newest pending one's detail."""


class Summaries:
    """Refusals and drops by (kind, reason), told at most once per ``period_s`` per reason.

    ``note`` counts one and returns the event to send at once when nothing of that reason was told
    within the period; ``due`` returns one summary per reason whose period has passed with some
    counted since. Call ``due`` often (every tick): a summary is late by at most that interval."""

    def __init__(self, period_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, not {period_s}")
        self.period_s = period_s
        self._clock = clock
        self._tallies: dict[tuple[SummaryKind, str], _Tally] = {}
        self._pending: set[tuple[SummaryKind, str]] = set()

    def note(self, what: SummaryKind, reason: str, detail: str, ref: Callable[[], str] | None = None) -> Event | None:
        """Count one ``reason`` of ``what``. The event to publish now (``count`` 1; ``ref()`` its
        reference), or None: it waits for its reason's summary."""
        key = (what, reason)
        now = self._clock()
        tally = self._tallies.get(key)
        if tally is None or (not tally.pending and now - tally.told_at >= self.period_s):
            if tally is None:
                self._tallies[key] = _Tally(now)
            else:
                tally.told_at = now
            return Event(what=what, subject=reason, reason=detail[:_TEXT], t=time.time(), count=1,
                         ref=ref() if ref is not None else "")
        tally.pending += 1
        tally.detail = detail
        self._pending.add(key)
        return None

    def due(self, *, force: bool = False) -> list[Event]:
        """One summary per reason with some counted and untold for at least ``period_s`` since its
        last event (``force``: however recent): ``subject`` the reason, ``count`` how many,
        ``reason`` the newest one's detail."""
        if not self._pending:
            return []
        now = self._clock()
        out: list[Event] = []
        for key in sorted(self._pending):
            tally = self._tallies[key]
            if not force and now - tally.told_at < self.period_s:
                continue
            what, reason = key
            n = tally.pending
            text = f"{n} {reason} since the last; the newest: {tally.detail}"
            out.append(Event(what=what, subject=reason, reason=text[:_TEXT], t=time.time(), count=n))
            tally.told_at, tally.pending, tally.detail = now, 0, ""
            self._pending.discard(key)
        return out

    def untold(self) -> dict[tuple[SummaryKind, str], int]:
        """How many of each reason wait for their summary (a copy)."""
        return {k: self._tallies[k].pending for k in self._pending}


async def send_events(client: Any, topic: str, events: EventQueue) -> None:
    """One of the long-lived publishers of ``events`` to ``topic`` (a publish that fails goes back);
    returns only by raising: the connection's ``MqttError``, or a cancellation."""
    while True:
        ev = await events.get()
        try:
            await client.publish(topic, encode(ev), qos=1)
        except aiomqtt.MqttError:
            events.put_back(ev)
            raise


async def flush_events(client: Any, topic: str, summaries: Summaries, events: EventQueue,
                       limit_s: float = 0.5) -> None:
    """On the way out: every untold summary first (the queue may hold thousands of per-task events),
    then what the queue holds, for at most ``limit_s``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit_s):  # not wait_for: it can swallow a cancellation (3.11)
            # Several at once, not one acknowledgement after another: a flood may still be read
            # between them, and the last summaries are the counts a listener adds up. As many as
            # the event publishers (aiomqtt warns past 10 publishes awaiting acknowledgement).
            room = asyncio.Semaphore(EVENT_PUBLISHERS)

            async def publish(ev: Event) -> None:
                async with room:
                    await client.publish(topic, encode(ev), qos=1)

            await asyncio.gather(*(publish(ev) for ev in summaries.due(force=True)))
            while len(events):
                await client.publish(topic, encode(await events.get()), qos=1)
