"""Which task rows stand in which board column, derived from one snapshot.

The decision this module protects: each task stands in exactly one column (a stalled task in
*stalled*, whatever its state), so the column counts add up to the tasks known, and the lists are
index arrays into the snapshot's columns, never Python objects per task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from warpdeck.engine.api import EngineSnapshot, Phase, State

__all__ = ["COLUMNS", "BoardRows", "board_rows"]

#: Column ids in board order, with their titles.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("queued", "queued"), ("fill", "fill"), ("h2d", "h2d"), ("compute", "compute"), ("d2h", "d2h"),
    ("sink", "sink"), ("stalled", "stalled"), ("finished", "done"),
)
_STALLED = 6
_FINISHED = 7


@dataclass(frozen=True, slots=True)
class BoardRows:
    """Row indices per column (filtered), and the unfiltered count per column."""

    seq: int
    rows: dict[str, npt.NDArray[np.int64]]
    totals: dict[str, int]
    failed: int
    cancelled: int


def board_rows(snap: EngineSnapshot, mask: npt.NDArray[np.bool_] | None = None) -> BoardRows:
    """Split the snapshot's tasks into the board's columns; ``mask`` (a filter) hides rows."""
    view = snap.tasks
    # Column code: 0 queued, 1..5 running phase, 6 stalled, 7 finished.
    code = np.full(len(view), _FINISHED, np.int8)
    code[view.state == State.QUEUED] = 0
    running = view.state == State.RUNNING
    code[running] = view.phase[running]
    code[(view.stall != 0) & (view.state <= State.RUNNING)] = _STALLED
    totals_arr = np.bincount(code, minlength=len(COLUMNS))
    if mask is not None:
        code = np.where(mask, code, -1)
    rows: dict[str, npt.NDArray[np.int64]] = {}
    for i, (cid, _) in enumerate(COLUMNS):
        hit = np.flatnonzero(code == i)
        if i == _FINISHED and len(hit):
            # Failed first (they want attention), then cancelled, then done, newest first.
            st = view.state[hit]
            rank = np.where(st == State.FAILED, 0, np.where(st == State.CANCELLED, 1, 2))
            hit = hit[np.lexsort((-hit, rank))]
        rows[cid] = hit
    assert Phase.SINK == 5  # the codes above rely on phase numbers 1..5 in board order
    return BoardRows(snap.seq, rows, {cid: int(totals_arr[i]) for i, (cid, _) in enumerate(COLUMNS)},
                     int((view.state == State.FAILED).sum()), int((view.state == State.CANCELLED).sum()))
