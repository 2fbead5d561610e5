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
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from warpdeck.engine.api import (
    BrokerAddress,
    Command,
    CommandResult,
    EngineSnapshot,
    LinkView,
    RemoteEngine,
    TaskDetail,
    WireError,
    read_recording,
)
from warpdeck.tui.link import Post, SentCommand, StreamLink, _Refusals
from warpdeck.tui.messages import SnapshotArrived

__all__ = ["AttachLink", "link_words", "replay_link"]

#: Silence longer than this (a few frames at 4 Hz) is told instead of the rates, and the run's state
#: is no longer vouched for (``stale_words``).
SILENT_S = 2.0


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

    @property
    def url(self) -> str:
        return self.remote.address.url

    def start(self, post: Post) -> None:
        def deliver(snap: EngineSnapshot) -> None:
            post(SnapshotArrived(snap))

        self.remote.on_snapshot = deliver
        self.remote.start()

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
    """Plays a ``--record`` file back at ``speed`` times the pace it was recorded at."""
    refused: list[WireError] = []
    snaps = list(read_recording(path, refused))
    if not snaps:
        why = f": its lines were refused ({refused[0]})" if refused else " (is it a warpdeck --record file?)"
        raise ValueError(f"{path}: no telemetry in it{why}")
    gaps = [b.t - a.t for a, b in itertools.pairwise(snaps)]
    interval = (sum(gaps) / len(gaps) / speed) if gaps and speed > 0 else 0.0
    # Said beside the status: a replay must not look like a live run (issue 29).
    return StreamLink(snaps, interval=max(interval, 0.0), label=f"replay ×{speed:g}")
