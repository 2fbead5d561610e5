"""Keys typed faster than the app handles them: each goes where the key before it left the focus.

A burst is posted to the app in one go, as a terminal delivers a fast typist's keys, a paste
without bracketed paste, or ``tmux send-keys``: Pilot's ``press`` waits for the app to go idle
after every key, which hides exactly the race these tests are about.
"""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.widgets import Input
from wd_tui import burst, commands, engine_app, until

from warpdeck.engine.api import Drain, SetDepth
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.help import HelpScreen
from warpdeck.tui.screens.prompt import PromptScreen
from warpdeck.tui.widgets.prompt_bar import PromptBar


async def test_a_burst_after_colon_goes_into_the_prompt_and_drains_nothing(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, ":depth 5\r")
        await until(pilot, lambda: SetDepth(depth=5) in commands(link))
        await until(pilot, lambda: app.snapshot.lanes[0].depth == 5)
        assert Drain() not in commands(link)
        assert not isinstance(app.screen, ConfirmScreen)
        assert not app.screen.query_one(PromptBar).is_open


async def test_a_burst_stays_in_the_prompt_until_it_is_read(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        text = "dXxqpr+-tf? uRG1 2 3"  # every one a board key
        burst(app, ":" + text)
        bar = app.screen.query_one(PromptBar)
        field = bar.query_one(Input)
        await until(pilot, lambda: field.value == text)
        assert app.keygate.held == 0 and commands(link) == []
        burst(app, "\x1b")
        await until(pilot, lambda: not bar.is_open)
        assert commands(link) == [] and app.is_running and app.current_mode == "board"


async def test_a_burst_after_slash_sets_the_filter(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, "/state:done\r")
        await until(pilot, lambda: app.filter_text == "state:done")
        assert commands(link) == []


async def test_a_burst_into_a_prompt_screen_over_the_help(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, "?:detail syn-00000001\r")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert app.screen.key == "syn-00000001"
        assert commands(link) == []
        burst(app, "\x1b")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert not any(isinstance(s, PromptScreen) for s in app.screen_stack)


async def test_a_paste_starting_with_colon_opens_the_prompt_without_running_it(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        app.post_message(events.Paste(":drain\nmore"))
        bar = app.screen.query_one(PromptBar)
        await until(pilot, lambda: bar.is_open and bar.query_one(Input).value == "drain")
        assert commands(link) == [] and not isinstance(app.screen, ConfirmScreen)
