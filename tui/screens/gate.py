"""The gate a run of steps waits at: what the steps before it produced, a note, approve or reject.

The decisions this module protects: a gate never opens by itself over what the operator is typing
(the room says a gate waits, and ``a`` opens this); approving or rejecting is confirmed in a
dialog that takes only keys typed once it is on screen (``ConfirmScreen``, ``tui/keygate.py``); a
rejection needs a note, which the report keeps; escape leaves the gate waiting.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from warpdeck.engine.api import GateAsk

__all__ = ["Choice", "GateScreen"]


Choice = tuple[Literal["approved", "rejected"], str]
"""What the operator chose at a gate, and the note."""


class GateScreen(ModalScreen[Choice | None]):
    """Shows ``ask``; returns ``("approved" | "rejected", note)`` once chosen (not yet confirmed), or None (later)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "later", "Later")]

    DEFAULT_CSS = """
    GateScreen { align: center middle; }
    GateScreen > Vertical { width: 90%; max-width: 110; height: auto; max-height: 90%; border: thick $warning;
                            background: $surface; padding: 1 2; }
    GateScreen VerticalScroll { height: auto; max-height: 16; }
    GateScreen Horizontal { height: auto; margin-top: 1; }
    GateScreen Button { margin-right: 2; }
    GateScreen .hint { color: $text-muted; }
    GateScreen #gate-error { color: $error; }
    """

    def __init__(self, ask: GateAsk) -> None:
        super().__init__(name="gate")
        self.ask = ask

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(f"The run waits at the gate of step {self.ask.step}. The steps before it produced:",
                             style="bold"))
            with VerticalScroll():
                for line in self.ask.produced or ("(nothing ran before it)",):
                    yield Label(Text(line))  # keys and values: text, not markup
            yield Input(placeholder="a note for the report (needed to reject)", id="gate-note")
            yield Label("", id="gate-error")
            with Horizontal():
                yield Button("Approve", id="approve", variant="success")
                yield Button("Reject", id="reject", variant="error")
                yield Button("Later", id="later", variant="primary")
            yield Label("tab moves, enter presses; each choice is confirmed; escape: later (a opens this again)",
                        classes="hint")

    def on_mount(self) -> None:
        self.query_one("#later", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "later":
            self.dismiss(None)
            return
        note = self.query_one("#gate-note", Input).value.strip()
        if event.button.id == "reject" and not note:
            self.query_one("#gate-error", Label).update("a rejection needs a note: say why, for the report")
            self.query_one("#gate-note", Input).focus()
            return
        self.dismiss(("approved" if event.button.id == "approve" else "rejected", note))

    def action_later(self) -> None:
        self.dismiss(None)
