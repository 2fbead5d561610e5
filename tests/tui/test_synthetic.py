"""The synthetic stream keeps the engine's invariants, so what the screens show from it is possible."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from wd_synthetic import SyntheticRun

from warpdeck.engine.api import EngineSnapshot, Phase, State
from warpdeck.tui.board_model import board_rows

TIMES = (0.0, 0.05, 0.7, 3.0, 12.0, 40.0, 1000.0)


def _run(seed: int = 0) -> SyntheticRun:
    return SyntheticRun(3000, seed=seed, transitions_per_s=600, stalled_every=17, failed_every=23, batch=8)


def _tally(snap: EngineSnapshot) -> np.ndarray:
    view = snap.tasks
    return np.bincount(view.state.astype(np.intp) * 6 + view.phase, minlength=30)


@pytest.mark.parametrize("t", TIMES)
def test_each_task_is_in_one_legal_state(t: float) -> None:
    view = _run().snapshot_at(t).tasks
    running = view.state == State.RUNNING
    assert set(np.unique(view.state).tolist()) <= {int(s) for s in State}
    assert np.all((view.phase > 0) == running), "a phase exactly when running"
    assert np.all(view.phase <= Phase.SINK)
    assert not np.any((view.stall != 0) & (view.state >= State.DONE)), "terminal tasks do not stall"


@pytest.mark.parametrize("t", TIMES)
def test_counts_match_the_columns_and_add_up(t: float) -> None:
    snap = _run().snapshot_at(t)
    c, by = snap.counts, _tally(snap)
    assert c.queued == by[State.QUEUED * 6]
    assert c.running == {p.name.lower(): int(by[State.RUNNING * 6 + p]) for p in Phase if p}
    assert (c.done, c.failed, c.cancelled) == (by[State.DONE * 6], by[State.FAILED * 6], by[State.CANCELLED * 6])
    assert c.queued + c.running_total + c.finished == c.total == len(snap.tasks)
    assert sum(c.stalled.values()) == int(np.count_nonzero(snap.tasks.stall))
    assert len(snap.failures) == c.failed
    assert sum(board_rows(snap).totals.values()) == c.total


def test_stalls_of_every_reason_and_failures_appear() -> None:
    snap = _run().snapshot_at(12.0)
    assert all(n > 0 for n in snap.counts.stalled.values())
    assert snap.counts.failed > 0
    assert all(s.stalled_s >= 0 for s in snap.stalled)
    assert {s.reason for s in snap.stalled} == set(snap.counts.stalled)


def test_work_only_moves_forward() -> None:
    run = _run()
    done = [run.snapshot_at(t).counts.done for t in np.arange(0.0, 40.0, 0.37)]
    assert done == sorted(done)
    assert done[-1] > done[0]


def test_same_seed_same_snapshot_and_other_seed_differs() -> None:
    a, b, c = _run(3).snapshot_at(7.5), _run(3).snapshot_at(7.5), _run(4).snapshot_at(7.5)
    for x, y in ((a.tasks.state, b.tasks.state), (a.tasks.stall, b.tasks.stall), (a.tasks.attempt, b.tasks.attempt)):
        assert np.array_equal(x, y)
    assert (a.counts, a.stalled, a.timeline, a.figures, a.workers) == (b.counts, b.stalled, b.timeline, b.figures,
                                                                      b.workers)
    assert not np.array_equal(a.tasks.stall, c.tasks.stall)


def test_snapshots_share_keys_and_are_read_only() -> None:
    run = _run()
    a, b = run.snapshot_at(1.0), run.snapshot_at(2.0)
    assert a.tasks.keys is b.tasks.keys
    assert a.tasks.key(123) == "img-0000123"
    with pytest.raises(ValueError, match="read-only"):
        a.tasks.state[0] = State.DONE


def test_timeline_phases_overlap_but_never_collide_within_a_lane() -> None:
    snap = _run().snapshot_at(20.0)
    assert snap.timeline
    for lane in range(len(snap.lanes)):
        recs = sorted((r for r in snap.timeline if r.lane == lane), key=lambda r: r.batch)
        for p in range(5):
            spans = [r.phases[p] for r in recs]
            assert all(a1 <= b0 for (_, a1), (b0, _) in pairwise(spans))
        # Batches overlap: the next one fills while this one computes.
        assert any(nxt.phases[0][0] < cur.phases[2][1] for cur, nxt in pairwise(recs))
    assert all(r.end <= snap.t0 + snap.t for r in snap.timeline)


def test_figures_hang_together() -> None:
    f = _run().snapshot_at(12.0).figures
    assert 0 < f.overlap_efficiency <= 1
    assert f.serial_bound_tasks_s < f.bound_tasks_s
    assert set(f.amdahl) == {"p=3", "p=4", "p=inf"}
    assert f.amdahl["p=3"] < f.amdahl["p=4"] < f.amdahl["p=inf"]
    assert all(0 <= v <= 1 for lane in f.occupancy.values() for v in lane.values())


def test_workers_cover_online_late_and_dead() -> None:
    assert [w.state for w in _run().snapshot_at(5.0).workers] == ["online", "late", "dead"]


def test_detail_agrees_with_the_snapshot() -> None:
    run = _run()
    snap = run.snapshot_at(12.0)
    view = snap.tasks
    for row in range(0, len(view), 7):
        d = run.detail(view.key(row), snap.t)
        assert d.state == State(int(view.state[row])).name.lower()
        assert d.phase == Phase(int(view.phase[row])).name.lower()
        assert d.attempt == int(view.attempt[row])
        assert (d.stall != "none") == bool(view.stall[row])


def test_a_million_tasks_build_and_move_on() -> None:
    """How fast is benchmarks/tui.py's figure ("synthetic snapshot build, 1 M tasks", bound 50 ms)."""
    run = SyntheticRun(1_000_000)
    first = run.snapshot_at(10.0)
    later = [run.snapshot_at(10.1 + i / 10) for i in range(5)]
    assert all(len(s.tasks) == 1_000_000 for s in (first, *later))
    assert later[-1].counts.done >= first.counts.done and later[-1].seq > first.seq
