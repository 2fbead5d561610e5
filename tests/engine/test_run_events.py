"""The run's event stream (engine/state/run_events.py): every batch once, commands with their
answers, and a listener that fails is dropped without stopping the run."""

from __future__ import annotations

from warpdeck.engine.api import (
    ALL_QUARANTINED,
    BatchFinished,
    Cancel,
    CommandEvent,
    Engine,
    Pause,
    Quarantine,
    Release,
    Resume,
    RunEvent,
    SetDepth,
    StallEvent,
    parse_spec,
)


def _spec(count: int = 400) -> object:
    return parse_spec({
        "name": "events", "batch_size": 16, "lanes": 2,
        "source": {"kind": "synthetic", "count": count, "shape": [32], "dtype": "float32"},
        "sink": {"kind": "null"}, "stages": [{"fn": "wd_stages:double"}],
    }, "<test>")


async def test_every_batch_is_heard_once_with_its_worker() -> None:
    heard: list[RunEvent] = []
    async with Engine(_spec()) as engine:  # type: ignore[arg-type]
        engine.events.subscribe(heard.append)
        report = await engine.wait()
    batches = [e for e in heard if isinstance(e, BatchFinished)]
    assert report.counts.done == 400
    assert sum(e.record.tasks for e in batches) == 400
    assert len({e.record.batch for e in batches}) == len(batches)
    assert {e.worker for e in batches} == set(engine.worker_ids)
    assert all(e.epoch >= 0 and e.record.ok for e in batches)


async def test_commands_are_heard_with_their_answers_and_a_failing_listener_is_dropped() -> None:
    heard: list[RunEvent] = []

    def broken(event: RunEvent) -> None:
        raise RuntimeError("listener broke")

    async with Engine(_spec(2000)) as engine:  # type: ignore[arg-type]
        engine.events.subscribe(broken)
        engine.events.subscribe(heard.append)
        await engine.command(Pause())
        await engine.command(SetDepth(depth=3))
        await engine.command(Cancel(keys=["no-such-task"]))
        await engine.command(Resume())
        report = await engine.wait()
    assert report.counts.done == 2000
    cmds = [(e.verb, e.applied) for e in heard if isinstance(e, CommandEvent)]
    assert cmds == [("pause", True), ("set_depth", True), ("cancel", False), ("resume", True)]
    assert any(isinstance(e, BatchFinished) for e in heard)  # the broken listener went, the others stayed


async def test_quarantining_every_worker_is_one_stall_of_the_waiting_tasks_and_release_ends_it() -> None:
    heard: list[RunEvent] = []
    async with Engine(_spec(4000)) as engine:  # type: ignore[arg-type]
        engine.events.subscribe(heard.append)
        await engine.command(Quarantine(worker=engine.worker_id))
        await engine.command(Release(worker=engine.worker_id))
        await engine.command(Cancel(all=True))
        await engine.wait()
    held = [(e.began, e.note) for e in heard if isinstance(e, StallEvent) and e.batch == -1]
    assert held == [(True, ALL_QUARANTINED), (False, ALL_QUARANTINED)]
