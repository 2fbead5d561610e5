"""The prompt over a screen that has no prompt bar of its own (help, detail, a confirmation)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.suggester import Suggester

from warpdeck.tui.widgets.prompt_bar import Check, PromptBar

__all__ = ["PromptScreen"]


class PromptScreen(ModalScreen[str | None]):
    """Returns the text entered (enter) or None (escape). ``check`` returns an error to show
    instead of closing, or None when the text is good."""

    DEFAULT_CSS = """
    PromptScreen { align: left bottom; background: $background 30%; layers: default prompt; }
    """

    def __init__(self, prompt: str, *, value: str = "", hint: str = "", suggester: Suggester | None = None,
                 check: Check | None = None) -> None:
        super().__init__()
        self.prompt = prompt
        self.value = value
        self.hint = hint
        self.suggester = suggester
        self.check = check
        self.bar = PromptBar()

    def compose(self) -> ComposeResult:
        yield self.bar

    def on_mount(self) -> None:
        self.bar.ask(self.prompt, value=self.value, hint=self.hint, suggester=self.suggester, check=self.check,
                     then=self.dismiss)

    def complete(self) -> None:
        """Take the suggested completion (tab)."""
        self.bar.complete()
