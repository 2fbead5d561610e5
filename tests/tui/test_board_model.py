"""board_rows puts each task in the column its state, phase and stall say, in the order the board
lists them, whatever the mix: checked against a plain, per-row reading of the rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest
from wd_synthetic import SyntheticRun

from warpdeck.engine.api import EngineSnapshot, State, TaskView
from warpdeck.tui.board_model import COLUMNS, COMPACT_COLUMNS, PHASE_COLUMNS, board_rows
from warpdeck.tui.filtering import TaskFilter


def _column(state: int, phase: int, stall: int) -> str | None:
    """The board's rules, one task at a time (DESIGN.md section 8)."""
    if stall and state in (State.QUEUED, State.RUNNING):
        return "stalled"
    if state == State.QUEUED or (state == State.RUNNING and phase == 0):
        return "queued"
    if state == State.RUNNING:
        return COLUMNS[phase][0] if phase <= 5 else None
    return "finished"


def _expected(snap: EngineSnapshot, mask: npt.NDArray[np.bool_] | None) -> tuple[dict[str, list[int]],
                                                                                    dict[str, int]]:
    view = snap.tasks
    rows: dict[str, list[int]] = {cid: [] for cid, _ in COLUMNS}
    totals = dict.fromkeys(rows, 0)
    for r, (state, phase, stall) in enumerate(zip(view.state.tolist(), view.phase.tolist(), view.stall.tolist(),
                                                  strict=True)):
        cid = _column(state, phase, stall)
        if cid is None:
            continue
        totals[cid] += 1
        if mask is None or mask[r]:
            rows[cid].append(r)
    # Finished: failed first, then cancelled, then the rest; newest (highest row) first in each.
    rank = {int(State.FAILED): 0, int(State.CANCELLED): 1}
    rows["finished"].sort(key=lambda r: (rank.get(int(view.state[r]), 2), -r))
    return rows, totals


def _random_snapshot(seed: int, n: int = 4000) -> EngineSnapshot:
    rng = np.random.default_rng(seed)
    base = SyntheticRun(n, seed=seed).snapshot_at(3.0)
    state = rng.integers(0, 5, n).astype(np.int8)
    phase = np.where(state == State.RUNNING, rng.integers(0, 6, n), 0).astype(np.int8)
    stall = np.where(rng.random(n) < 0.2, rng.integers(1, 6, n), 0).astype(np.int8)
    view = TaskView(base.tasks.keys, state, phase, stall, base.tasks.attempt)
    return dataclasses.replace(base, tasks=view)


SNAPSHOTS = [
    *(SyntheticRun(3000, seed=2, transitions_per_s=600, stalled_every=17, failed_every=23, batch=8).snapshot_at(t)
      for t in (0.0, 0.7, 3.0, 12.0, 1000.0)),
    *(_random_snapshot(seed) for seed in range(4)),
]


@pytest.mark.parametrize("snap", SNAPSHOTS, ids=lambda s: f"seq{s.seq}-{len(s.tasks)}")
@pytest.mark.parametrize("text", ["", "stall:any", "state:failed", "img-00001", "!phase:compute"])
def test_rows_and_totals_follow_the_rules(snap: EngineSnapshot, text: str) -> None:
    mask = TaskFilter(text).mask(snap.tasks) if text else None
    board = board_rows(snap, mask)
    rows, totals = _expected(snap, mask)
    assert {cid: r.tolist() for cid, r in board.rows.items()} == rows
    assert board.totals == totals
    assert board.failed == int(np.count_nonzero(snap.tasks.state == State.FAILED))
    assert board.cancelled == int(np.count_nonzero(snap.tasks.state == State.CANCELLED))


def test_tables_of_different_sizes_in_turn() -> None:
    # The work arrays are kept between calls; a table of another length must not reuse them wrongly.
    small, big = SNAPSHOTS[0], _random_snapshot(9, n=7000)
    for snap in (small, big, small):
        assert {cid: r.tolist() for cid, r in board_rows(snap).rows.items()} == _expected(snap, None)[0]


@pytest.mark.parametrize("snap", SNAPSHOTS, ids=lambda s: f"seq{s.seq}-{len(s.tasks)}")
def test_the_compact_layout_puts_each_task_in_one_column_too(snap: EngineSnapshot) -> None:
    board = board_rows(snap)
    running, total = board.column("running")
    assert running.tolist() == [r for p in PHASE_COLUMNS for r in board.rows[p].tolist()]
    assert total == sum(board.totals[p] for p in PHASE_COLUMNS)
    assert sum(board.column(cid)[1] for cid, _ in COMPACT_COLUMNS) == sum(board.totals.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_telemetry_samples_each_column_by_the_same_rule_as_the_board(seed: int) -> None:
    # An attached control room draws its board from telemetry's column samples: they must hold the
    # tasks the board would put there (the first 200 of live columns, the last 200 of finished ones).
    from warpdeck.engine.control.compact import expand_keys
    from warpdeck.engine.control.telemetry import COLUMN_SAMPLE, summarize

    snap = _random_snapshot(seed)
    tel = summarize(snap, 0.0)
    rows, _ = _expected(snap, None)
    keys = snap.tasks.keys
    for cid in ("queued", *PHASE_COLUMNS, "stalled"):
        assert expand_keys(tel.columns[cid]) == [keys[r] for r in sorted(rows[cid])[:COLUMN_SAMPLE]], cid
    view = snap.tasks
    for cid, state in (("done", State.DONE), ("failed", State.FAILED), ("cancelled", State.CANCELLED)):
        finished = [r for r in sorted(rows["finished"]) if int(view.state[r]) == state]
        assert expand_keys(tel.columns[cid]) == [keys[r] for r in finished[-COLUMN_SAMPLE:]], cid


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("text", ["", "stall:any"])
def test_an_attached_board_counts_every_task_not_the_sample(seed: int, text: str) -> None:
    # Telemetry carries a few keys per column; the titles must still say how many tasks each column
    # holds in the engine, as the board at home would (and, under a filter, what the sample shows).
    from warpdeck.engine.control.telemetry import snapshot_from, summarize
    from warpdeck.engine.control.wire import decode, encode_telemetry

    snap = _random_snapshot(seed, n=20_000)
    home = board_rows(snap)
    tel = decode(encode_telemetry(summarize(snap, 0.0)))
    away = snapshot_from(tel)  # type: ignore[arg-type]
    assert len(away.tasks) < len(snap.tasks) // 4  # a sample
    mask = TaskFilter(text).mask(away.tasks) if text else None
    board = board_rows(away, mask)
    assert board.sampled and board.totals == home.totals
    assert (board.failed, board.cancelled) == (home.failed, home.cancelled)
    for cid, _ in (*COLUMNS, *COMPACT_COLUMNS):
        rows, total = board.column(cid)
        assert total == home.column(cid)[1], cid
        assert board.shown(cid, rows) == (len(rows) if text else total), cid
