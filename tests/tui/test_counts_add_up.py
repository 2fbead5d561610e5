"""The board counts every task of the spec, in every snapshot: not yet admitted, queued, by
phase, stalled, finished (done, failed, cancelled) and done by an earlier run add up to the whole,
through failures, cancels, a stop and a resume (issue 29, item 7)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wd_build import spec
from wd_stages import RecordingSink, SleepySource
from wd_synthetic import SyntheticRun

from warpdeck.engine.api import Cancel, Engine, EngineSnapshot, State, TaskView
from warpdeck.tui.board_model import COLUMNS, board_rows

TOTAL = 600
_BASE = SyntheticRun(8, seed=1).snapshot_at(1.0)


def _board_sum(snap: EngineSnapshot) -> int:
    board = board_rows(snap)
    return sum(board.totals[cid] for cid, _ in COLUMNS)


def _adds_up(snap: EngineSnapshot) -> None:
    c = snap.counts
    board = _board_sum(snap)
    assert board == c.total, (snap.seq, board, c)
    assert c.to_come is not None and c.whole == TOTAL, (snap.seq, c)
    assert board + c.to_come + c.earlier == TOTAL, (snap.seq, board, c)
    assert c.queued + c.running_total + c.finished == c.total, (snap.seq, c)
    assert c.done_all <= c.out_of == TOTAL


async def _watch(eng: Engine, seen: list[EngineSnapshot]) -> None:
    async for snap in eng.publisher.stream():
        _adds_up(snap)
        seen.append(snap)


async def _run(run_dir: Path, stop_at: int | None, cancels: tuple[str, ...]) -> tuple[list[EngineSnapshot], int]:
    s = spec(["wd_stages:fail_on_37"], batch_size=4, feeder={"low_watermark": 16, "high_watermark": 48})
    seen: list[EngineSnapshot] = []
    async with Engine(s, run_dir, source=SleepySource(TOTAL), sink=RecordingSink()) as eng:
        watcher = asyncio.create_task(_watch(eng, seen))
        if cancels:
            await eng.command(Cancel(keys=cancels))
        if stop_at is None:
            report = await eng.wait()
            code = report.exit_code
        else:
            async def until_done() -> None:
                async for snap in eng.publisher.stream():
                    if snap.counts.done >= stop_at:
                        return
            await asyncio.wait_for(until_done(), 60)
            code = -1
        watcher.cancel()
    _adds_up(eng.snapshot())
    return seen, code


@pytest.mark.parametrize("stop_at", [40, 250])
async def test_counts_add_up_through_failures_cancels_a_stop_and_a_resume(tmp_path: Path, stop_at: int) -> None:
    cancels = ("t000005", "t000300", "t000599")  # one admitted early, two (most likely) not yet
    first, _ = await _run(tmp_path / "run", stop_at, cancels)
    assert first and any(sn.counts.to_come for sn in first)
    second, code = await _run(tmp_path / "run", None, ())
    last = second[-1].counts if second else None
    assert last is not None and last.earlier > 0  # the resume counts what the first run did
    assert last.failed > 0 and last.to_come == 0
    assert last.done_all + last.failed + last.cancelled == TOTAL
    assert code == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(State)), st.integers(0, 5), st.integers(0, 6)), max_size=60),
       st.integers(0, 50), st.integers(0, 40))
def test_every_row_stands_in_one_column_and_the_rest_are_counted_beside(
        rows: list[tuple[State, int, int]], to_come: int, earlier: int) -> None:
    n = len(rows)
    state = np.array([int(s) for s, _, _ in rows], np.int8)
    phase = np.array([p if s == State.RUNNING else 0 for s, p, _ in rows], np.int8)
    stall = np.array([r if s in (State.QUEUED, State.RUNNING) else 0 for s, _, r in rows], np.int8)
    base = _BASE
    view = TaskView([f"k{i}" for i in range(n)], state, phase, stall, np.zeros(n, np.int16))
    by = {s: int(np.count_nonzero(state == int(s))) for s in State}
    counts = dataclasses.replace(base.counts, queued=by[State.QUEUED], done=by[State.DONE], failed=by[State.FAILED],
                                 cancelled=by[State.CANCELLED], total=n, expected=n + to_come, earlier=earlier)
    snap = dataclasses.replace(base, tasks=view, counts=counts)
    c = snap.counts
    assert _board_sum(snap) == len(rows)
    assert _board_sum(snap) + (c.to_come or 0) + c.earlier == c.whole == len(rows) + to_come + earlier


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("earlier", [0, 108_288])
async def test_the_status_line_and_the_done_column_tell_one_done_count_and_the_rest_is_beside(earlier: int) -> None:
    # A run with failures, most of its tasks not yet admitted, and (once) a resume: the status
    # line's done is the done column's and what an earlier run did, the queued column says what is
    # to come, and the line's total is the whole spec (issue 29: the header and the
    # column differed by the failed tasks; a resume showed ``12,032/291,712`` of a 400,000-task spec).
    from wd_screen import screen_text, shows_count
    from wd_tui import until

    from warpdeck.tui.app import WarpdeckApp
    from warpdeck.tui.link import StreamLink
    from warpdeck.tui.screens.board import BoardScreen

    base = SyntheticRun(5000, seed=7, transitions_per_s=300, stalled_every=29, failed_every=41,
                        batch=8).snapshot_at(12.0, seq=1)
    c = base.counts
    counts = dataclasses.replace(c, expected=c.total + 20_000, earlier=earlier)
    snap = dataclasses.replace(base, counts=counts)
    app = WarpdeckApp(StreamLink([snap]))
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, BoardScreen) and app.screen.shown_seq == 1)
        lines = screen_text(app)
    status, titles = lines[0], [t.strip() for t in lines[1].split("▕")]
    assert c.failed > 0
    head_done, head_total = (_number(x) for x in status.split(" done")[0].split()[-1].split("/"))
    assert head_done == c.done + earlier and head_total == c.total + 20_000 + earlier
    done_title = next(t for t in titles if t.startswith("done "))
    assert _number(done_title.split()[1]) == c.done, done_title
    assert f"✗{c.failed:,}" in done_title
    assert (f"({earlier:,} earlier)" in status) == bool(earlier), status
    queued_title = next(t for t in titles if t.startswith("queued "))
    _, _, more, *words = queued_title.split()
    assert words == ["to", "come"] and shows_count(more.lstrip("+"), 20_000), queued_title
