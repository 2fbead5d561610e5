"""Confirmation for destructive actions; the worst ones ask for a word to be typed.

A question about tasks that are moving on (a cancel) is asked again with every snapshot while
the dialog is open (``describe``), so what is confirmed is the task as it is then.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.app_access import warpdeck_app

__all__ = ["ConfirmScreen"]


class ConfirmScreen(ModalScreen[bool]):
    """Asks ``question``; with ``type_to_confirm``, Yes only works once that text is typed."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,n", "answer(False)", "No"),
                                             Binding("y", "answer(True)", "Yes")]

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 64; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    ConfirmScreen Horizontal { height: auto; margin-top: 1; }
    ConfirmScreen Button { margin-right: 2; }
    ConfirmScreen Label { width: 1fr; }
    ConfirmScreen .hint { color: $text-muted; }
    """

    def __init__(self, question: str, *, type_to_confirm: str | None = None,
                 describe: Callable[[], Awaitable[str]] | None = None, name: str | None = None) -> None:
        super().__init__(name=name)
        self.question = question
        self.type_to_confirm = type_to_confirm
        self._describe = describe
        self.shown_at: float | None = None
        """When it was put on screen (mounted: drawn within the frame; ``time.monotonic``, the clock of a key's
        ``time``): only keys typed since can answer it (``tui/keygate.py``). None until then. Not at its first refresh's
        callback: on a busy loop that ran after the terminal showed it, and a key typed by someone who had read the
        question was set aside."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(self.question), id="question")  # it names task keys: text, not markup
            if self.type_to_confirm is not None:
                yield Label(f"Type [b]{self.type_to_confirm}[/b] to confirm:", classes="hint")
                yield Input(id="confirm-text")
            else:
                yield Label("y: yes   n or escape: no", classes="hint")
            with Horizontal():
                yield Button("Yes", id="yes", variant="error", disabled=self.type_to_confirm is not None)
                yield Button("No", id="no", variant="primary")

    def on_mount(self) -> None:
        self.shown_at = time.monotonic()
        if self._describe is not None:
            self.watch(warpdeck_app(self), "snapshot", self._snapshot_changed)
        if self.type_to_confirm is not None:
            self.query_one(Input).focus()
        else:
            self.query_one("#no", Button).focus()

    def on_unmount(self) -> None:
        gate = getattr(self.app, "keygate", None)
        if gate is not None:  # the keys typed before it was visible go on now
            gate.give_back()

    def _snapshot_changed(self, _snap: EngineSnapshot | None) -> None:
        self._ask_again()

    @work(group="confirm-question", exclusive=True)
    async def _ask_again(self) -> None:
        assert self._describe is not None
        question = await self._describe()
        labels = self.query("#question")  # none once the dialog was answered during the wait
        if question != self.question and labels:
            self.question = question
            labels.first(Label).update(Text(question))

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#yes", Button).disabled = event.value != self.type_to_confirm

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value == self.type_to_confirm:
            self.dismiss(True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        if yes and self.type_to_confirm is not None:
            return  # typing is the confirmation; 'y' is just a letter of it
        self.dismiss(yes)
