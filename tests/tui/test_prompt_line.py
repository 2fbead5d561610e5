"""The ``:`` prompt as typed into (issue 29, item 10): tab completion, escape and ``:`` merged by the
terminal, wide characters, and a paste of several lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.cells import cell_len, get_character_cell_size
from textual import events
from textual.widgets import Input
from wd_screen import screen_text
from wd_tui import burst, commands, engine_app, settled, until

from warpdeck.engine.api import SetDepth
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.widgets.prompt_bar import PromptBar


def prompt_input(app: WarpdeckApp) -> Input:
    return app.screen.query_one("#prompt-input", Input)


@pytest.mark.parametrize(("typed", "value"), [
    (":dep\t9", "depth 9"),  # the one verb: completed, and a space for its argument
    (":depth\t9", "depth 9"),  # already whole and the only one: the space alone
    (":screen wo\t", "screen workers "),  # an argument with one candidate
    (":canc\t", "cancel"),  # cancel or cancel-all: no space, the candidates are listed
])
async def test_tab_adds_a_space_after_the_only_candidate(tmp_path: Path, typed: str, value: str) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        burst(app, typed)  # in one burst: tab must not wait for the suggestion shown
        await settled(pilot)
        assert prompt_input(app).value == value


async def test_a_completed_verb_takes_its_argument_and_runs(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, ":dep\t9\r")
        await until(pilot, lambda: SetDepth(depth=9) in commands(link))


async def test_escape_and_colon_merged_by_the_terminal_open_the_prompt(tmp_path: Path) -> None:
    """Escape then ``:`` typed fast reach the app as one key, ``alt+colon``: it is both."""
    async with engine_app(tmp_path) as (app, pilot, _link):
        bar = app.screen.query_one(PromptBar)
        app.post_message(events.Key("alt+colon", ":"))
        await until(pilot, lambda: bar.is_open)
        burst(app, "depth 5")
        await until(pilot, lambda: prompt_input(app).value == "depth 5")
        app.post_message(events.Key("alt+colon", ":"))  # escape closes this line, ``:`` opens a new one
        await settled(pilot)
        assert bar.is_open and prompt_input(app).value == ""


def cells(line: str) -> list[str]:
    """A screen line cell by cell: a wide character, then "" for the cell it also covers."""
    out: list[str] = []
    for ch in line:
        out += [ch] + [""] * (get_character_cell_size(ch) - 1)
    return out


def drawn_cursor(field: Input) -> int:
    """The screen column of the cell ``field`` draws its cursor in (the cell in the cursor's style)."""
    cursor = field.get_component_rich_style("input--cursor")
    x = field.content_region.x - field.scroll_offset.x
    for segment in field.render_line(0):
        if segment.style is not None and segment.style.bgcolor == cursor.bgcolor:
            return x
        x += segment.cell_length
    raise AssertionError("no cursor drawn")


@pytest.mark.parametrize("typed", ["filter 任务一二三四五六七八九十", "detail " + "😀任务x" * 5])
async def test_wide_characters_in_the_prompt_are_drawn_whole_and_the_cursor_after_them(tmp_path: Path,
                                                                                      typed: str) -> None:
    """At 80x24 the input line lies over the footer's keys; Textual blanks a wide character drawn over
    another widget's edge (Textual issue #6357), so the footer is hidden while the prompt is open."""
    async with engine_app(tmp_path, size=(80, 24)) as (app, pilot, _link):
        burst(app, ":" + typed)
        field = prompt_input(app)
        await until(pilot, lambda: field.value == typed)
        await settled(pilot)
        field.cursor_blink = False  # the cursor stays drawn
        start, cursor = field.content_region.x, drawn_cursor(field)
        assert cursor == start + cell_len(typed)  # right after the last cell of the text
        line = cells(screen_text(app)[field.content_region.y])
        assert "".join(line[start:cursor]) == typed  # every character drawn, none blanked
        burst(app, "\x1b")
        await until(pilot, lambda: "? help" in screen_text(app)[-1])  # closed: the footer is back


async def test_a_paste_of_several_lines_is_kept_as_one_line_and_said(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, ":")
        bar = app.screen.query_one(PromptBar)
        await until(pilot, lambda: bar.is_open)
        app.post_message(events.Paste("cancel syn-00000001\n  syn-00000002\n\nsyn-00000003\n"))
        await until(pilot, lambda: prompt_input(app).value == "cancel syn-00000001 syn-00000002 syn-00000003")
        hint = str(bar.query(".hint").first().render())
        assert hint.startswith("pasted 3 lines as one")
        assert commands(link) == [] and bar.is_open  # a paste never runs the line
