"""Which task rows stand in which board column, derived from one snapshot.

The decision this module protects: each task stands in exactly one column (the engine's rule,
``engine/state/board_columns.py``, which telemetry's column samples follow too), so the column counts
add up to the tasks known, and the lists are index arrays into the snapshot's columns, never
Python objects per task.

The compact layout (``COMPACT_COLUMNS``, for terminals too narrow for eight readable columns)
keeps that rule: its *running* column is the five phase columns joined, in board order, so a
task still stands in one column of either layout.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from warpdeck.engine.api import (
    CANCELLED,
    COLUMN_CODES,
    DONE,
    FAILED,
    NOWHERE,
    STALLED,
    EngineSnapshot,
    State,
)

__all__ = ["COLUMNS", "COMPACT_COLUMNS", "PHASE_COLUMNS", "BoardRows", "board_rows"]

COLUMNS: tuple[tuple[str, str], ...] = (
    ("queued", "queued"), ("fill", "fill"), ("h2d", "h2d"), ("compute", "compute"), ("d2h", "d2h"),
    ("sink", "sink"), ("stalled", "stalled"), ("finished", "done"),
)
"""Column ids in board order, with their titles."""
PHASE_COLUMNS: tuple[str, ...] = ("fill", "h2d", "compute", "d2h", "sink")
"""The running phases' columns, in board order."""
COMPACT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("queued", "queued"), ("running", "running"), ("stalled", "stalled"), ("finished", "done"),
)
"""The compact layout: the phase columns joined into *running* (each row's glyph still says its phase)."""
class _Scratch(threading.local):
    """Work arrays for one table length, reused across snapshots: a fresh megabyte array per step
    costs more in page faults than the step itself."""

    def __init__(self) -> None:
        self.size = -1
        self.code = self.spare = np.zeros(0, np.uint8)
        self.hit = np.zeros(0, np.bool_)

    def fit(self, size: int) -> None:
        if size != self.size:
            self.size = size
            self.code, self.spare = np.empty(size, np.uint8), np.empty(size, np.uint8)
            self.hit = np.empty(size, np.bool_)


_scratch = _Scratch()


@dataclass(frozen=True, slots=True)
class BoardRows:
    """Row indices per column (filtered), and the unfiltered count per column."""

    seq: int
    rows: dict[str, npt.NDArray[np.int64]]
    totals: dict[str, int]
    failed: int
    cancelled: int
    sampled: bool = False
    """The rows are a sample (an attached room's) and ``totals`` the columns' real sizes: a title shows the size, not
    the sample's length, unless a filter hides rows."""
    filtered: bool = False

    def shown(self, cid: str, rows: npt.NDArray[np.int64]) -> int:
        """How many of column ``cid``'s tasks its title says are shown (``rows``: its rows)."""
        return self.column(cid)[1] if self.sampled and not self.filtered else len(rows)

    def failed_cancelled(self, snap: EngineSnapshot, rows: npt.NDArray[np.int64]) -> tuple[int, int]:
        """How many of the finished column's shown ``rows`` failed and were cancelled (a filter's
        rows are counted; unfiltered, or sampled, they are the column's own counts)."""
        if not self.filtered:
            return self.failed, self.cancelled
        state = snap.tasks.state[rows]
        return int(np.count_nonzero(state == int(State.FAILED))), int(np.count_nonzero(state == int(State.CANCELLED)))

    def column(self, cid: str) -> tuple[npt.NDArray[np.int64], int]:
        """A column's rows and unfiltered count, for either layout's columns: *running* is the
        phase columns' rows one after the other (a few lanes' batches, so joining them is cheap)."""
        if cid != "running":
            return self.rows[cid], self.totals[cid]
        return (np.concatenate([self.rows[p] for p in PHASE_COLUMNS]),
                sum(self.totals[p] for p in PHASE_COLUMNS))


def board_rows(snap: EngineSnapshot, mask: npt.NDArray[np.bool_] | None = None) -> BoardRows:
    """Split the snapshot's tasks into the board's columns; ``mask`` (a filter) hides rows.

    This runs on the UI loop for every snapshot the board shows, over up to a million rows: one
    table lookup gives each row its column code, written into reused work arrays, then one scan
    per big column; the few running and stalled rows are split among their columns from their
    own, short list."""
    view = snap.tasks
    work = _scratch
    work.fit(len(view))
    code, spare, hit = work.code, work.spare, work.hit
    np.left_shift(view.state.view(np.uint8), 3, out=code)
    np.bitwise_and(code, 0x3F, out=code)
    np.bitwise_or(code, view.phase.view(np.uint8) & 7, out=code)
    np.not_equal(view.stall, 0, out=hit)
    np.left_shift(hit.view(np.uint8), 6, out=spare)
    np.bitwise_or(code, spare, out=code)
    np.take(COLUMN_CODES, code, out=code)

    def rows_of(c: int) -> npt.NDArray[np.int64]:
        return np.flatnonzero(np.equal(code, c, out=hit))

    totals: dict[str, int] = {}
    if mask is not None:  # the titles count the unfiltered column, so count before hiding rows
        for c, (cid, _) in enumerate(COLUMNS[:STALLED + 1]):
            totals[cid] = int(np.count_nonzero(np.equal(code, c, out=hit)))
        np.subtract(code, FAILED, out=spare)  # 7, 8, 9 -> 0, 1, 2; below 7 wraps past 2
        totals["finished"] = int(np.count_nonzero(np.less_equal(spare, DONE - FAILED, out=hit)))
        np.copyto(code, NOWHERE, where=~mask)
    rows: dict[str, npt.NDArray[np.int64]] = {"queued": rows_of(0)}
    # Running and stalled tasks are a few lanes' batches: find them in one scan, then split them.
    np.subtract(code, 1, out=spare)  # 0 (queued) wraps to 255
    few = np.flatnonzero(np.less_equal(spare, STALLED - 1, out=hit))
    few_code = code[few]
    for c, (cid, _) in enumerate(COLUMNS[1:STALLED + 1], start=1):
        rows[cid] = few[few_code == c]
    ranked = [rows_of(c) for c in (FAILED, CANCELLED, DONE)]
    rows["finished"] = np.concatenate([r[::-1] for r in ranked])  # newest first in each rank
    if mask is None:
        totals = {cid: len(rows[cid]) for cid, _ in COLUMNS}
        failed, cancelled = len(ranked[0]), len(ranked[1])
    else:
        failed = int(np.count_nonzero(view.state == int(State.FAILED)))
        cancelled = int(np.count_nonzero(view.state == int(State.CANCELLED)))
    sizes = snap.column_totals
    if sizes is None:
        return BoardRows(snap.seq, rows, totals, failed, cancelled, filtered=mask is not None)
    # A sampled table (telemetry's): the titles count every task, from the engine's column sizes.
    real = {cid: sizes.get(cid, totals[cid]) for cid, _ in COLUMNS[:STALLED + 1]}
    failed, cancelled = sizes.get("failed", failed), sizes.get("cancelled", cancelled)
    real["finished"] = sizes.get("done", 0) + failed + cancelled
    return BoardRows(snap.seq, rows, real, failed, cancelled, sampled=True, filtered=mask is not None)
