"""Nothing on the control room's screen is cut into a look-alike, at 80x24, 120x40 and 200x50.

Read off the rendered screen over a million-task synthetic snapshot with twelve-character ids: every
id on the board is a whole key or one shortened in the middle that stands for exactly one task on
screen; every count is the snapshot's, exact or abbreviated; the status bar, the figures strip and
the timeline's headers drop whole parts (each part shown is one the 200-column screen shows), and at
200x50 nothing is dropped. The board goes compact where eight columns would be too narrow.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import pytest
from textual.pilot import Pilot
from wd_screen import matches, parts, same_part, screen_text, shows_count, unmatched_ids
from wd_synthetic import SyntheticRun
from wd_tui import until

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.board_model import COLUMNS, COMPACT_COLUMNS, board_rows
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.board import BoardScreen
from warpdeck.tui.widgets.board_column import BoardColumn
from warpdeck.tui.widgets.task_list import TaskList
from warpdeck.tui.widgets.worker_table import COLUMNS as WORKER_COLUMNS
from warpdeck.tui.widgets.worker_table import worker_cells

SIZES = [(80, 24), (120, 40), (200, 50)]
WIDE = (200, 50)
ID = re.compile(r"[\w-]*…[\w-]*|syn-\d+")
"""An id on screen: whole (``syn-`` and digits) or shortened around an ellipsis."""


@functools.cache
def _run() -> SyntheticRun:
    return SyntheticRun(1_000_000, seed=7, transitions_per_s=30_000, stalled_every=29, failed_every=41, batch=64,
                        prefix="syn-", digits=8)


@functools.cache
def _snap() -> EngineSnapshot:
    return _run().snapshot_at(15.0, seq=1)


async def _open(pilot: Pilot[int], screen: str) -> None:
    """Wait for the snapshot, switch to ``screen`` and let it paint."""
    app = pilot.app
    assert isinstance(app, WarpdeckApp)
    await until(pilot, lambda: isinstance(app.screen, BoardScreen) and app.screen.shown_seq == 1)
    if screen != "board":
        await pilot.press({"workers": "2", "timeline": "3"}[screen])
    await pilot.pause()


async def _lines(snap: EngineSnapshot, size: tuple[int, int], screen: str) -> list[str]:
    app = WarpdeckApp(StreamLink([snap]))
    async with app.run_test(size=size) as pilot:
        await _open(pilot, screen)
        return screen_text(app)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_every_id_on_the_board_is_whole_or_shortened_in_the_middle(size: tuple[int, int]) -> None:
    snap = _snap()
    app = WarpdeckApp(StreamLink([snap]))
    async with app.run_test(size=size) as pilot:
        await _open(pilot, "board")
        lines = screen_text(app)
        board = board_rows(snap)
        shown = [c for c in app.screen.query(BoardColumn) if c.display]
        visible = [snap.tasks.key(int(r)) for c in shown for r in board.column(c.column)[0][:c.list.size.height]]
        tokens = [t for line in lines[2:-3] for t in ID.findall(line)]
        assert unmatched_ids(tokens, visible) == [], "ids cut into look-alikes"
        assert len(tokens) == len(visible), "a task row without its id"
        # Eight columns at 120 leave room for ten of an id's twelve characters; the compact
        # layout at 80 and the eight columns at 200 show them whole.
        assert any("…" in t for t in tokens) == (size == (120, 40))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_column_titles_never_cut_their_counts(size: tuple[int, int]) -> None:
    snap = _snap()
    board = board_rows(snap)
    lines = await _lines(snap, size, "board")
    layout = COMPACT_COLUMNS if size[0] < 96 else COLUMNS
    titles = [t.strip() for t in lines[1].split("▕")[:len(layout)]]
    for (cid, name), title in zip(layout, titles, strict=True):
        words = title.split(" ")
        if not words[0][0].isdigit():
            shown_name = words.pop(0)
            assert shown_name == name or (shown_name.endswith("…") and name.startswith(shown_name[:-1])), title
        # The done column counts its done tasks, with the failed and cancelled it also lists after them.
        own = board.column(cid)[1] - (board.failed + board.cancelled if cid == "finished" else 0)
        assert shows_count(words.pop(0), own), title
        for word in words:
            assert shows_count(word[1:], {"✗": board.failed, "⊘": board.cancelled}[word[0]]), title


@pytest.mark.parametrize("screen", ["board", "workers", "timeline"])
@pytest.mark.parametrize("size", SIZES[:2], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_status_bar_and_figures_strip_drop_whole_parts(size: tuple[int, int], screen: str) -> None:
    snap = _snap()
    wide, small = await _lines(snap, WIDE, screen), await _lines(snap, size, screen)
    for row in (0, -3, -2):  # the status bar, the figures strip's two lines
        whole = parts(wide[row])
        assert not any(p.startswith("…") for p in whole), f"at 200x50 everything shows: {wide[row]!r}"
        for part in parts(small[row]):
            assert part in ("…", "… 3 timeline") or any(same_part(part, w) for w in whole), (part, small[row])


@pytest.mark.parametrize("size", SIZES[:2], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_timeline_drops_whole_figures_and_shows_every_lane(size: tuple[int, int]) -> None:
    snap = _snap()
    wide, small = await _lines(snap, WIDE, "timeline"), await _lines(snap, size, "timeline")
    headers = [i for i, line in enumerate(wide) if 0 < i < 4 or line.startswith(" lane ")]
    for i in headers:
        whole = wide[i].strip().split(" · ")
        assert "…" not in whole, wide[i]
        for part in small[i].strip().split(" · "):
            assert part == "…" or part in whole, (part, small[i])
    phase_rows = [line for line in small if re.match(r"^\s+(fill|h2d|compute|d2h|sink)\s+\d+% ", line)]
    assert len(phase_rows) == 5 * len(snap.lanes)
    assert any(line.rstrip().endswith("now") for line in small), "the time axis"


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_workers_table_shows_whole_cells(size: tuple[int, int]) -> None:
    snap = _snap()
    lines = await _lines(snap, size, "workers")
    header = next(line for line in lines if "worker" in line and "state" in line)
    shown = [(key, title) for key, title in WORKER_COLUMNS if title in header]
    assert {"id", "state", "done", "failed"} <= {key for key, _ in shown}
    for w in snap.workers:
        row = next(line for line in lines if f" {w.id} " in line)
        cells = worker_cells(w)
        for key, _ in shown:
            assert cells[key] in row, (key, cells[key], row)
    if len(shown) < len(WORKER_COLUMNS):
        assert header.rstrip().endswith("…"), "columns left out say so"


# -- the board's compact layout ------------------------------------------------------------------


async def test_at_80x24_the_board_has_four_columns_and_running_joins_the_phases() -> None:
    snap = _snap()
    board = board_rows(snap)
    app = WarpdeckApp(StreamLink([snap]))
    async with app.run_test(size=(80, 24)) as pilot:
        await _open(pilot, "board")
        lines = screen_text(app)
        titles = [t.strip().split(" ") for t in lines[1].split("▕")[:4]]
        assert [t[0] for t in titles] == ["queued", "running", "stalled", "done"]
        running = sum(board.totals[p] for p in ("fill", "h2d", "compute", "d2h", "sink"))
        assert shows_count(titles[1][1], running)
        # The phases in board order, each row with its phase's glyph: fill at the top, sink at the end.
        assert {line.split("▕")[1][0] for line in lines[2:-3]} == {"◐"}
        await pilot.press("l", "G")
        await pilot.pause()
        assert screen_text(app)[-4].split("▕")[1][0] == "⇲"


async def test_the_layout_follows_a_resize_and_the_focused_task_with_it() -> None:
    snap = _snap()
    app = WarpdeckApp(StreamLink([snap]))
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(pilot, "board")
        board = app.screen
        assert isinstance(board, BoardScreen) and not board.compact
        await pilot.press("l", "l", "l", "j", "j")  # compute, third task
        key = board.focused_key()
        assert key is not None and app.focused is board.query_one("#list-compute")
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: board.compact and board.shown_seq == 1 and board.focused_key() == key)
        assert app.focused is board.query_one("#list-running")
        assert not board.query_one("#col-compute").display
        await pilot.resize_terminal(120, 40)
        await until(pilot, lambda: not board.compact and board.shown_seq == 1 and board.focused_key() == key)
        assert app.focused is board.query_one("#list-compute")


@pytest.mark.parametrize(("size", "order"), [
    ((80, 24), ["queued", "running", "stalled", "finished"]),
    ((120, 40), [cid for cid, _ in COLUMNS]),
], ids=["compact", "wide"])
async def test_h_and_l_walk_the_columns_shown(size: tuple[int, int], order: list[str]) -> None:
    app = WarpdeckApp(StreamLink([_snap()]))
    async with app.run_test(size=size) as pilot:
        await _open(pilot, "board")
        seen = []
        for _ in order:
            focused = app.focused
            assert isinstance(focused, TaskList) and focused.id is not None
            seen.append(focused.id.removeprefix("list-"))
            await pilot.press("l")
        assert seen == order
        assert app.focused is app.screen.query_one("#list-queued")  # round again
        await pilot.press("h")
        assert app.focused is app.screen.query_one(f"#list-{order[-1]}")
        column = app.screen.query_one(f"#col-{order[-1]}", BoardColumn)
        assert column.active


# -- status that is current ----------------------------------------------------------------------


async def _status(snap: EngineSnapshot) -> tuple[str, str]:
    """The status bar and the figures strip's first line, at 120x40."""
    lines = await _lines(snap, (120, 40), "board")
    return lines[0], lines[-3]


def _small() -> EngineSnapshot:
    return SyntheticRun(5000, seed=7, transitions_per_s=300, stalled_every=29, failed_every=41,
                        batch=8).snapshot_at(12.0, seq=1)


async def test_paused_shows_in_the_title_and_the_rate_says_so() -> None:
    snap = _small()
    snap = dataclasses.replace(snap, feeder=dataclasses.replace(snap.feeder, state="paused"),
                               figures=dataclasses.replace(snap.figures, recent_tasks_s=0.0))
    status, rate = await _status(snap)
    assert "⏸ paused" in status and "running" not in status
    assert "paused 0 tasks/s (0 B/s)" in rate


async def test_a_drained_run_says_drained_and_shows_its_average_rate() -> None:
    snap = dataclasses.replace(_small(), status="drained")
    status, rate = await _status(snap)
    assert f"✗ drained with {snap.counts.failed} failed" in status
    assert f"avg {snap.counts.done / snap.t:,.0f} tasks/s" in rate
    assert f"{snap.figures.recent_tasks_s:,.0f} tasks/s" not in rate


async def test_a_finished_run_says_finished_and_shows_its_average_rate() -> None:
    snap = dataclasses.replace(_small(), status="finished")
    status, rate = await _status(snap)
    # Some failed: the run exits 1, and the line says so rather than a plain ``✓ finished``.
    assert f"✗ finished with {snap.counts.failed} failed" in status and "✓" not in status
    assert f"avg {snap.counts.done / snap.t:,.0f} tasks/s" in rate
    clean = dataclasses.replace(snap, counts=dataclasses.replace(snap.counts, failed=0, cancelled=0))
    status, _ = await _status(clean)
    assert "✓ finished " in status and "with" not in status


async def test_every_worker_quarantined_shows_the_run_stalled() -> None:
    snap = _small()
    workers = tuple(dataclasses.replace(w, state="quarantined") for w in snap.workers)
    stalled = tuple(dataclasses.replace(s, reason="control", note="every worker quarantined") for s in snap.stalled)
    status, _ = await _status(dataclasses.replace(snap, workers=workers, stalled=stalled))
    assert "stalled: every worker quarantined" in status and "running" not in status


async def test_cancelled_is_counted_beside_failed() -> None:
    snap = _small()
    snap = dataclasses.replace(snap, counts=dataclasses.replace(snap.counts, failed=3, cancelled=2))
    status, _ = await _status(snap)
    assert "✗3 failed  ⊘2 cancelled" in status


def test_matches_tells_a_shortened_id_from_a_cut_one() -> None:
    assert matches("syn-…46720", "syn-00046720")
    assert not matches("syn-0004672", "syn-00046720"), "a cut id is not its key"
    assert not matches("syn-…46721", "syn-00046720")
