"""A one-line prompt at the foot of the screen: the filter (``/``) and command mode (``:``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Input, Label

__all__ = ["PromptScreen"]


class PromptScreen(ModalScreen[str | None]):
    """Returns the text entered (enter) or None (escape). ``check`` returns an error to show
    instead of closing, or None when the text is good."""

    BINDINGS: ClassVar = [Binding("escape", "cancel", "Cancel")]

    DEFAULT_CSS = """
    PromptScreen { align: left bottom; background: $background 30%; }
    PromptScreen > Vertical { height: auto; background: $panel; padding: 0 1; }
    PromptScreen Input, PromptScreen Input:focus { border: none; height: 1; padding: 0; background: $panel; }
    PromptScreen .hint { color: $text-muted; height: 1; }
    PromptScreen .error { color: $error; height: auto; }
    """

    def __init__(self, prompt: str, *, value: str = "", hint: str = "", suggester: Suggester | None = None,
                 check: Callable[[str], str | None] | None = None) -> None:
        super().__init__()
        self.prompt = prompt
        self.value = value
        self.hint = hint
        self.suggester = suggester
        self.check = check

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.hint, classes="hint")
            yield Label("", classes="error", id="prompt-error")
            yield Input(self.value, placeholder=self.prompt, suggester=self.suggester, id="prompt-input")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        error = self.check(event.value) if self.check else None
        if error:
            self.query_one("#prompt-error", Label).update(error)
            return
        self.dismiss(event.value)

    def complete(self) -> None:
        """Take the suggested completion (tab), as the right arrow does at the end of the line."""
        field = self.query_one(Input)
        field.cursor_position = len(field.value)
        field.action_cursor_right()

    def action_cancel(self) -> None:
        self.dismiss(None)
