"""The only bridge between the control room and an engine.

The decision this module protects: the app never touches the engine. A link delivers snapshots as
messages (latest wins) and carries typed commands the other way. ``EngineLink`` runs the engine on
its own thread and event loop, so a slow repaint can never slow the pipeline and a busy engine
can never freeze the keyboard; ``StreamLink`` plays a ready-made sequence of snapshots (tests,
benchmarks, replays) and answers commands it cannot carry with a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from textual.message import Message

from warpdeck.engine.api import (
    Backend,
    Command,
    CommandResult,
    Engine,
    EngineSnapshot,
    ExportSettings,
    LoopThread,
    PipelineSpec,
    RunReport,
    TaskDetail,
    exporting,
)
from warpdeck.tui.messages import EngineStopped, SnapshotArrived, StreamEnded

__all__ = ["EngineLink", "Link", "SentCommand", "StreamLink"]

Post = Callable[[Message], object]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SentCommand:
    """A command the app sent and the engine's answer (kept for the status line and tests)."""

    command: Command
    result: CommandResult


class Link(Protocol):
    """What the app needs from an engine, wherever it runs."""

    readonly: bool
    sent: list[SentCommand]
    #: True when quitting the app stops the engine (it runs in this process); False when the app
    #: only watches (attached to an engine elsewhere, or a replay).
    owns_engine: bool
    #: True when the engine keeps a journal, so a stopped run resumes where it stopped.
    journaled: bool

    def start(self, post: Post) -> None:
        """Begin delivering messages through ``post`` (thread-safe)."""

    async def send(self, cmd: Command) -> CommandResult:
        """Carry one command and return the engine's answer."""

    async def detail(self, key: str) -> TaskDetail | None:
        """Everything known about one task, during the run and after it; None only for a key the
        engine does not know (a task not admitted yet has a detail: ``admitted`` False, ``note``)."""

    def stop(self) -> None:
        """Stop the engine (if this link owns it) and stop delivering."""


@dataclass
class _Refusals:
    readonly: bool = False
    journaled: bool = False
    sent: list[SentCommand] = field(default_factory=list)
    #: Why commands are off, in words the room shows (``read-only: no command secret …``).
    readonly_reason: str = "read-only: commands are off"

    def refuse(self, cmd: Command) -> CommandResult | None:
        if self.readonly:
            result = CommandResult(False, 0, self.readonly_reason)
            self.sent.append(SentCommand(cmd, result))
            return result
        return None


class EngineLink(_Refusals):
    """Runs ``Engine(spec, run_dir)`` on a thread of its own and links the app to it."""

    owns_engine = True

    def __init__(self, spec: PipelineSpec, run_dir: Path | str | None = None, *, backend: Backend | None = None,
                 readonly: bool = False, exports: ExportSettings | None = None, **engine_options: Any) -> None:
        super().__init__(readonly=readonly)
        #: A trace file and a metrics endpoint written while the engine runs (``--trace``, ``--metrics``).
        self.exports = exports
        self.metrics_url: str | None = None
        self.spec = spec
        self.run_dir = run_dir
        self._backend = backend
        self._engine_options = engine_options
        self._post: Post | None = None
        self._startup_error: BaseException | None = None
        self._stopped: EngineStopped | None = None
        self._engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread = LoopThread("warpdeck-engine", self._serve)
        self._opened = False
        self.report: RunReport | None = None
        self.error = ""
        journal = engine_options.get("journal")
        self.journaled = run_dir is not None if journal is None else bool(journal)  # as the engine decides

    def open(self) -> None:
        """Start the engine on its own thread and wait until it runs; re-raises what stopped it
        from starting (a bad run directory, a backend that is not there)."""
        if self._opened:
            return
        self._opened = True
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error

    def start(self, post: Post) -> None:
        self.open()
        self._post = post
        if self._engine is not None and self._engine.publisher.latest is not None:
            post(SnapshotArrived(self._engine.publisher.latest))
        if self._stopped is not None:
            post(self._stopped)

    def _deliver(self, message: Message) -> None:
        if self._post is not None:
            self._post(message)

    async def _serve(self, stopping: asyncio.Event) -> None:
        try:
            await self._run(stopping)
        except BaseException as exc:  # noqa: BLE001 - whatever killed the engine goes to the screen, not to stderr
            if not self._ready.is_set():
                self._startup_error = exc
            self.error = "".join(traceback.format_exception(exc))
        finally:
            self._ready.set()
            self._stopped = EngineStopped(self.report, self.error)
            self._deliver(self._stopped)

    async def _run(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        engine = Engine(self.spec, self.run_dir, backend=self._backend, **self._engine_options)
        with exporting(self.exports, engine.events, engine.publisher, self.spec.name) as out:
            self.metrics_url = out.metrics_url
            await self._run_engine(engine, stopping)

    async def _run_engine(self, engine: Engine, stopping: asyncio.Event) -> None:
        async with engine:
            self._engine = engine
            engine.publisher.subscribe(lambda snap: self._deliver(SnapshotArrived(snap)))
            self._ready.set()
            run = asyncio.create_task(engine.wait())
            stop = asyncio.create_task(stopping.wait())
            try:
                await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                run.cancel()  # stopped by the user: the engine writes its report as it closes, read below
                with contextlib.suppress(asyncio.CancelledError):
                    self.report = await run
        self.report = self.report or engine.report

    async def _call(self, fn: Callable[[Engine], _T]) -> _T:
        assert self._loop is not None and self._engine is not None, "start the link first"
        engine = self._engine

        async def call() -> _T:
            return fn(engine)

        coro = call()
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:  # the loop is closed
            coro.close()
            raise
        return await asyncio.wrap_future(fut)

    async def send(self, cmd: Command) -> CommandResult:
        refused = self.refuse(cmd)
        if refused is not None:
            return refused
        if self._engine is None or self._loop is None or self._loop.is_closed():
            result = CommandResult(False, 0, "the engine has stopped")
        else:
            engine = self._engine
            fut = asyncio.run_coroutine_threadsafe(engine.command(cmd), self._loop)
            result = await asyncio.wrap_future(fut)
        self.sent.append(SentCommand(cmd, result))
        return result

    async def detail(self, key: str) -> TaskDetail | None:
        engine, loop = self._engine, self._loop
        if engine is None:
            return None
        if engine.report is None and loop is not None and not loop.is_closed():
            try:
                return await self._call(lambda e: e.task_detail(key))
            except RuntimeError:  # the engine's loop closed in between
                pass
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we were cancelled, not the engine's loop ended
        # The run is over: its table no longer changes and answers from any thread (the journal for
        # tasks an earlier run finished).
        return await asyncio.to_thread(engine.task_detail, key)

    @property
    def latest(self) -> EngineSnapshot | None:
        """The engine's newest snapshot, whether or not the app has seen it."""
        return self._engine.publisher.latest if self._engine is not None else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the engine's run is over (at most ``timeout`` s); True if it is."""
        return self._thread.join(timeout)

    def stop(self) -> None:
        self._thread.stop(10)


class StreamLink(_Refusals):
    """Delivers the given snapshots in order, ``interval`` seconds apart (0: all at once).

    Commands are recorded and refused: there is no engine behind a stream."""

    owns_engine = False

    def __init__(self, snapshots: Iterable[EngineSnapshot], *, interval: float = 0.0,
                 details: dict[str, TaskDetail] | None = None, label: str = "") -> None:
        super().__init__(readonly=False, readonly_reason="replay: no engine to command")
        #: What the room says it shows, beside the status (a replay and its speed); "" for none.
        self.label = label
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
