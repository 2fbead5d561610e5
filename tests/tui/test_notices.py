"""Notifications (issue 29, item 10): how much of what was typed they repeat, and where they stand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.pilot import Pilot
from textual.widgets._toast import Toast
from wd_synthetic import SyntheticRun
from wd_tui import burst, engine_app, note_ids, notes_since, settled, until

from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.command_line import ECHO_CELLS
from warpdeck.tui.fit import ELLIPSIS
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.help import HelpScreen
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.prompt_bar import PromptBar

LONG = "k" * 10_000

TYPED = [f"detail {LONG}", f"cancel {LONG}", f"worker {LONG}", f"theme {LONG}", f"screen {LONG}",
         f"filter {LONG}", f"filter state:{LONG}", f"retry {LONG}", f"quarantine {LONG}"]
"""What is typed after ':' with a 10,000-character word in it; each is answered in a notification."""


@pytest.mark.parametrize("typed", TYPED, ids=lambda t: t.split()[0] + (" state:" if "state:" in t else ""))
async def test_a_long_word_is_repeated_shortened(tmp_path: Path, typed: str) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        bar = app.screen.query_one(PromptBar)
        seen = note_ids(app)
        burst(app, ":")
        await until(pilot, lambda: bar.is_open)
        app.post_message(events.Paste(typed))  # 10,000 keys one by one would take a minute
        await settled(pilot)
        burst(app, "\r")
        await until(pilot, lambda: notes_since(app, seen))
        (answer,) = notes_since(app, seen)
        assert ELLIPSIS in answer and "k" * ECHO_CELLS not in answer, answer[:200]


async def test_an_unknown_verb_is_repeated_shortened_in_the_error_line(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        bar = app.screen.query_one(PromptBar)
        burst(app, ":")
        await until(pilot, lambda: bar.is_open)
        app.post_message(events.Paste(LONG))
        await settled(pilot)
        burst(app, "\r")
        error = app.screen.query_one("#prompt-error")
        await until(pilot, lambda: "unknown command" in str(error.render()))
        shown = str(error.render())
        assert ELLIPSIS in shown and "k" * ECHO_CELLS not in shown, shown[:200]


@contextlib.asynccontextmanager
async def room_with_toasts(size: tuple[int, int]) -> AsyncIterator[tuple[WarpdeckApp, Pilot[Any]]]:
    """The room over a recorded run, with Textual's notifications on (``run_test`` turns them off)."""
    run = SyntheticRun(5000, seed=7, transitions_per_s=300, stalled_every=29, failed_every=41, batch=8)
    app = WarpdeckApp(StreamLink(list(run.stream(1.0, 12))))
    async with app.run_test(size=size, notifications=True) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == 12)
        yield app, pilot


@pytest.mark.parametrize("over", ["board", "help"])
async def test_toasts_stand_clear_of_the_figures_strip_and_the_footer_at_80x24(over: str) -> None:
    async with room_with_toasts((80, 24)) as (app, pilot):
        board = app.screen
        if over == "help":
            burst(app, "?")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        for words in ("frozen: f follows again", "no worker 'nope'; workers: vm.cpu", "slot depth 9 " * 4):
            app.notify(words)
        await until(pilot, lambda: len(app.screen.query(Toast)) == 3 and all(t.region for t in app.screen.query(Toast)))
        strip, footer = board.query_one(FiguresStrip).region, board.query_one(KeyFooter).region
        for toast in app.screen.query(Toast):
            assert not toast.region.overlaps(strip) and not toast.region.overlaps(footer), (toast.region, strip)
            assert toast.region.width <= 40  # half the screen at most
