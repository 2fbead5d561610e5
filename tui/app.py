"""The control room app: themes, screens, global keys and the current snapshot; nothing else.

Screens and widgets derive what they show from ``snapshot``; keys become commands through the
link (``actions.py``). Repaints follow snapshots, at most ``MAX_REPAINT_HZ`` a second. Once the
first snapshot is painted, full garbage collections wait for the keyboard to go quiet
(``collector.py``): one could take longer than a key may wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import events
from textual.app import App
from textual.reactive import var
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.timer import Timer
from textual.widgets import Input

from warpdeck.engine.api import Cancel, EngineSnapshot, Pause, Resume, RetryFailed
from warpdeck.themes import BUILTIN_THEMES, DEFAULT_THEME, all_themes
from warpdeck.tui.actions import PipelineActions
from warpdeck.tui.collector import QuietCollector
from warpdeck.tui.command_line import CommandLineError, IdSuggester, Parsed, parse
from warpdeck.tui.filtering import FilterError, TaskFilter
from warpdeck.tui.keygate import KeyGate, KeyRouted
from warpdeck.tui.keymap import bindings
from warpdeck.tui.link import Link
from warpdeck.tui.messages import EngineStopped, SnapshotArrived
from warpdeck.tui.palette import KeyCommands
from warpdeck.tui.screens.board import BoardScreen
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.help import HelpScreen
from warpdeck.tui.screens.prompt import PromptScreen
from warpdeck.tui.screens.timeline import TimelineScreen
from warpdeck.tui.screens.workers import WorkersScreen
from warpdeck.tui.undo import UndoSlot
from warpdeck.tui.widgets.prompt_bar import Check, PromptBar

__all__ = ["MAX_REPAINT_HZ", "SCREENS_IN_ORDER", "WarpdeckApp"]

MAX_REPAINT_HZ = 10.0
SCREENS_IN_ORDER = ("board", "workers", "timeline")


class WarpdeckApp(PipelineActions, App[int]):
    """The warpdeck control room over one link (an engine in process, a recording, a remote one)."""

    TITLE = "warpdeck"
    BINDINGS: ClassVar = bindings("app")
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
                 screenshot_dir: Path | None = None) -> None:
        super().__init__()
        self.link = link
        self.undo_slot = UndoSlot()
        self.stopped: EngineStopped | None = None
        self._themes, self._theme_errors = all_themes(theme_dir)
        for t in self._themes.values():
            self.register_theme(t)
        self.theme = theme if theme in self.available_themes else DEFAULT_THEME
        self._screenshot_dir = screenshot_dir or Path.cwd()
        self._pending: EngineSnapshot | None = None
        self._last_paint = 0.0
        self._paint_timer: Timer | None = None
        self.collector = QuietCollector()
        self.keys_seen = 0
        """Key presses so far: the board holds its snapshot parts back from a key's frame."""
        self.readonly_note = "read-only" if link.readonly else ""
        self.keygate = KeyGate(self, self._route_input)

    @property
    def theme_names(self) -> list[str]:
        """warpdeck's themes and the user's, in the order ``t`` cycles through them."""
        return list(self._themes)

    def get_theme_variable_defaults(self) -> dict[str, str]:
        # Textual's own themes (the palette offers them) lack warpdeck's domain colours.
        return dict(BUILTIN_THEMES[DEFAULT_THEME].variables)

    def on_mount(self) -> None:
        for error in self._theme_errors:
            self.notify(str(error), title="theme file skipped", severity="warning", timeout=10)
        self._lay_out_screens()
        self.link.start(self.post_message)
        self.set_interval(QuietCollector.CHECK_S, self.collector.tick, name="quiet-collector")

    async def on_unmount(self) -> None:
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
        self._pending = message.snapshot
        wait = 1.0 / MAX_REPAINT_HZ - (time.monotonic() - self._last_paint)
        if wait <= 0 or message.snapshot.finished:
            self._apply_pending()
        elif self._paint_timer is None:
            self._paint_timer = self.set_timer(wait, self._apply_pending)

    def _apply_pending(self) -> None:
        self._paint_timer = None
        if self._pending is not None:
            self._last_paint = time.monotonic()
            self.snapshot, self._pending = self._pending, None
            if not self.collector.running:
                self.call_after_refresh(self.collector.start)

    def on_engine_stopped(self, message: EngineStopped) -> None:
        self.stopped = message
        if message.error:
            self.notify(message.error.splitlines()[-1], title="the engine stopped with an error",
                        severity="error", timeout=30)
        elif message.report is not None:
            r = message.report
            self.notify(f"{r.status}: {r.counts.done:,} done, {r.counts.failed:,} failed, "
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
        for mode in SCREENS_IN_ORDER:
            if mode not in self._screen_stacks:
                self._init_mode(mode)  # what switch_mode does first on a first visit
                for screen in self._screen_stacks[mode]:
                    screen._css_update_count = self._css_update_count  # styled from today's stylesheet

    def action_screen(self, name: str) -> None:
        if name in SCREENS_IN_ORDER and self.current_mode != name:
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
        i = SCREENS_IN_ORDER.index(self.current_mode) if self.current_mode in SCREENS_IN_ORDER else 0
        self.switch_mode(SCREENS_IN_ORDER[(i + step) % len(SCREENS_IN_ORDER)])

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_detail(self, key: str) -> None:
        self.push_screen(DetailScreen(key))

    # -- view --------------------------------------------------------------------------------------
    def _prompt_bar(self) -> PromptBar | None:
        """The current screen's own prompt bar, if it has one."""
        bars = self.screen.query_children(PromptBar)
        return bars.first() if bars and not isinstance(self.screen, PromptScreen) else None

    def ask(self, prompt: str, then: Callable[[str | None], object], *, value: str = "", hint: str = "",
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
            self.run_worker(self.run_command(parse(text)), group="commands")

    async def run_command(self, cmd: Parsed) -> None:
        """Carry out one parsed command-mode line."""
        v, args = cmd.verb, cmd.args
        simple = {"drain": "drain", "cancel-all": "cancel_all", "requeue": "requeue_stalled", "undo": "undo",
                  "follow": "follow", "help": "help", "quit": "quit_app"}
        if v in simple:
            await self.run_action(simple[v])
        elif v == "pause":
            await self.send(Pause(), undo=("pause", Resume()))
        elif v == "resume":
            await self.send(Resume(), undo=("resume", Pause()))
        elif v == "cancel":
            self.push_screen(ConfirmScreen(f"Cancel {len(args)} task(s): {' '.join(args)[:200]}?"),
                             self._confirmed(Cancel(keys=args)))
        elif v == "retry":
            await self.send(RetryFailed(keys=args))
        elif v == "depth":
            await self.set_depth(int(args[0]))
        elif v == "detail":
            self.action_detail(args[0])
        elif v == "filter":
            self.set_filter(args[0])
        elif v == "screen":
            self._command_screen(args[0])
        elif v == "theme":
            self._command_theme(args[0])
        elif v in ("quarantine", "release"):
            await self.quarantine(args[0], release=v == "release")
        elif v == "worker":
            self.action_screen("workers")
            if not self.screen.highlight(args[0]):  # type: ignore[attr-defined]
                self.notify(f"no worker {args[0]!r}", severity="warning")

    def _command_screen(self, name: str) -> None:
        if name not in SCREENS_IN_ORDER:
            self.notify(f"screens: {', '.join(SCREENS_IN_ORDER)}", severity="warning")
        else:
            self.action_screen(name)

    def _command_theme(self, name: str) -> None:
        if name not in self.available_themes:
            self.notify(f"no theme {name!r}; themes: {', '.join(self.theme_names)}", severity="warning")
        else:
            self.theme = name

    def action_follow(self) -> None:
        self.follow = not self.follow
        self.notify("following the newest" if self.follow else "frozen: f follows again", timeout=2)

    def action_next_theme(self) -> None:
        names = self.theme_names
        self.theme = names[(names.index(self.theme) + 1) % len(names)] if self.theme in names else names[0]
        self.notify(f"theme {self.theme}", timeout=2)

    def action_screenshot(self) -> None:
        path = self.save_screenshot(path=str(self._screenshot_dir))
        self.notify(f"saved {path}", title="screenshot", timeout=5)

    def action_quit_app(self) -> None:
        snap = self.snapshot
        if (snap is not None and not snap.finished and self.stopped is None and not self.link.readonly
                and self.link.owns_engine):
            self.push_screen(ConfirmScreen("Work is still running. Quit and stop the pipeline? "
                                           "(The journal keeps what is done.)"),
                             lambda yes: self.exit(1, return_code=1) if yes else None)
        else:
            self.exit(0)


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
