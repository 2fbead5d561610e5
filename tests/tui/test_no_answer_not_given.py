"""No answer a person did not give (issue 29, item 1): keys typed after a command go on in order,
each once, after it has answered or asked; a question takes only keys typed once it was visible.

Over a real engine whose answers are slowed (the engine's lookup of a task delayed by an injected
sleep, as a loaded machine delays it), with bursts of commands posted at once, as a terminal
delivers keys typed faster than the app handles them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from wd_tui import asking, burst, commands, engine_app, note_ids, notes_since, slow_spec, until

from warpdeck.engine.api import Cancel, Drain, RetryFailed, SetDepth
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.widgets.task_list import TaskList


async def _a_queued_task(app: WarpdeckApp, pilot: Any) -> str:
    """A task far from starting (the newest queued, with 0.6 s batches)."""
    lst = app.screen.query_one("#list-queued", TaskList)
    await until(pilot, lambda: lst.count > 20)
    await pilot.press("G")
    key = lst.current_key
    assert key is not None
    return key


def _slow_lookups(link: Any, delay_s: float) -> None:
    """The engine answers a task's lookup ``delay_s`` late (a loaded machine: 0.8-3 s were seen)."""
    real = link.detail

    async def slow(key: str) -> Any:
        await asyncio.sleep(delay_s)
        return await real(key)

    link.detail = slow


async def test_a_cancel_is_never_confirmed_by_the_next_commands_keys(tmp_path: Path) -> None:
    async with engine_app(tmp_path, slow_spec(stage="wd_stages:sleep_forever_ish")) as (app, pilot, link):
        key = await _a_queued_task(app, pilot)
        _slow_lookups(link, 1.0)
        burst(app, f":cancel {key}\r:retry\r")  # one burst: the y of retry came while the cancel looked up
        await until(pilot, lambda: asking(app))
        assert app.screen.question.startswith(f"Cancel {key}")
        for _ in range(20):  # the retry's keys were typed before the question showed: none answers it
            await pilot.pause(0.02)
        assert asking(app) and commands(link) == [] and app.keygate.set_aside == len(":retry\r")
        theme = app.theme
        burst(app, "n")
        await until(pilot, lambda: commands(link) == [RetryFailed()])  # then the retry runs, as typed
        assert app.theme == theme and not isinstance(app.screen, ConfirmScreen)


async def test_a_yes_typed_with_the_key_that_asks_does_not_answer(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, "dy")  # drain, and a y typed before its question could be read
        await until(pilot, lambda: asking(app))
        for _ in range(20):
            await pilot.pause(0.02)
        assert asking(app) and commands(link) == []
        burst(app, "y")  # typed once it was visible: an answer
        await until(pilot, lambda: commands(link) == [Drain()])


async def test_back_to_back_commands_each_run_once_in_order(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        seen = note_ids(app)
        burst(app, "".join(f":depth {d}\r" for d in range(11, 21)))
        await until(pilot, lambda: len(commands(link)) == 10, 20)
        assert commands(link) == [SetDepth(depth=d) for d in range(11, 21)]
        await until(pilot, lambda: app.snapshot.lanes[0].depth == 20)
        assert len(app.undo_stack) == 10
        assert not any("unknown command" in n for n in notes_since(app, seen))


async def test_keys_after_a_slow_command_wait_for_its_question_then_go_on(tmp_path: Path) -> None:
    # The keys typed while the cancel looked its task up reached the board: t switched the theme,
    # Enter opened a task's detail. Now they wait, and go on after the answer.
    async with engine_app(tmp_path, slow_spec(stage="wd_stages:sleep_forever_ish")) as (app, pilot, link):
        key = await _a_queued_task(app, pilot)
        _slow_lookups(link, 0.8)
        theme = app.theme
        burst(app, f":cancel {key}\rt")
        await until(pilot, lambda: asking(app))
        assert app.theme == theme
        burst(app, "y")
        await until(pilot, lambda: commands(link) == [Cancel(keys=(key,))])
        await until(pilot, lambda: app.theme != theme)  # the t, once the question was answered
