"""Links for an engine that is not in this process: attached through its broker, or replayed
from a recording.

``AttachLink`` wraps the engine's ``RemoteEngine`` (telemetry in, signed commands out); snapshots
arrive as messages exactly as they do from an in-process engine, so every screen works the same.
Task lists are the telemetry's samples (a few hundred keys per column); counts are exact. Task
detail is what telemetry carries (``RemoteEngine.detail``), and says what it cannot know.
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
    RemoteEngine,
    TaskDetail,
    read_recording,
)
from warpdeck.tui.link import Post, SentCommand, StreamLink, _Refusals
from warpdeck.tui.messages import SnapshotArrived

__all__ = ["AttachLink", "replay_link"]


class AttachLink(_Refusals):
    """The control room over a remote engine; ``readonly`` sends nothing. Quitting detaches."""

    owns_engine = False

    def __init__(self, address: BrokerAddress, pipeline: str, *, secret: bytes | None = None,
                 readonly: bool = False, record: Path | None = None) -> None:
        super().__init__(readonly=readonly)
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


def replay_link(path: Path, speed: float = 1.0) -> StreamLink:
    """Plays a ``--record`` file back at ``speed`` times the pace it was recorded at."""
    snaps = list(read_recording(path))
    if not snaps:
        raise ValueError(f"{path}: no telemetry in it (is it a warpdeck --record file?)")
    gaps = [b.t - a.t for a, b in itertools.pairwise(snaps)]
    interval = (sum(gaps) / len(gaps) / speed) if gaps and speed > 0 else 0.0
    return StreamLink(snaps, interval=max(interval, 0.0))
