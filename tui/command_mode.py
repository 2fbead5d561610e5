"""Command mode's dispatch: one parsed ``:`` line becomes an action, and every verb answers.

The decision this module protects: whatever is typed after ``:``, the user gets a sentence back,
and nothing typed there can take the control room down. A verb without arguments runs the very
action its key runs; one with arguments runs what its row of ``operations.OPERATIONS`` says,
through the methods here, each saying what it did, or why not (``no task 'X'``, ``no worker 'X'``,
a number out of range). What was typed is repeated at most ``ECHO_CELLS`` wide (``echo``).
"""

from __future__ import annotations

from collections.abc import Callable

from warpdeck.tui.actions import PipelineActions
from warpdeck.tui.command_line import Parsed, echo
from warpdeck.tui.filtering import FilterError, TaskFilter
from warpdeck.tui.operations import SCREENS, VERBS, operation
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.workers import WorkersScreen

__all__ = ["CommandMode"]


class CommandMode(PipelineActions):
    """Mixed into the app: ``run_command`` carries out one parsed command line."""

    # The app's:
    set_filter: Callable[[str | None], None]
    action_screen: Callable[[str], None]
    said_refused: Callable[[], bool]

    @property
    def theme_names(self) -> list[str]:
        """The themes ``:theme`` may name (the app's)."""
        raise NotImplementedError

    async def run_command(self, cmd: Parsed) -> None:
        """Carry out one parsed command-mode line."""
        verb = VERBS[cmd.verb]
        op = operation(verb.action)
        if op is not None and op.commands and self.said_refused():
            return
        if verb.run is None:
            if op is not None and op.when is not None and not op.when(self):
                self.notify(op.otherwise or f"{cmd.verb}: not now", timeout=4)  # the same words as the engine's
                return
            await self.run_action(verb.action)
            return
        done = verb.run(self, cmd.args)
        if done is not None:
            await done

    async def open_detail(self, key: str) -> None:
        """The task's detail, or ``no task 'X'``."""
        if await self.link.detail(key) is None:
            self.notify(f"no task {echo(key)!r}", severity="warning")
            return
        self.push_screen(DetailScreen(key))

    def apply_filter(self, text: str) -> None:
        """Set the task filter to ``text`` (empty clears it), or say why it is not a filter."""
        try:
            TaskFilter(text)
        except FilterError as exc:
            self.notify(f"{echo(exc.term)!r}: {exc.why}", severity="warning")
            return
        self.set_filter(text)
        self.notify(f"filter /{echo(text)}/" if text else "filter cleared", timeout=2)

    def show_screen(self, name: str) -> None:
        """Switch to a screen by name, or list the screens."""
        if name not in SCREENS:
            self.notify(f"no screen {echo(name)!r}; screens: {', '.join(SCREENS)}", severity="warning")
        else:
            self.action_screen(name)

    def use_theme(self, name: str) -> None:
        """Switch to a theme by name, or list the themes."""
        if name not in self.theme_names:
            self.notify(f"no theme {echo(name)!r}; themes: {', '.join(self.theme_names)}", severity="warning")
        else:
            self.theme = name
            self.notify(f"theme {name}", timeout=2)

    def show_worker(self, worker: str) -> None:
        """The workers screen with ``worker`` highlighted, or ``no worker 'X'``."""
        if not self.known_worker(worker):
            return
        self.action_screen("workers")
        screen = self.screen
        if isinstance(screen, WorkersScreen):
            screen.highlight(worker)
        else:  # a dialog (a task's detail) is open over the workers screen
            self.notify(f"worker {echo(worker)}: close the dialog over the workers screen first", severity="warning")
