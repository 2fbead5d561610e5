"""The task table that shadows itself in the journal.

The decision this module protects: the journal is never a second source of truth. Each transition
is recorded after the table accepted it, so an illegal move never reaches the disk; hot
transitions (admit, start, done) record one array of rows per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.journal import Journal
from warpdeck.engine.state.task_states import State
from warpdeck.engine.state.tasks import AttemptOutcome, TaskTable

__all__ = ["JournaledTable"]


class JournaledTable(TaskTable):
    """A task table that records each accepted transition in ``journal`` (when one is attached).

    Hot transitions (admit, start, done) record one array of rows per call; rare ones (fail,
    cancel, new attempt) record keys and reasons, looked up per row.
    """

    journal: Journal | None = None

    def attach(self, journal: Journal) -> None:
        """Start recording into ``journal``."""
        journal.attach(self.keys)
        self.journal = journal

    def add(self, keys: Sequence[str], nbytes: int | Sequence[int] = 0) -> npt.NDArray[np.int64]:
        idx = super().add(keys, nbytes)
        if self.journal is not None:
            self.journal.admitted(idx)
        return idx

    def start(self, idx: npt.NDArray[np.int64], batch_id: int) -> None:
        super().start(idx, batch_id)
        if self.journal is not None:
            self.journal.started(idx.copy(), batch_id, self.attempt[idx])

    def finish(self, idx: npt.NDArray[np.int64]) -> None:
        super().finish(idx)
        if self.journal is not None and len(idx):
            self.journal.finished(idx.copy())

    def fail(self, idx: npt.NDArray[np.int64], reason: str, tb: str = "") -> None:
        super().fail(idx, reason, tb)
        self._ended(idx, State.FAILED)

    def cancel(self, idx: npt.NDArray[np.int64], reason: str = "cancelled") -> None:
        super().cancel(idx, reason)
        self._ended(idx, State.CANCELLED)

    def _ended(self, idx: npt.NDArray[np.int64], state: State) -> None:
        if self.journal is None or len(idx) == 0:
            return
        rows = np.unique(idx).tolist()
        self.journal.ended([self.keys[r] for r in rows], state, [self.error(r) for r in rows],
                           [self.traceback(r) for r in rows])

    def new_attempt(self, idx: npt.NDArray[np.int64], outcome: AttemptOutcome, reason: str = "", tb: str = "") -> None:
        super().new_attempt(idx, outcome, reason, tb)
        if self.journal is not None and len(idx):
            rows = np.unique(idx).tolist()
            self.journal.requeued([self.keys[r] for r in rows], [int(self.attempt[r]) for r in rows],
                                  [self.history(r)[-1] for r in rows])
