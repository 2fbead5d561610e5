"""Help: every key, every ``:`` verb, every glyph and every abbreviation the screens use.

The decision this module protects: help is generated from the tables the app runs on (the keys
and verbs of ``operations.OPERATIONS``, the glyph tables), so it cannot fall behind them; only the
glossary of the figures' words is written here, beside the test that looks for each word on the
screens.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import ClassVar, TypeVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from warpdeck.tui.command_line import VERBS, usage
from warpdeck.tui.glyphs import PHASE_GLYPHS, STALL_BADGES, STATE_GLYPHS, WORKER_GLYPHS, Badge
from warpdeck.tui.keymap import KEYS, Key, reading_bindings

__all__ = ["GLOSSARY", "HelpScreen", "glyph_table", "help_table", "verb_table"]

GLOSSARY: tuple[tuple[str, str], ...] = (
    ("tasks/s", "tasks finished per second, recent (avg: over the whole run, once it is over)"),
    ("p50 p99", "task latency, admission to done: the median and the 99th percentile"),
    ("device busy", "share of wall time the compute phase runs: the headline (is the device kept busy?)"),
    ("bottleneck", "the phase holding the device back, its ms per batch and threads, and what to change"),
    ("overlap", "throughput over the bound: 1.00 means nothing more to gain from overlap or threads"),
    ("bound", "the rate the slowest phase allows with the others beside it and host phases on every "
              "thread they may have, within the machine's cores"),
    ("more lanes", "Amdahl: the most extra lanes could speed the run up (×), from its serial part"),
    ("occupancy", "share of its threads' time each phase is busy (a device phase: one stream), averaged over lanes"),
    ("lane-wait", "seconds lanes spent waiting, by stall reason"),
    ("divergence", "distinct batching keys mixed in the last batching window (1: uniform)"),
    ("phi", "how unlikely the silence since a worker's last heartbeat is (about 8: convicted)"),
    ("heartbeat", "age of a worker's last heartbeat (in process: the engine's own worker)"),
)
"""The short words of the figures strip, the timeline and the workers screen, in full."""


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
    table.add_row("", "escape", "Close a dialog, the help, the task detail or a prompt")
    table.add_row("", "tab", "In a prompt: complete; on an empty one, list every verb")
    return table


def verb_table() -> Table:
    """The ``:`` verbs with their arguments."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column("verb", style="bold")
    table.add_column("what")
    for verb, v in VERBS.items():
        table.add_row(":" + usage(verb), v.what)
    return table


def glyph_table() -> Table:
    """Every glyph a row or a worker may carry, and the figures' abbreviations."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column("what", style="bold")
    table.add_column("glyphs")
    table.add_row("task state", _badges(STATE_GLYPHS))
    table.add_row("running phase", _badges(PHASE_GLYPHS))
    table.add_row("stalled", _badges(STALL_BADGES, long=True) + "  (the number after it: for how long)")
    table.add_row("", "↻N: the task's Nth attempt")
    table.add_row("worker", _badges(WORKER_GLYPHS))
    table.add_row("", "")
    for word, meaning in GLOSSARY:
        table.add_row(word, meaning)
    return table


_Name = TypeVar("_Name", bound=str)


def _badges(badges: Mapping[_Name, Badge], *, long: bool = False) -> str:
    return "  ".join(f"{b.glyph} {b.label}" + (f" ({name.replace('_', ' ')})" if long else "")
                     for name, b in badges.items())


def _keys(key: Key) -> str:
    names = key.keys.split(",")
    if key.display:
        names[0] = key.display
    return " ".join(n for n in names if n not in ("equals_sign",))


class HelpScreen(ModalScreen[None]):
    """Every key the control room knows."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close"),
        *reading_bindings(),  # the command line and the filter (a prompt screen opens over this one)
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 100%; max-height: 90%; border: thick $accent;
                                  background: $surface; padding: 0 1; }
    HelpScreen .title { text-style: bold; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("warpdeck keys  (escape closes)", classes="title")
            yield Static(help_table())
            yield Static("\ncommand mode  (: then a verb; tab completes verbs, ids and names)", classes="title")
            yield Static(verb_table())
            yield Static("\nglyphs and abbreviations", classes="title")
            yield Static(glyph_table())
            yield Static("Filter syntax: words are regexes on the task key; state:failed phase:compute "
                         "stall:memory attempt:2 key:REGEX; '!' before a term inverts it; all terms must hold.")
