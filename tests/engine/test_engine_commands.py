"""Operator commands change what the engine does, visibly in its snapshots."""

from __future__ import annotations

import asyncio

from wd_build import spec
from wd_stages import RecordingSink, SleepySource

from warpdeck.engine.api import Cancel, Drain, Engine, EngineSnapshot, Pause, Quarantine, Release, Resume, SetDepth


async def _until(cond, eng: Engine, limit: float = 60.0) -> None:
    async def wait() -> None:
        async for snap in eng.publisher.stream():
            if cond(snap):
                return
    await asyncio.wait_for(wait(), limit)


async def _next_snapshots(eng: Engine, n: int, limit: float = 60.0) -> list[EngineSnapshot]:
    """The next ``n`` snapshots the engine publishes (on its own timer, whatever else it does)."""
    latest = eng.publisher.latest
    start = -1 if latest is None else latest.seq
    got: list[EngineSnapshot] = []

    async def wait() -> None:
        async for snap in eng.publisher.stream():
            if snap.seq > start:
                got.append(snap)
                if len(got) == n:
                    return
    await asyncio.wait_for(wait(), limit)
    return got


async def test_pause_stops_new_batches_and_stalls_queued_work_then_resume_finishes() -> None:
    # 10 ms per batch of 4: 1 s of work, so the pause lands with work still queued.
    s = spec(["wd_stages:sleep_10ms"], batch_size=4)
    async with Engine(s, source=SleepySource(400), sink=RecordingSink()) as eng:
        await _until(lambda sn: sn.counts.done >= 8, eng)
        result = await eng.command(Pause())
        assert result.ok
        await _until(lambda sn: sn.counts.running_total == 0 and sn.counts.stalled["control"] > 0, eng)
        done_at_pause = eng.snapshot().counts.done
        snap = eng.snapshot()
        assert snap.feeder.state == "paused"
        assert all(st.reason == "control" for st in snap.stalled)
        # A paused engine must not start anything meanwhile: not in the next two of its snapshot ticks.
        later = await _next_snapshots(eng, 2)
        assert [(sn.counts.done, sn.counts.running_total) for sn in later] == [(done_at_pause, 0)] * 2
        assert eng.snapshot().counts.done == done_at_pause
        await eng.command(Resume())
        report = await eng.wait()
        assert report.counts.done == 400
        assert report.stall_s["control"] > 0


async def test_drain_finishes_admitted_work_and_admits_nothing_more() -> None:
    s = spec(["wd_stages:sleep_2ms"], batch_size=4, feeder={"low_watermark": 8, "high_watermark": 16})
    async with Engine(s, source=SleepySource(1000), sink=RecordingSink()) as eng:
        await _until(lambda sn: sn.counts.done >= 8, eng)
        await eng.command(Drain())
        report = await eng.wait()
    assert report.status == "drained"
    assert report.counts.queued == 0 and report.counts.running == 0
    assert report.counts.done == report.counts.total < 1000
    assert report.exit_code == 3  # drained, nothing failed


async def test_cancel_all_cancels_queued_and_running_tasks() -> None:
    s = spec(["wd_stages:sleep_10ms"], batch_size=4)
    async with Engine(s, source=SleepySource(400), sink=RecordingSink()) as eng:
        await _until(lambda sn: sn.counts.done >= 4, eng)
        result = await eng.command(Cancel(all=True))
        assert result.affected > 0
        report = await eng.wait()
    assert report.status == "cancelled"
    assert report.counts.cancelled > 0
    assert report.counts.done + report.counts.cancelled == report.counts.total
    assert report.exit_code == 1


async def test_cancel_by_key_cancels_only_that_task() -> None:
    s = spec(["wd_stages:sleep_2ms"], batch_size=4, feeder={"low_watermark": 100, "high_watermark": 300})
    sink = RecordingSink()
    async with Engine(s, source=SleepySource(200), sink=sink) as eng:
        await eng.command(Pause())
        await _until(lambda sn: sn.counts.queued >= 100, eng)
        await eng.command(Cancel(keys=("t000150",)))
        await eng.command(Resume())
        report = await eng.wait()
    assert report.counts.cancelled == 1 and report.counts.done == 199
    assert "t000150" not in sink.out


async def test_set_depth_changes_every_lane_and_turns_auto_off() -> None:
    s = spec(["wd_stages:sleep_2ms"], batch_size=4, lanes=2)
    async with Engine(s, source=SleepySource(200), sink=RecordingSink()) as eng:
        await eng.command(SetDepth(depth=5))
        snap = eng.snapshot()
        assert [ln.depth for ln in snap.lanes] == [5, 5]
        assert snap.feeder.auto_depth is False
        report = await eng.wait()
    assert report.slot_depth == [5, 5] and report.counts.done == 200


async def test_a_command_that_changes_nothing_says_so_and_is_marked_unchanged() -> None:
    # Issue 29: a room kept an undo for a pause while paused, or a release of a worker not
    # quarantined, and its undo then changed what the operator never had.
    s = spec(["wd_stages:sleep_10ms"], batch_size=4)
    async with Engine(s, source=SleepySource(400), sink=RecordingSink()) as eng:
        await _until(lambda sn: sn.counts.done >= 8, eng)
        wid = eng.worker_id
        answers = [await eng.command(c) for c in (
            Resume(), Pause(), Pause(), Resume(), Release(worker=wid), Quarantine(worker=wid), Quarantine(worker=wid),
            Release(worker=wid), SetDepth(depth=5), SetDepth(depth=5))]
        assert [(a.ok, a.changed) for a in answers] == [
            (True, False), (True, True), (True, False), (True, True), (True, False), (True, True), (True, False),
            (True, True), (True, True), (True, False)]
        assert [answers[i].message for i in (0, 2, 4, 6, 9)] == [
            "not paused: nothing to resume", "already paused", f"worker {wid} is not quarantined",
            f"worker {wid} is already quarantined", "slot depth is already 5"]
        assert (await eng.wait()).counts.done == 400
