"""Every binding, through Pilot over a real engine: the right command sent (as recorded by the
link, with the engine's answer) or the right screen shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input
from wd_tui import asking, commands, engine_app, notes, slow_spec, until

from warpdeck.engine.api import (
    Cancel,
    Drain,
    Pause,
    Quarantine,
    Release,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
)
from warpdeck.tui.keymap import KEYS
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.help import HelpScreen, help_table
from warpdeck.tui.screens.prompt import PromptScreen
from warpdeck.tui.widgets.lane_timeline import LaneTimeline
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.task_list import TaskList


async def type_into(app, pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    """Put ``text`` in the focused input and press enter (Pilot waits for idle after every key,
    which a live engine never is, so typing letter by letter costs seconds each)."""
    app.focused.value = text
    await pilot.press("enter")


async def test_pause_then_resume_reaches_the_engine(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("p")
        await until(pilot, lambda: app.snapshot.feeder.state == "paused")
        assert commands(link) == [Pause()]
        assert link.sent[0].result.ok
        await pilot.press("p")
        await until(pilot, lambda: app.snapshot.feeder.state != "paused")
        assert commands(link) == [Pause(), Resume()]


async def test_drain_asks_first(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("d")
        await until(pilot, lambda: asking(app))
        await pilot.press("n")
        assert commands(link) == []
        await pilot.press("d")
        await until(pilot, lambda: asking(app))
        await pilot.press("y")
        await until(pilot, lambda: commands(link) == [Drain()])
        # Draining ends the run once what was admitted is done.
        await until(pilot, lambda: app.snapshot.status == "drained")


async def test_cancel_highlighted_task(tmp_path: Path) -> None:
    # 0.6 s a batch: the highlighted queued task is still queued when the answer comes.
    async with engine_app(tmp_path, slow_spec(stage="wd_stages:sleep_forever_ish")) as (app, pilot, link):
        lst = app.screen.query_one("#list-queued", TaskList)
        await until(pilot, lambda: lst.count > 20)
        await pilot.press("G")  # the newest queued task: far from being started
        key = lst.current_key
        await pilot.press("x")
        await until(pilot, lambda: asking(app))
        assert app.screen.question.startswith(f"Cancel {key} (")  # named as it is (queued, or already running)
        await pilot.press("y")
        await until(pilot, lambda: commands(link) == [Cancel(keys=(key,))])
        assert link.sent[0].result.affected == 1


async def test_cancel_all_needs_the_pipeline_name_typed(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("X")
        await until(pilot, lambda: asking(app))
        await pilot.press("y", "enter")  # not the name: nothing happens
        assert isinstance(app.screen, ConfirmScreen) and commands(link) == []
        await type_into(app, pilot, "tui-test")
        await until(pilot, lambda: commands(link) == [Cancel(all=True)])
        await until(pilot, lambda: app.snapshot.finished)
        assert app.snapshot.status == "cancelled"


@pytest.mark.parametrize(("key", "sent"), [("r", RetryFailed()), ("R", RequeueStalled())])
async def test_retry_and_requeue(tmp_path: Path, key: str, sent: object) -> None:
    async with engine_app(tmp_path) as (_app, pilot, link):
        await pilot.press(key)
        await until(pilot, lambda: commands(link) == [sent])


async def test_depth_up_down_and_undo(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        depth = app.snapshot.lanes[0].depth
        await pilot.press("plus")
        await until(pilot, lambda: app.snapshot.lanes[0].depth == depth + 1)
        await pilot.press("u")
        await until(pilot, lambda: app.snapshot.lanes[0].depth == depth)
        assert commands(link) == [SetDepth(depth=depth + 1), SetDepth(depth=depth)]
        await pilot.press("minus")
        if depth > 2:
            await until(pilot, lambda: commands(link)[-1:] == [SetDepth(depth=depth - 1)])
        else:  # already at the floor: refused on the spot (the warning says so), nothing sent
            await until(pilot, lambda: any("slot depth stays" in n for n in notes(app)))
            assert len(link.sent) == 2


async def test_undo_with_nothing_to_undo_sends_nothing(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("u")
        await until(pilot, lambda: any("nothing to undo" in n for n in notes(app)))  # refused: the warning says so
        assert commands(link) == []


async def test_filter_narrows_the_board_and_refuses_a_bad_regex(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        board = app.screen
        await pilot.press("slash")
        bar = board.query_one(PromptBar)
        assert bar.is_open and isinstance(app.focused, Input)
        await type_into(app, pilot, "key:(")
        assert bar.is_open  # stays open, with the error
        assert "not a regular expression" in str(bar.query_one("#prompt-error").render())
        await pilot.press("escape")
        assert not bar.is_open and isinstance(app.focused, TaskList)  # the list has its keys back
        await pilot.press("slash")
        await type_into(app, pilot, "state:done")
        assert app.filter_text == "state:done"
        assert app.screen is board and not bar.is_open
        queued = app.screen.query_one("#list-queued", TaskList)
        done = app.screen.query_one("#list-finished", TaskList)
        await until(pilot, lambda: queued.count == 0 and done.count > 0)


async def test_filter_over_a_screen_without_a_prompt_bar(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        await pilot.press("question_mark")
        app.action_filter()  # as the command palette would, over the help screen
        await pilot.pause()
        assert isinstance(app.screen, PromptScreen)
        await type_into(app, pilot, "state:failed")
        assert isinstance(app.screen, HelpScreen)
        assert app.filter_text == "state:failed"


async def test_command_mode_runs_a_command_and_completes_task_ids(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("colon")
        await type_into(app, pilot, "pause")
        await until(pilot, lambda: commands(link) == [Pause()])
        await pilot.press("colon")
        prompt = app.screen.query_one("#prompt-input")
        prompt.value = "detail syn-000000"
        prompt.cursor_position = len(prompt.value)  # where typing it would have left the cursor
        await pilot.press("1")  # the last character typed for real: completion follows typing
        await until(pilot, lambda: prompt._suggestion.startswith("detail syn-0000001"))
        await pilot.press("tab", "enter")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        assert app.screen.key.startswith("syn-0000001")


async def test_screens_by_number_and_tab(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        for key, mode in (("2", "workers"), ("3", "timeline"), ("1", "board"), ("tab", "workers"),
                          ("shift+tab", "board")):
            await pilot.press(key)
            assert app.current_mode == mode, key


async def test_help_opens_and_closes(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_list_navigation_and_detail(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        lst = app.screen.query_one("#list-stalled", TaskList)
        await pilot.press("p")  # paused: waiting tasks stall (control) and the list stops changing
        await until(pilot, lambda: app.snapshot.counts.running_total == 0 and lst.count > 3
                    and lst.count == app.snapshot.counts.stalled["control"])
        await pilot.press("h", "h")
        assert app.focused is lst
        await pilot.press("j", "j")
        assert lst.cursor == 2
        await pilot.press("k")
        assert lst.cursor == 1
        await pilot.press("G")
        assert lst.cursor == lst.count - 1
        await pilot.press("g")
        assert lst.cursor == 0
        key = lst.current_key
        await pilot.press("enter")
        assert isinstance(app.screen, DetailScreen) and app.screen.key == key
        await pilot.press("escape")


async def test_h_and_l_move_between_columns(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        assert app.focused.id == "list-queued"
        await pilot.press("l")
        assert app.focused.id == "list-fill"
        await pilot.press("h", "h")
        assert app.focused.id == "list-finished"


async def test_theme_follow_zoom_and_screenshot(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        before = app.theme
        await pilot.press("t")
        assert app.theme != before and app.theme in app.theme_names
        await pilot.press("3")
        timeline = app.screen.query_one(LaneTimeline)
        zoom = timeline.zoom
        await pilot.press("right_square_bracket")
        assert timeline.zoom == zoom - 1
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert timeline.zoom == zoom + 1
        await pilot.press("f")
        assert not app.follow and not timeline.follow
        await pilot.press("ctrl+s")
    assert list(tmp_path.glob("*.svg"))  # noqa: ASYNC240 - the app is closed: nothing else uses the loop


async def test_workers_screen_sorts(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        await pilot.press("2")
        table = app.screen.query_one("#workers-table")
        await until(pilot, lambda: table.row_count == 1)
        await pilot.press("s")
        assert table.sort_column == "state"


async def test_quit_asks_while_work_runs(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        await pilot.press("q")
        await until(pilot, lambda: asking(app))
        await pilot.press("n")
        assert app.is_running
        await pilot.press("q")
        await until(pilot, lambda: asking(app))
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running)
    assert app.return_code == 1


async def test_command_palette_runs_an_action(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("ctrl+p")
        app.screen.query_one(Input).value = "Pause: no new batches"
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: commands(link) == [Pause()])


async def test_readonly_link_refuses_commands(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        link.readonly = True
        await pilot.press("p")  # refused in the room, with the reason: nothing is sent
        await until(pilot, lambda: "read-only: commands are off" in notes(app))
        assert link.sent == [] and app.snapshot.feeder.state != "paused"


def test_every_key_is_on_the_help_screen() -> None:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(help_table())
    text = console.export_text()
    for key in KEYS:
        assert key.description in text, key


async def test_z_quarantines_the_highlighted_worker_and_undo_releases_it(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        await pilot.press("2")
        await until(pilot, lambda: app.screen.name == "workers")
        wid = app.snapshot.workers[0].id
        await pilot.press("z")  # the only worker: the run could not go on, so it asks first
        await until(pilot, lambda: asking(app))
        await pilot.press("y")
        await until(pilot, lambda: len(link.sent) == 1)
        assert commands(link) == [Quarantine(worker=wid)] and link.sent[0].result.ok
        await until(pilot, lambda: app.snapshot.workers[0].state == "quarantined")
        await pilot.press("u")
        await until(pilot, lambda: len(link.sent) == 2)
        assert commands(link)[1] == Release(worker=wid)
        await until(pilot, lambda: app.snapshot.workers[0].state == "online")


def test_the_readme_key_table_matches_the_key_table() -> None:
    """Every key the README's table names is bound, and every key of the app, the board, the
    workers and the timeline is in the README's table (list navigation aside)."""
    import re

    from warpdeck.tui.command_line import VERBS

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| keys | what they do |"):]
    table = table[:table.index("\n\n")]
    named = set(re.findall(r"`([^`]+)`", table))
    bound = {name for k in KEYS for name in [k.label, *k.keys.split(",")]}
    for name in named:
        if name.startswith(":") and len(name) > 1:
            assert name[1:].split()[0] in VERBS, name
        else:
            assert name in bound, name
    for k in KEYS:
        if k.scope != "list" or k.label in ("j", "k", "g", "G", "enter"):
            assert k.label in named, k


def test_help_lists_every_verb_glyph_and_abbreviation() -> None:
    from rich.console import Console

    from warpdeck.tui.command_line import VERBS, usage
    from warpdeck.tui.glyphs import PHASE_GLYPHS, STALL_BADGES, STATE_GLYPHS, WORKER_GLYPHS
    from warpdeck.tui.screens.help import GLOSSARY, glyph_table, verb_table

    console = Console(width=200, record=True)
    console.print(verb_table())
    console.print(glyph_table())
    text = console.export_text()
    for verb in VERBS:
        assert ":" + usage(verb) in text, verb
    for table in (STATE_GLYPHS, PHASE_GLYPHS, STALL_BADGES, WORKER_GLYPHS):
        for badge in table.values():
            assert f"{badge.glyph} {badge.label}" in text, badge
    for word, _ in GLOSSARY:
        assert word in text
