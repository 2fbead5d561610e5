"""``HostedEngine``: an engine on a thread of its own, watched by any number of front ends (engine/hosted.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from warpdeck.engine.api import (
    CommandResult,
    EngineSnapshot,
    HostedEngine,
    Pause,
    Resume,
    RunDirError,
    RunReport,
    parse_spec,
)


def _spec(count: int):
    return parse_spec({"name": "hosted", "backend": "numpy", "batch_size": 4,
                       "feeder": {"low_watermark": 8, "high_watermark": 16},
                       "source": {"kind": "synthetic", "count": count, "shape": [4], "dtype": "float64"},
                       "sink": {"kind": "null"}, "stages": [{"fn": "wd_stages:double"}]}, "<test>")


class _Watch:
    """What one front end hears: every snapshot, and each end (there must be exactly one)."""

    def __init__(self) -> None:
        self.snapshots: list[EngineSnapshot] = []
        self.ends: list[tuple[RunReport | None, str]] = []
        self.ended = threading.Event()
        self.threads: set[str] = set()

    def snapshot(self, snap: EngineSnapshot) -> None:
        self.threads.add(threading.current_thread().name)
        self.snapshots.append(snap)

    def end(self, report: RunReport | None, error: str) -> None:
        self.ends.append((report, error))
        self.ended.set()


async def test_every_watcher_hears_each_snapshot_and_the_end_once() -> None:
    hosted = HostedEngine(_spec(400), journal=False)
    early, late = _Watch(), _Watch()
    hosted.open()
    try:
        hosted.watch(early.snapshot, early.end)
        hosted.watch(late.snapshot, late.end)
        assert await asyncio.to_thread(early.ended.wait, 60), "the run never ended"
        assert await asyncio.to_thread(late.ended.wait, 10)
    finally:
        hosted.stop()
    for w in (early, late):
        assert len(w.ends) == 1
        report, error = w.ends[0]
        assert error == "" and report is not None and report.counts.done == 400
        seqs = [s.seq for s in w.snapshots]
        assert seqs == sorted(seqs) and w.snapshots[-1].counts.done == 400
        assert "warpdeck-engine" in w.threads  # delivered on the engine's thread, not the caller's
    assert hosted.ended and hosted.report is early.ends[0][0]


async def test_a_watcher_that_comes_after_the_end_hears_it_at_once() -> None:
    hosted = HostedEngine(_spec(40), journal=False)
    hosted.open()
    assert await asyncio.to_thread(hosted.wait, 60)
    after = _Watch()
    hosted.watch(after.snapshot, after.end)
    assert len(after.ends) == 1 and after.ends[0][0] is hosted.report
    assert after.snapshots and after.snapshots[-1].counts.done == 40  # the newest there is, first
    hosted.stop()


async def test_commands_cross_to_the_engines_loop_and_are_refused_once_it_has_stopped() -> None:
    hosted = HostedEngine(_spec(1_000_000), journal=False)
    hosted.open()
    try:
        result = await hosted.command(Pause())
        assert isinstance(result, CommandResult) and result.ok
        assert not (await hosted.command(Pause())).changed  # the engine's own answer: already paused
        assert (await hosted.command(Resume())).ok
    finally:
        hosted.stop()
    assert hosted.report is not None and hosted.report.status == "stopped"
    after = await hosted.command(Pause())
    assert (after.ok, after.message) == (False, "the engine has stopped")


async def test_a_failed_start_is_raised_by_open_and_kept_for_the_screen(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "journal.sqlite").write_bytes(b"not a journal, not SQLite at all" * 64)
    hosted = HostedEngine(_spec(40), run_dir)
    watch = _Watch()
    with pytest.raises(RunDirError):
        hosted.open()
    hosted.watch(watch.snapshot, watch.end)
    assert watch.ends == [(None, hosted.error)] and "RunDirError" in hosted.error
    assert hosted.ended and hosted.latest is None
    assert await hosted.task_detail("syn-00000001") is None
    hosted.stop()
