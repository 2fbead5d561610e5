"""The feeder's watermarks and the depth tuner (engine/run/feeder.py), with real sources and queues."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import numpy as np
import pytest

from warpdeck.engine.edges.config import SyntheticSource
from warpdeck.engine.edges.sources import IterableSource, SyntheticSourceImpl
from warpdeck.engine.run.autotune import DepthTuner
from warpdeck.engine.run.batching import ReadyQueue
from warpdeck.engine.run.feeder import Feeder
from warpdeck.engine.state.part_views import FeederState
from warpdeck.engine.state.task_states import State
from warpdeck.engine.state.tasks import TaskTable

BATCH = 4
LOW, HIGH = 8, 20


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def arrays(n: int) -> list[np.ndarray]:
    return [np.full(3, i, np.float32) for i in range(n)]


def make(source: IterableSource | SyntheticSourceImpl, low: int = LOW, high: int = HIGH) -> Feeder:
    return Feeder(source, TaskTable(), ReadyQueue(BATCH, 1.0, clock=FakeClock()), low, high)


def take_until(feeder: Feeder, at_most: int) -> None:
    """Take full batches (as lanes would) until the ready queue holds at most ``at_most``."""
    while len(feeder.ready) > at_most:
        assert feeder.ready.take() is not None


# -- construction -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("low", "high"), [(8, 8), (9, 8), (0, 8)])
def test_constructor_rejects_watermarks_out_of_order(low: int, high: int) -> None:
    with pytest.raises(ValueError, match=f"low={low}, high={high}"):
        make(IterableSource(arrays(1)), low, high)


# -- watermarks -------------------------------------------------------------------------------------
async def test_first_step_fills_the_ready_queue_to_the_high_watermark() -> None:
    feeder = make(IterableSource(arrays(100)))
    assert await feeder.step() == HIGH
    assert len(feeder.ready) == HIGH
    assert len(feeder.table) == HIGH
    assert feeder.table.keys[:3] == ["item-00000000", "item-00000001", "item-00000002"]
    assert feeder.state is FeederState.FULL
    assert not feeder.exhausted


async def test_no_pull_while_the_queue_is_above_the_low_watermark() -> None:
    feeder = make(IterableSource(arrays(100)))
    await feeder.step()
    take_until(feeder, LOW + BATCH)  # two batches taken, 12 left: still above low
    assert len(feeder.ready) == 12
    assert feeder.wanted() == 0
    assert await feeder.step() == 0
    assert len(feeder.table) == HIGH
    assert feeder.pulls == 1


async def test_step_refills_to_high_once_the_queue_falls_to_low() -> None:
    feeder = make(IterableSource(arrays(100)))
    await feeder.step()
    take_until(feeder, LOW)
    assert len(feeder.ready) == LOW
    assert feeder.wanted() == HIGH - LOW
    assert await feeder.step() == HIGH - LOW
    assert len(feeder.ready) == HIGH
    assert len(feeder.table) == HIGH + (HIGH - LOW)
    # the refill continues where the first pull stopped
    assert feeder.table.keys[HIGH] == f"item-{HIGH:08d}"


async def test_backpressure_refills_only_to_the_low_watermark() -> None:
    feeder = make(IterableSource(arrays(100)))
    feeder.backpressure = True
    assert feeder.target == LOW
    assert await feeder.step() == LOW
    assert len(feeder.ready) == LOW
    assert feeder.wanted() == 0
    assert await feeder.step() == 0
    assert len(feeder.table) == LOW
    assert feeder.state is FeederState.BACKPRESSURE


async def test_lifting_backpressure_refills_to_high_again() -> None:
    feeder = make(IterableSource(arrays(100)))
    feeder.backpressure = True
    await feeder.step()
    feeder.backpressure = False
    assert await feeder.step() == HIGH - LOW
    assert len(feeder.ready) == HIGH


async def test_draining_wants_nothing_and_pulls_nothing() -> None:
    feeder = make(IterableSource(arrays(100)))
    feeder.draining = True
    assert feeder.wanted() == 0
    assert await feeder.step() == 0
    assert len(feeder.table) == 0
    assert feeder.pulls == 0
    assert feeder.state is FeederState.DRAINING


async def test_source_running_dry_sets_exhausted_and_admits_the_remainder() -> None:
    feeder = make(SyntheticSourceImpl(SyntheticSource(kind="synthetic", count=25, shape=(3,))))
    assert await feeder.step() == HIGH
    assert not feeder.exhausted
    take_until(feeder, LOW)
    assert await feeder.step() == 5  # wanted 12, only 5 were left
    assert feeder.exhausted
    assert feeder.state is FeederState.EXHAUSTED
    assert len(feeder.table) == 25
    assert len(feeder.ready) == LOW + 5
    assert feeder.table.keys[-1] == "syn-00000024"
    assert feeder.wanted() == 0


async def test_source_ending_exactly_at_a_pull_is_exhausted_on_the_next_step() -> None:
    feeder = make(IterableSource(arrays(HIGH)))
    assert await feeder.step() == HIGH
    take_until(feeder, LOW)
    assert await feeder.step() == 0
    assert feeder.exhausted
    assert len(feeder.table) == HIGH


async def test_items_with_an_error_fail_on_admit_and_skip_the_ready_queue() -> None:
    calls: list[int] = []
    items = [("good-0", np.zeros(3)), ("bad/key", np.zeros(3)), ("good-1", np.zeros(3))]
    feeder = Feeder(IterableSource(items), TaskTable(), ReadyQueue(BATCH, 1.0, clock=FakeClock()),
                    LOW, HIGH, on_admit=lambda: calls.append(1))
    assert await feeder.step() == 3
    assert feeder.table.keys == ["good-0", "bad/key", "good-1"]
    assert [row for row, _ in feeder.failed_on_admit] == [1]
    assert "'bad/key'" in feeder.failed_on_admit[0][1]
    assert sorted(feeder.ready.pending()) == [0, 2]
    assert sorted(feeder.handles) == [0, 2]
    assert calls == [1]


async def test_infinite_source_is_never_pulled_past_the_high_watermark() -> None:
    produced: list[int] = []

    def forever() -> Iterator[np.ndarray]:
        for i in itertools.count():
            produced.append(i)
            yield np.full(2, i, np.int32)

    feeder = make(IterableSource(forever))
    await feeder.step()
    assert len(produced) == HIGH
    assert await feeder.step() == 0  # above low: no pull
    assert len(produced) == HIGH
    for _ in range(3):
        take_until(feeder, LOW)
        await feeder.step()
        assert len(feeder.ready) == HIGH
        assert len(produced) == len(feeder.table)  # nothing was generated beyond what was admitted
    assert len(produced) == HIGH + 3 * (HIGH - LOW)
    assert not feeder.exhausted


async def test_run_stops_when_the_source_is_exhausted_with_everything_admitted() -> None:
    feeder = make(IterableSource(arrays(6)))
    await asyncio.wait_for(feeder.run(), timeout=30)
    assert feeder.exhausted
    assert len(feeder.table) == 6
    assert (feeder.table.state[:6] == State.QUEUED).all()


def test_set_watermarks_ignores_an_inverted_pair() -> None:
    feeder = make(IterableSource(arrays(1)))
    feeder.set_watermarks(30, 10)
    assert (feeder.low, feeder.high) == (LOW, HIGH)
    feeder.set_watermarks(16, 64)
    assert (feeder.low, feeder.high) == (16, 64)


# -- depth tuner --------------------------------------------------------------------------------------
MB = 2**20


def test_tuner_grows_one_slot_per_five_percent_idle_when_budget_allows() -> None:
    tuner = DepthTuner(max_depth=8, budget_bytes=100 * MB, idle_threshold=0.05)
    assert tuner.decide(lane=0, depth=2, idle_fraction=0.07, slot_bytes=10 * MB, used_bytes=20 * MB) == 3
    assert tuner.decide(lane=0, depth=3, idle_fraction=0.16, slot_bytes=10 * MB, used_bytes=30 * MB) == 6
    assert [(d.lane, d.depth, d.reason) for d in tuner.decisions] == [(0, 3, "bottleneck idle"),
                                                                       (0, 6, "bottleneck idle")]


def test_tuner_step_is_cut_to_what_the_budget_holds() -> None:
    tuner = DepthTuner(max_depth=16, budget_bytes=100 * MB)
    # 50 % idle asks for ten slots; the budget has room for three more.
    assert tuner.decide(0, 2, 0.5, slot_bytes=20 * MB, used_bytes=40 * MB) == 5


def test_tuner_keeps_depth_when_idle_is_at_or_below_threshold() -> None:
    tuner = DepthTuner(max_depth=8, budget_bytes=100 * MB, idle_threshold=0.05)
    assert tuner.decide(0, 2, 0.05, 10 * MB, 20 * MB) == 2
    assert tuner.decide(0, 2, 0.01, 10 * MB, 20 * MB) == 2
    assert tuner.decisions == []


def test_tuner_never_grows_past_max_depth() -> None:
    tuner = DepthTuner(max_depth=4, budget_bytes=1000 * MB)
    depth = 2
    for _ in range(10):
        depth = tuner.decide(0, depth, 0.5, MB, depth * MB)
    assert depth == 4
    assert [d.depth for d in tuner.decisions] == [4]


def test_tuner_refuses_growth_beyond_the_budget_and_records_why() -> None:
    tuner = DepthTuner(max_depth=8, budget_bytes=100 * MB)
    assert tuner.decide(1, 3, 0.5, slot_bytes=30 * MB, used_bytes=80 * MB) == 3
    assert tuner.decide(1, 3, 0.5, slot_bytes=30 * MB, used_bytes=80 * MB) == 3
    assert [(d.lane, d.depth, d.reason) for d in tuner.decisions] == [(1, 3, "budget")]  # recorded once


def test_tuner_grows_when_the_new_slot_fits_the_budget_exactly() -> None:
    tuner = DepthTuner(max_depth=8, budget_bytes=100 * MB)
    assert tuner.decide(0, 3, 0.5, slot_bytes=20 * MB, used_bytes=80 * MB) == 4
