"""Commands and detail that name tasks by key tell the truth: unknown keys are named, a task not
admitted yet can be cancelled (and stays cancelled across a crash), every cancel says what happened to
each task, and detail answers for any task during and after the run (engine/run/task_keys.py)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import wd_stages
from wd_build import spec
from wd_stages import RecordingSink

from warpdeck.engine.api import (
    Cancel,
    Engine,
    EngineSnapshot,
    IterableSource,
    Pause,
    Resume,
    RetryFailed,
    TaskDetail,
    parse_spec,
)
from warpdeck.engine.edges.journal import JOURNAL_NAME
from warpdeck.engine.state.task_states import State

WATERMARKS = {"low_watermark": 8, "high_watermark": 16}
"""Small watermarks: of 400 tasks only the first few dozen are admitted while the run is paused."""


def _spec(count: int = 400, stages: tuple[str, ...] = ("wd_stages:sleep_2ms",), **kw: object):
    kw.setdefault("feeder", WATERMARKS)
    return spec(list(stages), batch_size=4,
                source={"kind": "synthetic", "count": count, "shape": [4], "dtype": "float64"}, **kw)


async def _until(eng: Engine, cond: Callable[[EngineSnapshot], bool], limit: float = 60.0) -> None:
    async def wait() -> None:
        async for snap in eng.publisher.stream():
            if cond(snap):
                return
    await asyncio.wait_for(wait(), limit)


async def _paused(eng: Engine) -> None:
    """Paused, with the ready queue filled to its high watermark (the feeder admits while paused)."""
    await eng.command(Pause())
    await _until(eng, lambda sn: sn.counts.queued >= WATERMARKS["high_watermark"] and sn.feeder.state != "filling")


def _admitted(eng: Engine) -> set[str]:
    return set(eng.table.keys)


# -- A: unknown keys ------------------------------------------------------------------------------------
async def test_cancel_of_an_unknown_key_answers_no_task_naming_it() -> None:
    async with Engine(_spec(), sink=RecordingSink()) as eng:
        await _paused(eng)
        one = await eng.command(Cancel(keys=("syn-99999999",)))
        two = await eng.command(Cancel(keys=("nosuch", "syn-00000400")))
        assert (one.ok, one.affected, one.message) == (False, 0, "no task 'syn-99999999'")
        assert (two.ok, two.affected, two.message) == (False, 0, "no task 'nosuch', 'syn-00000400'")
        await eng.command(Resume())
        report = await eng.wait()
    assert report.counts.cancelled == 0 and report.counts.done == 400


async def test_cancel_of_known_and_unknown_keys_cancels_the_known_and_names_the_unknown() -> None:
    sink = RecordingSink()
    async with Engine(_spec(), sink=sink) as eng:
        await _paused(eng)
        result = await eng.command(Cancel(keys=("syn-00000010", "nosuch")))
        assert not result.ok and result.affected == 1
        assert result.message == "cancelled 1 queued; no task 'nosuch'"
        await eng.command(Resume())
        report = await eng.wait()
    assert (report.counts.cancelled, report.counts.done) == (1, 399) and "syn-00000010" not in sink.out


async def test_retry_of_an_unknown_key_answers_no_task_and_of_a_task_that_did_not_fail_says_so() -> None:
    async with Engine(_spec(count=40), sink=RecordingSink()) as eng:
        await eng.wait()
        unknown = await eng.command(RetryFailed(keys=("nosuch",)))
        done = await eng.command(RetryFailed(keys=("syn-00000003",)))
        mixed = await eng.command(RetryFailed(keys=("syn-00000003", "nosuch", "other")))
    assert (unknown.ok, unknown.affected, unknown.message) == (False, 0, "no task 'nosuch'")
    assert (done.ok, done.affected, done.message) == (False, 0, "syn-00000003: done, not failed")
    assert mixed.message == "syn-00000003: done, not failed; no task 'nosuch', 'other'"


def _items(n: int) -> Iterator[tuple[str, np.ndarray]]:
    for i in range(n):
        yield f"k{i:04d}", np.full(4, float(i))


async def test_an_iterable_source_cannot_say_so_a_key_outside_the_table_waits_while_it_is_not_exhausted() -> None:
    sink = RecordingSink()
    s = _spec()
    async with Engine(s, source=IterableSource(lambda: _items(400)), sink=sink) as eng:
        await _paused(eng)
        assert "k0300" not in _admitted(eng)
        result = await eng.command(Cancel(keys=("k0300",)))
        assert result.ok and result.affected == 1
        assert result.message == ("k0300: not admitted yet, and the source cannot say whether it will yield it;"
                                  " cancelled if it does")
        await eng.command(Resume())
        report = await eng.wait()
        # exhausted now: a key the source never yielded is unknown, and nothing waits for it
        after = await eng.command(Cancel(keys=("k0400",)))
        assert (after.ok, after.message) == (False, "no task 'k0400'")
    assert (report.counts.cancelled, report.counts.done) == (1, 399) and "k0300" not in sink.out
    detail = eng.task_detail("k0300")
    assert detail is not None and detail.state == "cancelled"


# -- B: cancelling a task not admitted yet ---------------------------------------------------------
async def test_a_task_not_admitted_yet_is_cancelled_when_the_feeder_admits_it_and_never_runs() -> None:
    sink = RecordingSink()
    async with Engine(_spec(), sink=sink) as eng:
        await _paused(eng)
        assert "syn-00000150" not in _admitted(eng)
        result = await eng.command(Cancel(keys=("syn-00000150",)))
        assert (result.ok, result.affected) == (True, 1)
        assert result.message == "syn-00000150: not admitted yet; cancelled when it is"
        waiting = eng.task_detail("syn-00000150")
        assert waiting is not None and (waiting.state, waiting.admitted) == ("queued", False)
        assert "cancelled when it is admitted" in waiting.note
        await eng.command(Resume())
        report = await eng.wait()
    assert (report.counts.cancelled, report.counts.done) == (1, 399)
    assert "syn-00000150" not in sink.out
    detail = eng.task_detail("syn-00000150")
    assert detail is not None and detail.state == "cancelled" and detail.admitted
    assert detail.error == "cancelled by operator before admission"


def _journal_rows(run_dir: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(run_dir / JOURNAL_NAME) as c:
        return c.execute(sql).fetchall()


async def test_a_pending_cancel_is_journaled_and_a_resume_after_a_crash_applies_it(tmp_path: Path) -> None:
    s = _spec()
    async with Engine(s, tmp_path, sink=RecordingSink()) as crashed:
        await _paused(crashed)
        result = await crashed.command(Cancel(keys=("syn-00000300",)))
        assert result.ok and "not admitted yet" in result.message
        assert crashed.journal is not None
        assert await asyncio.to_thread(crashed.journal.flush, 10)
        crashed.journal.abandon()  # killed here: nothing more reaches the journal
    assert _journal_rows(tmp_path, "SELECT key FROM cancels") == [("syn-00000300",)]
    assert _journal_rows(tmp_path, "SELECT key FROM tasks WHERE key = 'syn-00000300'") == []
    sink = RecordingSink()
    async with Engine(s, tmp_path, sink=sink) as eng:  # the resume
        await eng.wait()
    assert eng.report is not None and eng.report.counts.cancelled == 1
    assert eng.report.counts.done + eng.report.counts.skipped_done == 399
    assert "syn-00000300" not in sink.out
    detail = eng.task_detail("syn-00000300")
    assert detail is not None and detail.state == "cancelled"
    assert _journal_rows(tmp_path, "SELECT state FROM tasks WHERE key = 'syn-00000300'") == [(int(State.CANCELLED),)]
    assert _journal_rows(tmp_path, "SELECT key FROM cancels") == []  # applied: nothing waits any more


# -- C: what a cancel did to each task ------------------------------------------------------------
@pytest.fixture
def held_lane() -> Iterator[None]:
    """Lane 0's compute blocks until released: its batch is running for as long as the test needs."""
    wd_stages.HELD_LANES.clear()
    wd_stages.HELD_LANES.add(0)
    wd_stages.RELEASE_LANES.clear()
    try:
        yield
    finally:
        wd_stages.RELEASE_LANES.set()
        wd_stages.HELD_LANES.clear()


async def test_cancel_says_what_happened_to_each_task_queued_running_pending_and_finished(held_lane: None) -> None:
    sink = RecordingSink()
    s = _spec(count=200, stages=("wd_stages:hold_lanes",), lanes=1, slot_depth=2,
              feeder={**WATERMARKS, "auto_depth": False})
    async with Engine(s, sink=sink) as eng:
        # The first batch computes on the held lane; the ready queue fills behind it.
        await _until(eng, lambda sn: sn.counts.running["compute"] >= 4 and sn.counts.queued > 8)
        queued = eng.table.keys[-1]  # the newest admitted: the back of the ready queue, never taken next
        assert eng.task_detail("syn-00000001").state == "running"  # type: ignore[union-attr]
        assert eng.task_detail(queued).state == "queued"  # type: ignore[union-attr]
        result = await eng.command(Cancel(keys=("syn-00000001", queued, "syn-00000150")))
        assert (result.ok, result.affected) == (True, 3)
        assert result.message == ("cancelled 1 queued; syn-00000001 running: stops at its next phase;"
                                  " syn-00000150: not admitted yet; cancelled when it is")
        wd_stages.RELEASE_LANES.set()
        report = await eng.wait()
        again = await eng.command(Cancel(keys=("syn-00000001", "syn-00000002", "syn-00000003")))
    assert report.counts.cancelled == 3 and report.counts.done == 197
    assert not {"syn-00000001", queued, "syn-00000150"} & set(sink.out)
    assert (again.ok, again.affected) == (True, 0)
    assert again.message == "syn-00000002, syn-00000003 already done; syn-00000001 already cancelled"


# -- D: detail of any task, during and after the run ----------------------------------------------
async def test_detail_answers_for_a_task_not_admitted_yet_and_none_for_a_key_the_source_never_makes() -> None:
    async with Engine(_spec(), sink=RecordingSink()) as eng:
        await _paused(eng)
        pending = eng.task_detail("syn-00000399")
        assert pending == TaskDetail("syn-00000399", "queued", "none", 1, -1, "none", "", "", "", (),
                                     admitted=False, note="queued (not yet admitted)")
        assert eng.task_detail("syn-00000400") is None and eng.task_detail("nosuch") is None
        await eng.command(Resume())
        await eng.wait()
    done = eng.task_detail("syn-00000399")
    assert done is not None and (done.state, done.admitted, done.attempt) == ("done", True, 1)


async def test_detail_of_a_task_done_in_an_earlier_run_comes_from_the_journal(tmp_path: Path) -> None:
    s = parse_spec({"name": "earlier", "backend": "numpy", "batch_size": 4,
                    "source": {"kind": "synthetic", "count": 12, "shape": [4], "dtype": "float64"},
                    "sink": {"kind": "npy_dir", "path": "outputs"}, "stages": [{"fn": "wd_stages:double"}]})

    async def run() -> Engine:
        async with Engine(s, tmp_path) as eng:
            await eng.wait()
        return eng

    await run()
    again = await run()
    assert again.report is not None and again.report.counts.skipped_done == 12
    d = again.task_detail("syn-00000005")
    assert d is not None and (d.state, d.attempt, d.admitted) == ("done", 1, False)
    assert d.note == "done in an earlier run (from the journal)"
