"""An attached room's task lists follow every frame. Its snapshots are rebuilt from telemetry
(``snapshot_from``), so a row number names whatever key the frame's sample put there: the head of
the queue moves on while the rows, and the lists' lengths, stay as they were. Before (issue 29) the
lists kept each row's first task: the queued list stood still while done climbed by 13 000."""

from __future__ import annotations

import dataclasses

import numpy as np
from textual.app import App, ComposeResult
from wd_screen import screen_text
from wd_synthetic import SyntheticRun
from wd_tui import until

from warpdeck.engine.api import EngineSnapshot, State, TaskView
from warpdeck.engine.control.telemetry import snapshot_from, summarize
from warpdeck.themes import BUILTIN_THEMES, DEFAULT_THEME
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.board_model import board_rows
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.board import BoardScreen
from warpdeck.tui.widgets.task_list import TaskList

TASKS = 5_000
HEIGHT = 10
KEYS = [f"job-{i:05d}" for i in range(TASKS)]
_BASE = SyntheticRun(TASKS, seed=1).snapshot_at(0.0)


def _engine_at(seq: int, done: int) -> EngineSnapshot:
    """The engine's own snapshot: the first ``done`` tasks done, the rest queued."""
    state = np.full(TASKS, State.QUEUED, np.int8)
    state[:done] = State.DONE
    zeros = np.zeros(TASKS, np.int8)
    view = TaskView(KEYS, state, zeros, zeros, np.ones(TASKS, np.int16))
    return dataclasses.replace(_BASE, seq=seq, tasks=view, stalled=(), failures=())


def _attached_at(seq: int, done: int) -> EngineSnapshot:
    """What an attached room draws of it: the frame's samples, rebuilt as a table."""
    return snapshot_from(summarize(_engine_at(seq, done), 0.0))


def _queued_head(snap: EngineSnapshot) -> list[str]:
    rows = board_rows(snap).rows["queued"]
    return [snap.tasks.key(int(r)) for r in rows[:HEIGHT]]


class ListApp(App[None]):
    CSS = f"TaskList {{ height: {HEIGHT}; }}"

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(BUILTIN_THEMES[DEFAULT_THEME].variables)

    def compose(self) -> ComposeResult:
        yield TaskList(id="list")


def test_the_frames_keep_the_rows_and_counts_but_not_the_keys() -> None:
    # The premise: two frames whose queued samples are as long, on the same rows, with other keys.
    a, b = _attached_at(1, 100), _attached_at(2, 13_100 % TASKS)
    rows_a, rows_b = board_rows(a).rows["queued"], board_rows(b).rows["queued"]
    assert np.array_equal(rows_a, rows_b)
    assert _queued_head(a) != _queued_head(b)


async def test_a_list_repaints_when_its_rows_hold_other_tasks() -> None:
    app = ListApp()
    async with app.run_test(size=(40, HEIGHT + 2)) as pilot:
        lst = app.query_one(TaskList)
        first = _attached_at(1, 100)
        lst.show(first, board_rows(first).rows["queued"])
        await pilot.pause()
        assert [lst.render_line(y).text.split()[-1] for y in range(HEIGHT)] == _queued_head(first)
        later = _attached_at(2, 1_400)
        assert lst.show(later, board_rows(later).rows["queued"]) == HEIGHT, "every visible line shows another task"
        await pilot.pause()
        assert [lst.render_line(y).text.split()[-1] for y in range(HEIGHT)] == _queued_head(later)
        assert lst.current_key == _queued_head(later)[0], "an unmoved list keeps showing the queue's head"


async def test_the_highlight_stays_on_its_task_in_a_rebuilt_table() -> None:
    app = ListApp()
    async with app.run_test(size=(40, HEIGHT + 2)) as pilot:
        lst = app.query_one(TaskList)
        first = _attached_at(1, 100)
        lst.show(first, board_rows(first).rows["queued"])
        lst.focus()
        await pilot.pause()
        await pilot.press("j", "j", "j", "j", "j")
        chosen = lst.current_key
        assert chosen == _queued_head(first)[5]
        # Three tasks left the queue: the chosen task is now the third of the sample, on another row.
        later = _attached_at(2, 103)
        lst.show(later, board_rows(later).rows["queued"])
        await pilot.pause()
        assert lst.current_key == chosen
        assert lst.cursor == 2


async def test_the_attached_board_shows_each_frames_queue() -> None:
    frames = [_attached_at(seq, 100 + 700 * seq) for seq in range(1, 5)]
    app = WarpdeckApp(StreamLink(frames[:1]))
    async with app.run_test(size=(160, 30)) as pilot:
        board = app.screen
        assert isinstance(board, BoardScreen)
        await until(pilot, lambda: board.shown_seq == 1)
        for frame in frames[1:]:
            app.snapshot = frame
            await until(pilot, lambda f=frame: board.shown_seq == f.seq)
            await pilot.pause()
            head = _queued_head(frame)[0]
            shown = [line.split()[1] for line in screen_text(app)[2:2 + HEIGHT] if line.strip()]
            assert shown[0] == head, (frame.seq, shown[:3], head)
