"""A task list repaints only the visible lines whose task, or what it shows of the task, changed
between two snapshots; the board spreads a snapshot over frames and ends up showing all of it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import numpy as np
import pytest
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.strip import Strip
from wd_synthetic import SyntheticRun
from wd_tui import until

from warpdeck.engine.api import EngineSnapshot, State, TaskView
from warpdeck.themes import BUILTIN_THEMES, DEFAULT_THEME
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.board_model import board_rows
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.board import BoardScreen
from warpdeck.tui.widgets.board_column import BoardColumn
from warpdeck.tui.widgets.task_list import TaskList

TASKS = 1000
HEIGHT = 10
KEYS = [f"task-{i:04d}" for i in range(TASKS)]
_BASE = SyntheticRun(TASKS, seed=1).snapshot_at(0.0)


def _snapshot(seq: int, failed: tuple[int, ...] = ()) -> EngineSnapshot:
    """Every task queued, except the ``failed`` rows."""
    state = np.zeros(TASKS, np.int8)
    state[list(failed)] = State.FAILED
    view = TaskView(KEYS, state, np.zeros(TASKS, np.int8), np.zeros(TASKS, np.int8), np.ones(TASKS, np.int16))
    return dataclasses.replace(_BASE, seq=seq, tasks=view, stalled=())


class CountingList(TaskList):
    """A task list that notes which lines it was asked to render."""

    def __init__(self) -> None:
        super().__init__(id="list")
        self.rendered: list[int] = []

    def render_line(self, y: int) -> Strip:
        self.rendered.append(y)
        return super().render_line(y)


class ListApp(App[None]):
    CSS = f"CountingList {{ height: {HEIGHT}; }}"

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(BUILTIN_THEMES[DEFAULT_THEME].variables)  # the task list's $wd-* colours

    def compose(self) -> ComposeResult:
        yield CountingList()


Painted = tuple[CountingList, Pilot[None]]


@pytest.fixture
async def painted() -> AsyncIterator[Painted]:
    """A task list that has painted its first snapshot, its repaint record cleared."""
    app = ListApp()
    async with app.run_test(size=(40, HEIGHT + 2)) as pilot:
        lst = app.query_one(CountingList)
        lst.show(_snapshot(1), np.arange(TASKS))
        await pilot.pause()
        assert lst.rendered, "the first snapshot paints every visible line"
        lst.rendered.clear()
        yield lst, pilot


async def test_changes_off_screen_repaint_nothing(painted: Painted) -> None:
    lst, pilot = painted
    # Rows 500 and 900 fail: both far below the ten rows on screen.
    assert lst.show(_snapshot(2, failed=(500, 900)), np.arange(TASKS)) == 0
    await pilot.pause()
    assert lst.rendered == []


async def test_a_visible_change_repaints_its_line_only(painted: Painted) -> None:
    lst, pilot = painted
    assert lst.show(_snapshot(2, failed=(3, 900)), np.arange(TASKS)) == 1
    await pilot.pause()
    assert lst.rendered == [3]
    assert "✗" in lst.render_line(3).text and "✗" not in lst.render_line(2).text


async def test_rows_moving_up_repaint_every_line(painted: Painted) -> None:
    lst, pilot = painted
    # The head of the queue left: every visible line now shows another task.
    assert lst.show(_snapshot(2), np.arange(7, TASKS)) == HEIGHT
    await pilot.pause()
    assert sorted(set(lst.rendered)) == list(range(HEIGHT))


async def test_moving_the_cursor_repaints_the_two_lines_it_leaves_and_reaches(painted: Painted) -> None:
    lst, pilot = painted
    lst.focus()
    await pilot.pause()
    lst.rendered.clear()
    await pilot.press("j")
    assert lst.cursor == 1
    assert sorted(set(lst.rendered)) == [0, 1]


async def test_the_board_spreads_a_snapshot_over_frames_and_shows_all_of_it() -> None:
    run = SyntheticRun(200_000, seed=3, transitions_per_s=10_000)
    first, second = run.snapshot_at(3.0, seq=1), run.snapshot_at(6.0, seq=2)
    app = WarpdeckApp(StreamLink([first]))
    async with app.run_test(size=(160, 48)) as pilot:
        board = app.screen
        assert isinstance(board, BoardScreen)
        await until(pilot, lambda: board.shown_seq == 1)
        app.snapshot = second
        # More visible lines changed than one frame may repaint: the rest follow in later frames.
        assert board.shown_seq == -1
        await until(pilot, lambda: board.shown_seq == 2)
        assert board.shown_seq == 2
        expected = board_rows(second)
        for column in board.query(BoardColumn):
            if column.display:  # (the compact layout's running column is hidden at this width)
                assert column.list.count == len(expected.column(column.column)[0]), column.column
