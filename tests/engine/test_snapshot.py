"""Engine snapshots are immutable copies; the publisher is latest-wins (engine/state/snapshot.py).

Snapshots come from a real ``Engine`` that is constructed but never started (no ``async with``),
so the test drives its feeder and task table by hand and nothing runs in the background.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from warpdeck.engine.edges.config import PipelineSpec, parse_spec
from warpdeck.engine.engine import Engine
from warpdeck.engine.state.snapshot import ControlView, EngineSnapshot, SnapshotPublisher
from warpdeck.engine.state.task_states import Phase, State

COUNT = 10


def small_spec() -> PipelineSpec:
    return parse_spec({
        "name": "snap-test",
        "backend": "numpy",
        "batch_size": 4,
        "source": {"kind": "synthetic", "count": COUNT, "shape": [512], "seed": 1},
        "stages": [{"fn": "warpdeck.examples.dense:stage"}],
        "sink": {"kind": "null"},
    })


@pytest.fixture
async def eng(tmp_path: Path) -> AsyncIterator[Engine]:
    """A fresh engine, never started; an Engine must be built inside a running loop."""
    engine = Engine(small_spec(), tmp_path)
    try:
        yield engine
    finally:
        engine.backend.close()


# -- snapshots ------------------------------------------------------------------------------------
async def test_snapshot_dataclass_is_frozen(eng: Engine) -> None:
    snap = eng.snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.status = "finished"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.counts.done = 5  # type: ignore[misc]
    assert snap.status == "starting"
    assert snap.pipeline == "snap-test"


async def test_snapshot_task_arrays_are_read_only(eng: Engine) -> None:
    await eng.feeder.step()
    snap = eng.snapshot()
    assert len(snap.tasks) == COUNT
    for name in ("state", "phase", "stall", "attempt"):
        arr = getattr(snap.tasks, name)
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 1
    assert snap.tasks.state.tolist() == [State.QUEUED] * COUNT


async def test_later_table_changes_do_not_reach_an_earlier_snapshot(eng: Engine) -> None:
    await eng.feeder.step()
    before = eng.snapshot()
    rows = np.arange(4, dtype=np.int64)
    eng.table.start(rows, batch_id=0)
    eng.table.advance(rows, Phase.H2D)
    eng.table.fail(np.array([9]), "fill: boom")
    after = eng.snapshot()

    # the earlier snapshot still shows ten queued tasks
    assert before.tasks.state.tolist() == [State.QUEUED] * COUNT
    assert before.tasks.phase.tolist() == [Phase.NONE] * COUNT
    assert (before.counts.queued, before.counts.failed, before.counts.running_total) == (COUNT, 0, 0)
    assert before.counts.running["h2d"] == 0
    # the later one shows the change, so the change really happened
    assert after.tasks.state.tolist() == [State.RUNNING] * 4 + [State.QUEUED] * 5 + [State.FAILED]
    assert (after.counts.queued, after.counts.failed, after.counts.running["h2d"]) == (5, 1, 4)
    assert after.seq == before.seq + 1


async def test_snapshot_counts_agree_with_its_task_view(eng: Engine) -> None:
    await eng.feeder.step()
    eng.table.start(np.arange(3, dtype=np.int64), 0)
    eng.table.cancel(np.array([5]))
    snap = eng.snapshot()
    assert snap.counts.total == len(snap.tasks) == COUNT
    assert snap.counts.expected == COUNT
    assert snap.counts.queued == len(snap.tasks.rows(State.QUEUED)) == 6
    assert snap.counts.running["fill"] == len(snap.tasks.rows(State.RUNNING, Phase.FILL)) == 3
    assert snap.counts.cancelled == 1
    assert snap.counts.finished == 1


async def test_snapshot_counts_by_name_cannot_be_changed(eng: Engine) -> None:
    await eng.feeder.step()
    counts = eng.snapshot().counts
    for by_name, name in ((counts.running, "fill"), (counts.stalled, "memory")):
        with pytest.raises(TypeError):
            by_name[name] = 99  # type: ignore[index]
        with pytest.raises(TypeError):
            del by_name[name]  # type: ignore[attr-defined]
    assert counts.running["fill"] == 0 and counts.stalled["memory"] == 0


async def test_snapshot_figures_by_name_and_lane_cannot_be_changed(eng: Engine) -> None:
    figures = dataclasses.replace(eng.snapshot().figures, occupancy={0: {"fill": 0.5}})
    for by_name in (figures.mean_phase_s, figures.stall_s, figures.amdahl, figures.occupancy[0]):
        with pytest.raises(TypeError):
            by_name["fill"] = 1.0  # type: ignore[index]
    with pytest.raises(TypeError):
        figures.occupancy[1] = {}  # type: ignore[index]


def test_a_control_view_keeps_a_read_only_copy_of_the_counts_it_is_given() -> None:
    refused, dropped = {"expired": 1}, {"invalid": 2}
    view = ControlView(broker="mqtt://b:1883", connected=True, commands_applied=0, commands_refused=refused,
                       dropped=dropped, reconnects=0)
    refused["expired"] = 5  # the plane's own counters go on counting
    dropped.clear()
    assert (view.commands_refused, view.dropped) == ({"expired": 1}, {"invalid": 2})
    with pytest.raises(TypeError):
        view.dropped["invalid"] = 0  # type: ignore[index]
    # a copy made from the view shares its read-only counts instead of copying them again
    assert dataclasses.replace(view, reconnects=1).dropped is view.dropped


# -- publisher --------------------------------------------------------------------------------------
def three_snapshots(eng: Engine) -> list[EngineSnapshot]:
    snaps = [eng.snapshot() for _ in range(3)]
    assert [s.seq for s in snaps] == [1, 2, 3]
    return snaps


async def test_reader_starting_late_gets_the_newest_snapshot_first(eng: Engine) -> None:
    pub = SnapshotPublisher()
    for s in three_snapshots(eng):
        pub.publish(s)
    stream = pub.stream()
    first = await anext(stream)
    assert first.seq == 3
    assert pub.latest is first
    await stream.aclose()


async def test_slow_reader_skips_to_the_newest_snapshot(eng: Engine) -> None:
    pub = SnapshotPublisher()
    s1, s2, s3 = three_snapshots(eng)
    pub.publish(s1)
    stream = pub.stream()
    assert (await anext(stream)).seq == 1
    pub.publish(s2)  # the reader is busy elsewhere while 2 and 3 arrive
    pub.publish(s3)
    assert (await anext(stream)).seq == 3
    await stream.aclose()


async def test_waiting_reader_is_woken_by_publish(eng: Engine) -> None:
    pub = SnapshotPublisher()
    s1, s2, _ = three_snapshots(eng)
    pub.publish(s1)
    stream = pub.stream()
    await anext(stream)
    waiting = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)  # let the reader block on the publisher
    assert not waiting.done()
    pub.publish(s2)
    got = await waiting
    assert got is s2
    await stream.aclose()


async def test_close_ends_the_stream_after_the_last_unseen_snapshot(eng: Engine) -> None:
    pub = SnapshotPublisher()
    s1, s2, _ = three_snapshots(eng)
    pub.publish(s1)
    pub.publish(s2)
    pub.close()
    got = [s.seq async for s in pub.stream()]
    assert got == [2]


async def test_close_wakes_a_waiting_reader_and_ends_its_stream(eng: Engine) -> None:
    pub = SnapshotPublisher()
    pub.publish(eng.snapshot())
    seen: list[int] = []

    async def read() -> None:
        async for s in pub.stream():
            seen.append(s.seq)

    reader = asyncio.create_task(read())
    await asyncio.sleep(0)
    assert not reader.done()
    pub.close()
    await reader
    assert seen == [1]


async def test_subscribers_get_every_snapshot_until_they_unsubscribe(eng: Engine) -> None:
    pub = SnapshotPublisher()
    s1, s2, s3 = three_snapshots(eng)
    a: list[int] = []
    b: list[int] = []
    unsubscribe_a = pub.subscribe(lambda s: a.append(s.seq))
    pub.subscribe(lambda s: b.append(s.seq))
    pub.publish(s1)
    pub.publish(s2)
    unsubscribe_a()
    pub.publish(s3)
    assert a == [1, 2]
    assert b == [1, 2, 3]
    unsubscribe_a()  # a second call is harmless
    assert b == [1, 2, 3]
