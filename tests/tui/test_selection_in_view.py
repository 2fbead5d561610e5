"""The highlighted task is never off screen (issue 29, item 6): as rows arrive above it, the view
moves with it, and a scroll the user makes brings the highlight along. Before, the cursor stayed
on its task while thousands of rows arrived above it, so x and Enter acted on a task nobody saw.
Over a real engine, on the board's done list, where the newest tasks come in at the top."""

from __future__ import annotations

from pathlib import Path

from wd_tui import engine_app, slow_spec, until

from warpdeck.tui.widgets.task_list import TaskList


async def test_the_highlighted_task_stays_in_view_as_rows_arrive_above_it(tmp_path: Path) -> None:
    async with engine_app(tmp_path, slow_spec(stage="wd_stages:sleep_2ms")) as (app, pilot, _link):
        done = app.screen.query_one("#list-finished", TaskList)
        await until(pilot, lambda: done.count > 3 * done.size.height)
        done.focus()
        await pilot.press("j", "j", "j")
        key, line = done.current_key, done.cursor - done.scroll_offset.y
        assert line == 3 and key is not None
        count = done.count
        await until(pilot, lambda: done.count > count + 3 * done.size.height, 30)  # many rows above it since
        await pilot.pause()
        assert done.current_key == key, "the highlight stays on its task"
        assert done.cursor - done.scroll_offset.y == line, "and where it was seen"


async def test_a_scroll_brings_the_highlight_along(tmp_path: Path) -> None:
    async with engine_app(tmp_path, slow_spec(stage="wd_stages:sleep_2ms")) as (app, pilot, _link):
        done = app.screen.query_one("#list-finished", TaskList)
        await until(pilot, lambda: done.count > 5 * done.size.height)
        done.focus()
        await pilot.press("j")
        key = done.current_key
        done.scroll_to(y=done.scroll_offset.y + 2 * done.size.height, animate=False, immediate=True)  # the wheel
        await pilot.pause()
        top = done.scroll_offset.y
        assert top <= done.cursor < top + done.size.height and done.current_key != key


async def test_the_highlight_is_a_bar_without_colour_too(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # NO_COLOR (or a theme whose panel is its background) leaves no background to see: the
    # highlighted row of the list with the keyboard is drawn reversed, a bar in any terminal.
    # Before (issue 29) it was only bold.
    from wd_synthetic import SyntheticRun
    from wd_tui import until as wait_until

    from warpdeck.tui.app import WarpdeckApp
    from warpdeck.tui.link import StreamLink
    from warpdeck.tui.screens.board import BoardScreen

    monkeypatch.setenv("NO_COLOR", "1")
    snap = SyntheticRun(3000, seed=2, batch=8).snapshot_at(3.0, seq=1)
    app = WarpdeckApp(StreamLink([snap]))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: isinstance(app.screen, BoardScreen) and app.screen.shown_seq == 1)
        done = app.screen.query_one("#list-finished", TaskList)
        assert done.count > 3
        done.focus()
        await pilot.press("j")
        await pilot.pause()
        y = done.cursor - done.scroll_offset.y

        def reversed_cells(line: int) -> int:
            return sum(len(seg.text) for seg in done.render_line(line) if seg.style is not None and seg.style.reverse)

        assert reversed_cells(y) >= done.size.width - 1  # the scrollbar's cell aside
        assert reversed_cells(y + 1) == 0
