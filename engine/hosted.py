"""An engine on a thread and event loop of its own, for a front end that runs a loop of its own.

The decisions this module protects:
- A front end (the control room in a terminal, a browser's room, a test) never shares a loop with
  the engine: a slow repaint can never slow the pipeline, and a busy engine can never freeze the
  keyboard. Hosting an engine so is engine work and is written once, here, below every front end;
  the control room's link only turns what arrives into its own messages.
- What crosses the threads is narrow. Commands and task details run on the engine's loop and are
  awaited from the caller's (``command``, ``task_detail``). Snapshots and the run's end arrive
  through the callbacks a front end gives to ``watch``, called on the engine's thread, so they must
  only hand the value on (Textual's ``post_message`` is thread-safe) and return.
- Every watcher hears of the end exactly once, whenever it started watching: before the run ended,
  or after (then at once). Whatever stopped the engine, a startup failure included, is kept as its
  traceback (``error``) for the screen, never lost on stderr; ``open`` re-raises a startup failure.
- A spec with steps is hosted the same way, one segment's engine at a time (``run_steps``): commands,
  details and snapshots go to and come from the segment running; the end is the last segment's. A
  gate with no decision is asked of the watchers (``on_gate``) and waits for ``answer_gate``; a
  stop while it waits leaves the gate undecided (the run is held there, exit status 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.control.looping import LoopThread
from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.exports import ExportSettings, exporting
from warpdeck.engine.edges.step_ledger import GateDecision
from warpdeck.engine.engine import Engine
from warpdeck.engine.state.commands import Command, CommandResult
from warpdeck.engine.state.report import RunReport
from warpdeck.engine.state.snapshot import EngineSnapshot, TaskDetail
from warpdeck.engine.state.step_report import StepsReport
from warpdeck.engine.steps.plan import Segment, plan_steps, step_words
from warpdeck.engine.steps.runner import GateAsk, StepRun, run_steps

__all__ = ["HostedEngine"]

_STOP_S = 10.0
"""How long ``stop`` waits for the engine to write its report and close."""


@dataclass(frozen=True, slots=True)
class _Watcher:
    on_snapshot: Callable[[EngineSnapshot], object]
    on_end: Callable[[RunReport | None, str], object]
    on_gate: Callable[[GateAsk | None], object] | None
    on_step: Callable[[str], object] | None


class HostedEngine:
    """Runs ``Engine(spec, run_dir, **engine_options)`` on a thread of its own (``open``), with the
    trace and metrics exports ``exports`` asks for, until the run ends or ``stop`` is called."""

    def __init__(self, spec: PipelineSpec, run_dir: Path | str | None = None, *, backend: Backend | None = None,
                 exports: ExportSettings | None = None, **engine_options: Any) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.exports = exports
        """A trace file and a metrics endpoint written while the engine runs (``--trace``, ``--metrics``)."""
        self.metrics_url: str | None = None
        """Where the metrics endpoint serves, once the engine runs with one."""
        self.report: RunReport | None = None
        """The run's report, once the engine has closed (a stopped run has one too)."""
        self.error = ""
        """The traceback of whatever stopped the engine, "" when nothing did."""
        journal = engine_options.get("journal")
        self.journaled = run_dir is not None if journal is None else bool(journal)  # as the engine decides
        """Whether the engine keeps a journal, so a stopped run resumes where it stopped."""
        self._backend = backend
        self._decisions: dict[str, GateDecision] = engine_options.pop("decisions", {})
        """Gate decisions given before the run (a spec with steps: ``--approve``)."""
        self._engine_options = engine_options
        self.steps_report: StepsReport | None = None
        """A spec with steps: the report of its steps, once the run is over."""
        self.step = ""
        """A spec with steps: the step running now, in words (``step_words``); "" before the first."""
        self.gate: GateAsk | None = None
        """The gate the run waits at for an answer (``answer_gate``), None when it waits at none."""
        self._gate_answer: asyncio.Future[GateDecision] | None = None
        self._engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._lock = threading.Lock()
        self._watchers: list[_Watcher] = []
        self._ended = False
        self._opened = False
        self._thread = LoopThread("warpdeck-engine", self._serve)

    def open(self) -> None:
        """Start the engine on its own thread and wait until it runs; re-raises what stopped it
        from starting (a bad run directory, a backend that is not there). Idempotent."""
        if self._opened:
            return
        self._opened = True
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error

    def watch(self, on_snapshot: Callable[[EngineSnapshot], object],
              on_end: Callable[[RunReport | None, str], object],
              on_gate: Callable[[GateAsk | None], object] | None = None,
              on_step: Callable[[str], object] | None = None) -> None:
        """From now on, ``on_snapshot(snapshot)`` for each snapshot (first the newest there is), and
        ``on_end(report, error)`` once when the run is over (at once if it is); a spec with steps:
        ``on_gate(ask)`` when the run waits at a gate (at once if it does), ``on_gate(None)`` once it
        no longer does, and ``on_step(words)`` as each step starts. All are called on the engine's
        thread, or on the caller's for what was there already: hand the value on."""
        watcher = _Watcher(on_snapshot, on_end, on_gate, on_step)
        with self._lock:
            self._watchers.append(watcher)
            ended = self._ended
            gate = self.gate
            step = self.step
        if step and on_step is not None:
            on_step(step)
        if (latest := self.latest) is not None:
            on_snapshot(latest)
        if gate is not None and on_gate is not None:
            on_gate(gate)
        if ended:
            on_end(self.report, self.error)

    def answer_gate(self, decision: GateDecision) -> bool:
        """Answer the gate the run waits at (from any thread); False when it waits at none."""
        loop, answer = self._loop, self._gate_answer
        if loop is None or answer is None or loop.is_closed():
            return False
        def settle() -> None:
            if not answer.done():
                answer.set_result(decision)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed in between
            return False
        return True

    @property
    def latest(self) -> EngineSnapshot | None:
        """The engine's newest snapshot, whether or not a watcher has seen it."""
        return self._engine.publisher.latest if self._engine is not None else None

    @property
    def ended(self) -> bool:
        """Whether the run is over (finished, stopped, or failed to start)."""
        return self._ended

    async def command(self, cmd: Command) -> CommandResult:
        """Carry ``cmd`` to the engine's loop and return its answer; a refusal once it has stopped."""
        engine, loop = self._engine, self._loop
        if engine is None or loop is None or loop.is_closed():
            return CommandResult(False, 0, "the engine has stopped")
        try:
            fut = asyncio.run_coroutine_threadsafe(engine.command(cmd), loop)
        except RuntimeError:  # the loop closed in between
            return CommandResult(False, 0, "the engine has stopped")
        return await asyncio.wrap_future(fut)

    async def task_detail(self, key: str) -> TaskDetail | None:
        """Everything known about one task, during the run and after it; None only for a key the
        engine does not know."""
        engine, loop = self._engine, self._loop
        if engine is None:
            return None
        if engine.report is None and loop is not None and not loop.is_closed():
            coro = self._detail_on_loop(engine, key)
            try:
                fut = asyncio.run_coroutine_threadsafe(coro, loop)
                return await asyncio.wrap_future(fut)
            except RuntimeError:  # the engine's loop closed in between
                coro.close()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we were cancelled, not the engine's loop ended
        # The run is over: its table no longer changes and answers from any thread (the journal for
        # tasks an earlier run finished).
        return await asyncio.to_thread(engine.task_detail, key)

    @staticmethod
    async def _detail_on_loop(engine: Engine, key: str) -> TaskDetail | None:
        return engine.task_detail(key)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the engine's run is over (at most ``timeout`` s); True if it is."""
        return self._thread.join(timeout)

    def stop(self) -> None:
        """Stop the run (the engine writes its report as it closes) and wait for its thread."""
        self._thread.stop(_STOP_S)

    async def _serve(self, stopping: asyncio.Event) -> None:
        try:
            await self._run(stopping)
        except BaseException as exc:  # noqa: BLE001 - whatever killed the engine goes to the screen, not to stderr
            if not self._ready.is_set():
                self._startup_error = exc
            self.error = "".join(traceback.format_exception(exc))
        finally:
            self._ready.set()
            with self._lock:
                self._ended = True
                watchers = list(self._watchers)
            for w in watchers:
                w.on_end(self.report, self.error)

    async def _run(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        if self.spec.steps:
            await self._run_steps(stopping)
            return
        engine = Engine(self.spec, self.run_dir, backend=self._backend, **self._engine_options)
        with exporting(self.exports, engine.events, engine.publisher, self.spec.name) as out:
            self.metrics_url = out.metrics_url
            async with engine:
                self._engine = engine
                engine.publisher.subscribe(self._publish)
                self._ready.set()
                await self._until_done_or_stopped(engine, stopping)
            self.report = self.report or engine.report

    async def _run_steps(self, stopping: asyncio.Event) -> None:
        if self.run_dir is None:
            raise ValueError("a spec with steps runs in a run directory (its ledger and each step's journal)")
        options = self._engine_options

        plan = plan_steps(self.spec)

        async def drive(engine: Engine, seg: Segment) -> None:
            self._engine = engine
            words = step_words(plan, seg)
            with self._lock:
                self.step = words
                watchers = list(self._watchers)
            for w in watchers:
                if w.on_step is not None:
                    w.on_step(words)
            engine.publisher.subscribe(self._publish)
            self._ready.set()
            await self._until_done_or_stopped(engine, stopping)

        async def decide(ask: GateAsk) -> GateDecision | None:
            self._ready.set()  # the steps before it finished earlier: the front end waits for nothing else
            return await self._ask_gate(ask, stopping)

        how = StepRun(decisions=self._decisions, decide=decide, drive=drive, backend=self._backend,
                      retry_failed=bool(options.get("retry_failed", False)), control=options.get("control"))
        self.steps_report = await run_steps(self.spec, self.run_dir, how)

    async def _ask_gate(self, ask: GateAsk, stopping: asyncio.Event) -> GateDecision | None:
        """Ask the watchers at ``ask``'s gate and wait for ``answer_gate``, or for a stop (None: held)."""
        answer: asyncio.Future[GateDecision] = asyncio.get_running_loop().create_future()
        with self._lock:
            self.gate, self._gate_answer = ask, answer
            watchers = list(self._watchers)
        self._tell_gate(watchers, ask)
        stop: asyncio.Future[bool] = asyncio.ensure_future(stopping.wait())
        waits: list[asyncio.Future[Any]] = [answer, stop]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            with self._lock:
                self.gate, self._gate_answer = None, None
                watchers = list(self._watchers)
            self._tell_gate(watchers, None)
        return answer.result() if answer.done() and not answer.cancelled() else None

    @staticmethod
    def _tell_gate(watchers: list[_Watcher], ask: GateAsk | None) -> None:
        for w in watchers:
            if w.on_gate is not None:
                w.on_gate(ask)

    def _publish(self, snap: EngineSnapshot) -> None:
        with self._lock:
            watchers = list(self._watchers)
        for w in watchers:
            w.on_snapshot(snap)

    async def _until_done_or_stopped(self, engine: Engine, stopping: asyncio.Event) -> None:
        run = asyncio.create_task(engine.wait())
        stop = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            run.cancel()  # stopped by the user: the engine writes its report as it closes, read below
            with contextlib.suppress(asyncio.CancelledError):
                self.report = await run
