"""Links for an engine that is not in this process: attached through its broker, or replayed
from a recording.

``AttachLink`` wraps the engine's ``RemoteEngine`` (telemetry in, signed commands out); snapshots
arrive as messages exactly as they do from an in-process engine, so every screen works the same.
Task lists are the telemetry's samples (a few hundred keys per column); counts are exact. Task
detail is what telemetry carries (``RemoteEngine.detail``), and says what it cannot know.

The link itself is shown in the status bar of every screen (``link_words``): telemetry's bytes and
frames a second, its lag, frames lost; and, once nothing has come for a few frames' time, how long
it has been silent or that the broker is gone. The lag is the engine's clock against this
machine's (``LinkView.lag_s``); where the two clocks disagree, ``behind`` (the lag above the least
of the last minute) is the figure to trust, and it is shown once it passes a tenth of a second.
What the room can no longer vouch for while it hears nothing (the run's state, the broker's
connection, each worker's state) reads unknown (``stale_words``, ``unheard_words``) until
telemetry comes again.

A broker that cannot be reached is said as a notification, with its address and why, from the
first attempt and again every ``RETOLD_S`` while the attempts go on (issue 29: a room attached to
an address where nothing listened waited for ever without a word): before any telemetry there is
no snapshot, so nothing else in the room can say it. Quitting never waits on an attempt.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Literal

from textual.notifications import Notification, Notify

from warpdeck.engine.api import (
    BrokerAddress,
    Command,
    CommandResult,
    EngineSnapshot,
    LinkView,
    RemoteEngine,
    TaskDetail,
    read_recording,
)
from warpdeck.tui.link import Post, SentCommand, StreamLink, _Refusals
from warpdeck.tui.messages import SnapshotArrived

__all__ = ["AttachLink", "link_words", "replay_link", "stale_words", "unheard_words"]

SILENT_S = 2.0
"""Silence longer than this (a few frames at 4 Hz) is told instead of the rates, and the run's state is no longer
vouched for (``stale_words``)."""
RETOLD_S = 10.0
"""While the broker cannot be reached, the room is told again this often; each notification lasts a second longer, so
one is on screen until the attempts stop."""


class AttachLink(_Refusals):
    """The control room over a remote engine; ``readonly`` sends nothing. Quitting detaches."""

    owns_engine = False

    def __init__(self, address: BrokerAddress, pipeline: str, *, secret: bytes | None = None,
                 readonly: bool = False, record: Path | None = None) -> None:
        readonly = readonly or secret is None
        why = ("read-only: no command secret (attach with --secret-file or $WARPDECK_SECRET)" if secret is None
               else "read-only: attached with --readonly")
        super().__init__(readonly=readonly, readonly_reason=why)
        self.remote = RemoteEngine(address, pipeline, secret=None if readonly else secret, record=record)
        self._post: Post | None = None
        # The attempts to connect that failed in a row, since when, and what was last said of them
        # and when (monotonic): the client's thread alone reads and writes these.
        self._attempts = 0
        self._failing_since = 0.0
        self._told: tuple[str, float] = ("", 0.0)
        self._ever_connected = False

    @property
    def url(self) -> str:
        return self.remote.address.url

    def start(self, post: Post) -> None:
        def deliver(snap: EngineSnapshot) -> None:
            post(SnapshotArrived(snap))

        self._post = post
        self.remote.on_snapshot = deliver
        self.remote.on_connection = self._on_connection
        self.remote.start()

    def _on_connection(self, why: str) -> None:
        """(The client's thread.) A connection made (``why`` "") or an attempt that failed: said in
        the room with the broker's address; a failure when it is new, when its reason changes, and
        every ``RETOLD_S`` while it lasts."""
        now = time.monotonic()
        if not why:
            if self._attempts:
                self._say(f"connected to broker {self.url} after {now - self._failing_since:,.0f}s", "information", 5)
            self._attempts, self._told, self._ever_connected = 0, ("", 0.0), True
            return
        if not self._attempts:
            self._failing_since = now
        self._attempts += 1
        told, at = self._told
        if why == told and now - at < RETOLD_S:
            return
        self._told = (why, now)
        tries = f"attempt {self._attempts:,}" + (f", {now - self._failing_since:,.0f}s" if self._attempts > 1 else "")
        words = (f"lost broker {self.url}: {why} · reconnecting" if self._ever_connected
                 else f"cannot reach broker {self.url}: {why} · retrying")
        self._say(f"{words} ({tries}) · q quits", "error", RETOLD_S + 1)

    def _say(self, text: str, severity: Literal["information", "error"], timeout: float) -> None:
        if self._post is not None:  # the app's own notification (what ``App.notify`` posts), from this thread
            self._post(Notify(Notification(text, title="attach", severity=severity, timeout=timeout)))

    async def send(self, cmd: Command) -> CommandResult:
        refused = self.refuse(cmd)
        if refused is not None:
            return refused
        result = await asyncio.wrap_future(self.remote.send(cmd))
        self.sent.append(SentCommand(cmd, result))
        return result

    async def detail(self, key: str) -> TaskDetail | None:
        return self.remote.detail(key)

    def stop(self) -> None:
        self.remote.stop()


def stale_words(link: LinkView, status: str) -> str | None:
    """Where an attached room can no longer vouch for the run's state, in words (None: it can):
    the broker lost, or no telemetry for ``SILENT_S``. Before (issue 29) a room said ``● running …
    1,835 tasks/s`` for as long as it stayed open after the engine had gone."""
    if not link.connected:
        return f"unknown: broker lost (last seen {status})"
    if link.silent_s is not None and link.silent_s >= SILENT_S:
        return f"unknown: engine silent {link.silent_s:,.0f}s (last seen {status})"
    return None


def unheard_words(link: LinkView) -> str | None:
    """Why an attached room no longer hears its engine, in a few words (None: it does): ``broker
    lost``, or ``no telemetry for 12s`` after ``SILENT_S``. What the snapshot says of the broker's
    connection and of each worker is then as last heard, not as it is now."""
    if not link.connected:
        return "broker lost"
    if link.silent_s is not None and link.silent_s >= SILENT_S:
        return f"no telemetry for {link.silent_s:,.0f}s"
    return None


def link_words(link: LinkView) -> str:
    """The link in a few words for the status bar: ``⇄ 4.0/s 3.1 KB/s lag 42ms``, then what is
    wrong with it (frames lost, running behind, silent, the broker gone, telemetry refused)."""
    if not link.connected:
        words = "⇄ broker lost: reconnecting"
    elif link.silent_s is None:
        words = "⇄ no telemetry yet"
    elif link.silent_s >= SILENT_S:
        words = f"⇄ no telemetry for {link.silent_s:,.0f}s"
    else:
        lag = f" lag {_seconds(link.lag_s)}" if link.lag_s is not None else ""
        words = f"⇄ {link.frames_s:.1f}/s {_rate(link.bytes_s)}{lag}"
        if link.behind_s >= 0.1:
            words += f" behind {_seconds(link.behind_s)}"
    if link.lost:
        words += f" lost {link.lost:,}"
    if link.refused:
        words += f" · refused {link.refused.split(':', 1)[0]}"
    return words


def _seconds(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s * 1000:,.0f}ms" if abs(s) < 1 else f"{s:,.1f}s"


def _rate(bytes_s: float) -> str:
    return f"{bytes_s / 1024:,.1f} KB/s" if bytes_s >= 1024 else f"{bytes_s:,.0f} B/s"


def replay_link(path: Path, speed: float = 1.0) -> StreamLink:
    """Plays a ``--record`` file back at ``speed`` times the pace it was recorded at. ``ValueError``
    (``RecordingError``) names what the file is when it is not a recording, from its first line."""
    snaps = list(read_recording(path))
    gaps = [b.t - a.t for a, b in itertools.pairwise(snaps)]
    interval = (sum(gaps) / len(gaps) / speed) if gaps and speed > 0 else 0.0
    # Said beside the status: a replay must not look like a live run (issue 29).
    return StreamLink(snaps, interval=max(interval, 0.0), label=f"replay ×{speed:g}")
