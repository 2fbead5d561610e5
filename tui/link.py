"""The only bridge between the control room and an engine.

The decision this module protects: the app never touches the engine. A link delivers snapshots as
messages (latest wins) and carries typed commands the other way. ``EngineLink`` links the app to an
engine that the engine's own ``HostedEngine`` runs on a thread and event loop of its own, so a slow
repaint can never slow the pipeline and a busy engine can never freeze the keyboard; ``StreamLink``
plays a ready-made sequence of snapshots (tests, benchmarks, replays) and answers commands it
cannot carry with a refusal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from textual.message import Message

from warpdeck.engine.api import (
    Backend,
    Command,
    CommandResult,
    EngineSnapshot,
    ExportSettings,
    GateDecision,
    HostedEngine,
    PipelineSpec,
    TaskDetail,
)
from warpdeck.tui.messages import EngineStopped, GateAsked, SnapshotArrived, StepStarted, StreamEnded

__all__ = ["EngineLink", "Link", "SentCommand", "StreamLink"]

Post = Callable[[Message], object]


@dataclass(frozen=True, slots=True)
class SentCommand:
    """A command the app sent and the engine's answer (kept for the status line and tests)."""

    command: Command
    result: CommandResult


class Link(Protocol):
    """What the app needs from an engine, wherever it runs."""

    readonly: bool
    sent: list[SentCommand]
    owns_engine: bool
    """True when quitting the app stops the engine (it runs in this process); False when the app only watches (attached
    to an engine elsewhere, or a replay)."""
    journaled: bool
    """True when the engine keeps a journal, so a stopped run resumes where it stopped."""
    readonly_reason: str
    """Why commands are off, in words the room shows, when ``readonly``."""
    label: str
    """What the room says it shows, beside the status (a replay and its speed); "" for none."""

    @property
    def metrics_url(self) -> str | None:
        """Where the engine's metrics endpoint serves (``--metrics``), None without one."""

    def start(self, post: Post) -> None:
        """Begin delivering messages through ``post`` (thread-safe)."""

    async def send(self, cmd: Command) -> CommandResult:
        """Carry one command and return the engine's answer."""

    async def detail(self, key: str) -> TaskDetail | None:
        """Everything known about one task, during the run and after it; None only for a key the
        engine does not know (a task not admitted yet has a detail: ``admitted`` False, ``note``)."""

    def stop(self) -> None:
        """Stop the engine (if this link owns it) and stop delivering."""

    def answer_gate(self, decision: GateDecision) -> bool:
        """Answer the gate a run of steps waits at (``GateAsked``); False where none waits or this
        link cannot answer one."""


@dataclass
class _Refusals:
    readonly: bool = False
    journaled: bool = False
    sent: list[SentCommand] = field(default_factory=list)
    readonly_reason: str = "read-only: commands are off"
    """Why commands are off, in words the room shows (``read-only: no command secret …``)."""
    label: str = ""

    @property
    def metrics_url(self) -> str | None:
        return None

    def answer_gate(self, decision: GateDecision) -> bool:
        return False

    def refuse(self, cmd: Command) -> CommandResult | None:
        if self.readonly:
            result = CommandResult(False, 0, self.readonly_reason)
            self.sent.append(SentCommand(cmd, result))
            return result
        return None


class EngineLink(_Refusals):
    """Links the app to ``Engine(spec, run_dir)``, hosted on a thread of its own (``HostedEngine``)."""

    owns_engine = True

    def __init__(self, spec: PipelineSpec, run_dir: Path | str | None = None, *, backend: Backend | None = None,
                 readonly: bool = False, exports: ExportSettings | None = None, **engine_options: Any) -> None:
        super().__init__(readonly=readonly)
        self.engine = HostedEngine(spec, run_dir, backend=backend, exports=exports, **engine_options)
        """The engine and its thread: its report, its error, its newest snapshot, waiting for its end."""
        self.journaled = self.engine.journaled

    @property
    def metrics_url(self) -> str | None:
        """Where the engine's metrics endpoint serves (``--metrics``), None without one."""
        return self.engine.metrics_url

    def open(self) -> None:
        """Start the engine on its own thread and wait until it runs; re-raises what stopped it
        from starting (a bad run directory, a backend that is not there)."""
        self.engine.open()

    def start(self, post: Post) -> None:
        self.open()
        self.engine.watch(lambda snap: post(SnapshotArrived(snap)),
                          lambda report, error: post(EngineStopped(report, error)),
                          lambda ask: post(GateAsked(ask)), lambda words: post(StepStarted(words)))

    def answer_gate(self, decision: GateDecision) -> bool:
        return not self.readonly and self.engine.answer_gate(decision)

    async def send(self, cmd: Command) -> CommandResult:
        refused = self.refuse(cmd)
        if refused is not None:
            return refused
        result = await self.engine.command(cmd)
        self.sent.append(SentCommand(cmd, result))
        return result

    async def detail(self, key: str) -> TaskDetail | None:
        return await self.engine.task_detail(key)

    def stop(self) -> None:
        self.engine.stop()


class StreamLink(_Refusals):
    """Delivers the given snapshots in order, ``interval`` seconds apart (0: all at once).

    Commands are recorded and refused: there is no engine behind a stream."""

    owns_engine = False

    def __init__(self, snapshots: Iterable[EngineSnapshot], *, interval: float = 0.0,
                 details: dict[str, TaskDetail] | None = None, label: str = "") -> None:
        super().__init__(readonly=False, readonly_reason="replay: no engine to command")
        self.label = label
        """What the room says it shows, beside the status (a replay and its speed); "" for none."""
        self._snapshots = snapshots
        self._interval = interval
        self._details = details or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, post: Post) -> None:
        if self._interval <= 0:
            for snap in self._snapshots:
                post(SnapshotArrived(snap))
            post(StreamEnded())
            return
        self._thread = threading.Thread(target=self._play, args=(post,), name="warpdeck-replay", daemon=True)
        self._thread.start()

    def _play(self, post: Post) -> None:
        for snap in self._snapshots:
            if self._stop.wait(self._interval):
                return
            post(SnapshotArrived(snap))
        post(StreamEnded())

    async def send(self, cmd: Command) -> CommandResult:
        result = CommandResult(False, 0, self.readonly_reason)
        self.sent.append(SentCommand(cmd, result))
        return result

    async def detail(self, key: str) -> TaskDetail | None:
        return self._details.get(key)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
