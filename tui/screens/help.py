"""Help: every key, generated from the key table, grouped as the table groups them."""

from __future__ import annotations

from itertools import groupby
from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from warpdeck.tui.keymap import KEYS, Key

__all__ = ["HelpScreen", "help_table"]


def help_table() -> Table:
    """The key table as a rich table: group, keys, what they do."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column("group", style="bold")
    table.add_column("keys", style="bold")
    table.add_column("what")
    for group, keys in groupby(KEYS, key=lambda k: k.group):
        first = True
        for key in keys:
            table.add_row(group if first else "", _keys(key), key.description)
            first = False
    table.add_row("Anywhere", "ctrl+p", "Command palette: every action by name")
    table.add_row("", "escape", "Close a dialog, the help or the task detail")
    return table


def _keys(key: Key) -> str:
    names = key.keys.split(",")
    if key.display:
        names[0] = key.display
    return " ".join(n for n in names if n not in ("equals_sign",))


class HelpScreen(ModalScreen[None]):
    """Every key the control room knows."""

    BINDINGS: ClassVar = [Binding("escape,q,question_mark", "dismiss", "Close"),
                          # The command line and the filter work from here too (a prompt screen opens over it).
                          Binding("colon", "app.command_mode", "Command", show=False),
                          Binding("slash", "app.filter", "Filter", show=False)]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; max-height: 90%; border: thick $accent; background: $surface;
                                  padding: 0 1; }
    HelpScreen .title { text-style: bold; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("warpdeck keys  (escape closes)", classes="title")
            yield Static(help_table())
            yield Static("Filter syntax: words are regexes on the task key; state:failed phase:compute "
                         "stall:memory attempt:2 key:REGEX; '!' before a term inverts it; all terms must hold.")
