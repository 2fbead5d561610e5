"""The control room app: themes, screens, global keys and the current snapshot; nothing else.

Screens and widgets derive what they show from ``snapshot``; keys become commands through the
link (``actions.py``). Repaints follow snapshots, at most ``MAX_REPAINT_HZ`` a second. Once the
first snapshot is painted, full garbage collections wait for the keyboard to go quiet
(``collector.py``): one could take longer than a key may wait.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import ClassVar

from textual import events
from textual.actions import ActionParseResult
from textual.app import App, ScreenStackError, SystemCommand
from textual.binding import BindingType
from textual.dom import DOMNode
from textual.notifications import SeverityLevel
from textual.reactive import var
from textual.screen import ModalScreen, Screen
from textual.suggester import Suggester
from textual.timer import Timer
from textual.widgets import Input

from warpdeck.engine.api import EngineSnapshot
from warpdeck.themes import BUILTIN_THEMES, DEFAULT_THEME, all_themes
from warpdeck.tui.collector import QuietCollector
from warpdeck.tui.command_line import CommandLineError, IdSuggester, parse
from warpdeck.tui.command_mode import CommandMode
from warpdeck.tui.filtering import FilterError, TaskFilter
from warpdeck.tui.keygate import KeyGate, KeyRouted
from warpdeck.tui.keymap import bindings
from warpdeck.tui.link import Link
from warpdeck.tui.messages import EngineStopped, GateAsked, SnapshotArrived, StepStarted, StreamEnded
from warpdeck.tui.operations import COMMAND_KEYS, SCREENS, asks_first, operation
from warpdeck.tui.palette import KeyCommands
from warpdeck.tui.screens.board import BoardScreen
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.gate import GateScreen
from warpdeck.tui.screens.help import HelpScreen
from warpdeck.tui.screens.prompt import PromptScreen
from warpdeck.tui.screens.timeline import TimelineScreen
from warpdeck.tui.screens.workers import WorkersScreen
from warpdeck.tui.stop_signals import StopSignals, release_dead_terminal, terminal_gone
from warpdeck.tui.undo import UndoStack
from warpdeck.tui.widgets.prompt_bar import Check, PromptBar
from warpdeck.tui.worker_changes import WorkerLog, worker_changes

__all__ = ["MAX_REPAINT_HZ", "WarpdeckApp"]

MAX_REPAINT_HZ = 10.0


class WarpdeckApp(CommandMode, App[int]):
    """The warpdeck control room over one link (an engine in process, a recording, a remote one)."""

    TITLE = "warpdeck"
    # Notifications stand above the screens' figures strip (2 lines) and footer (1 line), which they
    # covered at 80x24: Textual keeps them one line up, clear of a footer only.
    CSS = "ToastRack { margin-bottom: 3; }"
    BINDINGS: ClassVar[list[BindingType]] = bindings("app")
    COMMANDS: ClassVar = App.COMMANDS | {KeyCommands}
    MODES: ClassVar = {"board": BoardScreen, "workers": WorkersScreen, "timeline": TimelineScreen}
    DEFAULT_MODE = "board"

    snapshot: var[EngineSnapshot | None] = var(None, always_update=True)
    """The newest snapshot shown."""
    task_filter: var[TaskFilter] = var(TaskFilter)
    """The board's filter (``/``)."""
    filter_text: var[str] = var("")
    """The filter as typed."""
    follow: var[bool] = var(True)
    """Views slide with the newest snapshot; off freezes them."""
    readonly_note: var[str] = var("")
    """Shown in the status bar when commands are off."""

    def __init__(self, link: Link, *, theme: str | None = None, theme_dir: Path | None = None,
                 screenshot_dir: Path | None = None, log_path: Path | None = None) -> None:
        super().__init__()
        self.link = link
        self.undo_stack = UndoStack()
        self._asked = {}
        self.gate = None
        self.stopped: EngineStopped | None = None
        self.stop_signals = StopSignals(self._end_on_signal)
        """SIGTERM and SIGHUP end the room as a confirmed quit does (``stop_signals.py``)."""
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"warpdeck-control-room-{os.getpid()}.log"
        """Where the traceback of anything that went wrong in the control room is written."""
        self.errors = 0
        """Unexpected errors caught (each shown, and logged to ``log_path``)."""
        self._themes, self._theme_errors = all_themes(theme_dir)
        # warpdeck's themes only: Textual's own colour the app in part (no wd-* domain colours).
        for name in list(self.available_themes):
            self.unregister_theme(name)
        for t in self._themes.values():
            self.register_theme(t)
        self.theme = theme if theme in self.available_themes else DEFAULT_THEME
        self._screenshot_dir = screenshot_dir or Path.cwd()
        self._pending: EngineSnapshot | None = None
        self._last_paint = 0.0
        self._paint_timer: Timer | None = None
        self.collector = QuietCollector()
        self.worker_log = WorkerLog()
        """Every worker change notified in this room (the workers screen lists the latest)."""
        self.keys_seen = 0
        """Key presses so far: the board holds its snapshot parts back from a key's frame."""
        self.readonly_note = link.label or ("read-only" if link.readonly else "")
        self.keygate = KeyGate(self, self._route_input)

    # -- what may run now --------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _ASKS_FIRST and self.prompt_open:
            return False  # a prompt has the keyboard: nothing that asks to destroy work opens over it
        op = operation(action)
        if op is not None and op.commands and self.command_refusal() is not None:
            return False  # not offered (the key, if pressed, says why: ``_refused_key``)
        return op is None or op.when is None or op.when(self)

    def command_refusal(self) -> str | None:
        """Why this room cannot command its engine now (read-only, or the run over), or None."""
        if self.link.readonly:
            return self.link.readonly_reason
        snap = self.snapshot
        if self.stopped is not None or (snap is not None and (snap.finished or snap.status == "stopped")):
            return "the run has ended: there is nothing to command"
        return None

    def _refused_key(self, event: events.Key) -> bool:
        """A key bound to a command this room cannot send now: said why (and not routed)."""
        if self.prompt_open or self.screen.name not in SCREENS:
            return False
        if not {("app", event.key), (self.screen.name, event.key)} & COMMAND_KEYS:
            return False
        return self.said_refused()

    def said_refused(self) -> bool:
        """If this room cannot command now, say why (True); else False."""
        why = self.command_refusal()
        if why is not None:
            self.notify(why, severity="warning", timeout=4)
        return why is not None

    @property
    def prompt_open(self) -> bool:
        """A prompt (``:`` or ``/``) has the keyboard."""
        bar = self._prompt_bar()
        return isinstance(self.screen, PromptScreen) or (bar is not None and bar.is_open)

    async def run_action(self, action: str | ActionParseResult, default_namespace: DOMNode | None = None,
                         namespaces: Mapping[str, DOMNode] | None = None) -> bool:
        """Textual's, except that an action that fails is shown and logged, and the app goes on."""
        try:
            return await super().run_action(action, default_namespace, namespaces)
        except Exception as exc:  # noqa: BLE001 - the control room (and the run) must outlive any one key
            self.report_error(str(action), exc)
            return True

    @property
    def crash(self) -> BaseException | None:
        """What stopped the app, if an error did (Textual keeps it, and exits, on any error a
        handler lets out; actions are caught before, in ``run_action``)."""
        return self._exception

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Textual's, as plain text whatever the caller asks (screens pass ``markup=True`` on): a
        notification repeats task keys, error text, a worker's note and what was typed, and read
        as markup their brackets would change them (``[bold]`` vanishes, ``[/data]`` closes a tag)."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def report_error(self, what: str, error: BaseException) -> None:
        """Show that ``what`` failed, and write its traceback to ``log_path``."""
        self.errors += 1
        where = self._write_traceback(what, error)
        self.notify(f"{what}: {type(error).__name__}: {error}. The control room goes on; traceback in {where}",
                    title="something went wrong", severity="error", timeout=15)

    def log_crash(self) -> None:
        """Write what stopped the app (``crash``) to ``log_path``."""
        if self.crash is not None:
            self._write_traceback("the control room stopped", self.crash)

    def _write_traceback(self, what: str, error: BaseException) -> str:
        """Append ``error``'s traceback to the log; returns where it went, in words."""
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n")
                log.write("".join(traceback.format_exception(error)))
        except OSError as exc:
            return f"nowhere ({self.log_path} could not be written: {exc.strerror})"
        return str(self.log_path)

    @property
    def theme_names(self) -> list[str]:
        """warpdeck's themes and the user's, in the order ``t`` cycles through them."""
        return list(self._themes)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # A user's theme may lack warpdeck's domain colours.
        return dict(BUILTIN_THEMES[DEFAULT_THEME].variables)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        # Textual's, less its Quit (which quits without asking): ours is in the key table.
        for command in super().get_system_commands(screen):
            if command.callback != self.action_quit:
                yield command

    async def action_quit(self) -> None:
        """Every way out asks while work runs (Textual binds its quit to ctrl+q)."""
        self.action_quit_app()

    def on_mount(self) -> None:
        self.stop_signals.install()
        for error in self._theme_errors:
            self.notify(str(error), title="theme file skipped", severity="warning", timeout=10)
        self._lay_out_screens()
        self.link.start(self.post_message)
        if (metrics := self.link.metrics_url) is not None:  # --metrics: where to scrape
            self.notify(metrics, title="metrics", timeout=10)
        self.set_interval(QuietCollector.CHECK_S, self.collector.tick, name="quiet-collector")

    async def on_unmount(self) -> None:
        self.stop_signals.remove()
        if self.crash is None:  # else the run goes on without the app (``cli/control_room.py``)
            self.link.stop()
        self.collector.stop()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key | events.Paste) and not event.is_forwarded:
            await self.keygate.arrive(event)  # routed when the key before it has been handled
            return
        await super().on_event(event)

    async def _route_input(self, event: events.Key | events.Paste) -> None:
        """Textual's own routing of one key or paste, by the focus of now (``KeyGate``)."""
        if isinstance(event, events.Key):
            self.collector.key_pressed()
            self.keys_seen += 1
            if self._refused_key(event):
                return
        elif self._paste_opens_prompt(event):
            return
        await super().on_event(event)

    def on_key_routed(self, message: KeyRouted) -> None:
        message.stop()
        self.keygate.routed(message)

    def _paste_opens_prompt(self, event: events.Paste) -> bool:
        """A paste that starts with ``:`` or ``/`` over a task list opens that prompt with the
        rest of its first line in it, to be read before enter runs it; other pastes go where the
        focus is (a prompt's input takes the first line)."""
        text = event.text.lstrip()
        if not text or text[0] not in ":/" or isinstance(self.focused, Input) or isinstance(self.screen, ModalScreen):
            return False
        rest = text[1:].splitlines()[0] if len(text) > 1 else ""
        if text[0] == ":":
            self.action_command_mode(rest)
        else:
            self.action_filter(rest)
        return True

    # -- snapshots ---------------------------------------------------------------------------------
    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        snap, before = message.snapshot, self._pending or self.snapshot
        if before is not None:  # a worker lost, waiting or back: said once, as it happens
            # Against the snapshot that arrived last, painted or not: a change between two that
            # arrived within one repaint is still told (and logged before any screen repaints).
            for line, severity in worker_changes(before.workers, snap.workers):
                self.worker_log.add(snap.t, line, severity)
                self.notify(line, title="workers", severity=severity, timeout=10)
        self._pending = snap
        wait = 1.0 / MAX_REPAINT_HZ - (time.monotonic() - self._last_paint)
        if wait <= 0 or message.snapshot.finished:
            self._apply_pending()
        elif self._paint_timer is None:
            self._paint_timer = self.set_timer(wait, self._apply_pending)

    def _apply_pending(self) -> None:
        self._paint_timer = None
        if self._pending is not None:
            self._last_paint = time.monotonic()
            was = (self.paused, self.command_refusal())
            self.snapshot, self._pending = self._pending, None
            if (self.paused, self.command_refusal()) != was:
                self._offer_again()  # the footer offers p resume while paused, no command after the run
            if not self.collector.running:
                self.call_after_refresh(self.collector.start)

    def _offer_again(self) -> None:
        """Have the footer and palette look again at what may run now; not while the app closes
        (the engine's end can arrive after the last screen has gone)."""
        with contextlib.suppress(ScreenStackError):
            self.refresh_bindings()

    def on_stream_ended(self, _message: StreamEnded) -> None:
        label = self.link.label
        if label:  # a replay at the end of its file: it stays on screen, and says it has ended
            self.readonly_note = f"{label} · end of recording"

    def on_step_started(self, message: StepStarted) -> None:
        self.notify(message.words, title="step", timeout=10)

    def on_gate_asked(self, message: GateAsked) -> None:
        self.gate = message.ask
        self._offer_again()  # the footer offers a gate while one waits
        if message.ask is not None:
            self.notify(f"the run waits at the gate of step {message.ask.step}: a shows what came out, to approve or "
                        "reject", title="gate", timeout=30)
        elif isinstance(self.screen, GateScreen):
            self.screen.dismiss(None)  # answered elsewhere, or the run stopped: nothing left to decide here

    def on_engine_stopped(self, message: EngineStopped) -> None:
        self.stopped = message
        self._offer_again()  # nothing left to command
        if message.error:
            self.notify(message.error.splitlines()[-1], title="the engine stopped with an error",
                        severity="error", timeout=30)
        elif message.report is not None:
            r = message.report
            self.notify(f"{r.ended}: {r.counts.done:,} done, {r.counts.failed:,} failed, "
                        f"{r.counts.cancelled:,} cancelled — q quits", title="run over", timeout=15)

    # -- screens -----------------------------------------------------------------------------------
    def delay_update(self, delay: float = 0.05) -> None:
        """Textual holds every repaint back for ``delay`` (50 ms) after a screen switch, to hide the
        new screen being laid out. That hold alone is the whole key-to-repaint budget (DESIGN.md
        section 9), and these screens are laid out once and kept: so the hold ends at once, and the
        switch paints on the next frame."""
        super().delay_update(0.001)  # (a zero delay divides by zero in Textual's timer)

    def _lay_out_screens(self) -> None:
        """Compose, style and lay out the other screens now, before the first snapshot. Textual
        does it on a screen's first visit, and also re-reads every stylesheet then (a screen it
        never styled counts as out of date): 50-80 ms while the key that asked for it waits."""
        for mode in SCREENS:
            if mode not in self._screen_stacks:
                self._init_mode(mode)  # what switch_mode does first on a first visit
                for screen in self._screen_stacks[mode]:
                    screen._css_update_count = self._css_update_count  # styled from today's stylesheet

    def action_screen(self, name: str) -> None:
        if name in SCREENS and self.current_mode != name:
            self.switch_mode(name)

    def action_next_screen(self) -> None:
        self._step_screen(1)

    def action_previous_screen(self) -> None:
        self._step_screen(-1)

    def _step_screen(self, step: int) -> None:
        bar = self._prompt_bar()
        if bar is not None and bar.is_open:
            bar.complete()
            return
        if isinstance(self.screen, PromptScreen):
            self.screen.complete()
            return
        if isinstance(self.screen, ModalScreen):
            # A dialog is open: tab keeps its usual meaning there.
            (self.screen.focus_next if step > 0 else self.screen.focus_previous)()
            return
        i = SCREENS.index(self.current_mode) if self.current_mode in SCREENS else 0
        self.switch_mode(SCREENS[(i + step) % len(SCREENS)])

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # -- view --------------------------------------------------------------------------------------
    def _prompt_bar(self) -> PromptBar | None:
        """The current screen's own prompt bar, if it has one."""
        bars = self.screen.query_children(PromptBar)
        return bars.first() if bars and not isinstance(self.screen, PromptScreen) else None

    def ask(self, prompt: str, then: Callable[[str | None], None], *, value: str = "", hint: str = "",
            suggester: Suggester | None = None, check: Check | None = None) -> None:
        """Open a one-line prompt: the screen's own bar, or a prompt screen over screens without one."""
        bar = self._prompt_bar()
        if bar is not None:
            bar.ask(prompt, value=value, hint=hint, suggester=suggester, check=check, then=then)
        else:
            self.push_screen(PromptScreen(prompt, value=value, hint=hint, suggester=suggester, check=check), then)

    def action_filter(self, value: str | None = None) -> None:
        self.ask("filter (empty clears)", self.set_filter, value=self.filter_text if value is None else value,
                 check=_filter_error,
                 hint="regex on the key · state:failed phase:compute stall:memory attempt:2 · ! inverts · enter sets")

    def set_filter(self, text: str | None) -> None:
        """Set the board's filter (None: leave it as it is)."""
        if text is None:
            return
        self.task_filter = TaskFilter(text)
        self.filter_text = self.task_filter.text

    def action_command_mode(self, value: str = "") -> None:
        suggester = IdSuggester(lambda: self.snapshot, lambda: self.theme_names)
        self.ask(":", self._run_command_line, value=value, suggester=suggester, check=_command_error,
                 hint="command · tab or → completes · enter runs · escape closes")

    def _run_command_line(self, text: str | None) -> None:
        if text:
            # The keys typed after this line wait until it has answered or asked (``KeyGate.hold``),
            # held from now: the worker starts later.
            release = self.keygate.hold()
            self.run_worker(self._then(self._guarded(self.run_command(parse(text)), f":{text.strip()}"), release),
                            group="commands")

    @staticmethod
    async def _then(work: Awaitable[None], release: Callable[[], None]) -> None:
        try:
            await work
        finally:
            release()

    def action_failed(self) -> None:
        """Show failed tasks only; again: clear the filter."""
        self.set_filter("" if self.filter_text == "state:failed" else "state:failed")
        self.notify(f"filter /{self.filter_text}/ (F again clears)" if self.filter_text else "filter cleared",
                    timeout=2)

    def action_follow(self) -> None:
        self.follow = not self.follow
        self.notify("following the newest" if self.follow else "frozen: f follows again", timeout=2)

    def action_next_theme(self) -> None:
        names = self.theme_names
        self.theme = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """Textual's, saved in ``screenshot_dir`` unless ``path`` says where, and said where it went."""
        saved = self.save_screenshot(filename, path=path or str(self._screenshot_dir))
        self.notify(f"saved {saved}", title="screenshot", timeout=5)

    def _work_runs_here(self) -> bool:
        """Whether quitting now stops work this room's engine is still doing."""
        snap = self.snapshot
        return (snap is not None and not snap.finished and self.stopped is None and not self.link.readonly
                and self.link.owns_engine)

    def _end_on_signal(self, signum: int) -> None:
        """SIGTERM or SIGHUP: out as a confirmed quit goes (the run stops: exit 4), not asking."""
        if terminal_gone():
            release_dead_terminal(self)
        if self._work_runs_here():
            self.exit(1, return_code=1)
        else:
            self.exit(0)

    def action_quit_app(self) -> None:
        if isinstance(self.screen, ConfirmScreen) and self.screen.name == "quit":
            return  # already asking
        if self._work_runs_here():
            kept = ("The journal keeps what is done: the same command resumes." if self.link.journaled
                    else "This run keeps no journal: what is not done is lost.")
            self.push_screen(ConfirmScreen(f"Work is still running. Quit and stop the pipeline? {kept}", name="quit"),
                             lambda yes: self.exit(1, return_code=1) if yes else None)
        else:
            self.exit(0)


_ASKS_FIRST = asks_first() | {"quit"}
"""Actions that destroy work or stop the run (each asks first): never opened over an open prompt. Textual's own ``quit``
(its ctrl+q) is ``quit_app`` by another name (``action_quit``)."""


def _filter_error(text: str) -> str | None:
    try:
        TaskFilter(text)
    except FilterError as exc:
        return str(exc)
    return None


def _command_error(text: str) -> str | None:
    try:
        parse(text)
    except CommandLineError as exc:
        return str(exc)
    return None
