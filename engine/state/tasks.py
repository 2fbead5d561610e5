"""The task table: every task's state, phase, stall and attempts as columns.

The decision this module protects: every task is in exactly one state, and a state changes only
through the transition rules (engine/state/task_states.py, where the states, phases and stall
reasons are: import them from there), which raise on anything illegal. The table stores tasks as
columns (NumPy arrays plus one list of keys) rather than one object per task, so a million queued
tasks cost tens of megabytes instead of hundreds, and a snapshot can copy the state columns in
microseconds.

A row is a task's *current attempt*. Terminal states are final for that attempt: a retry does
not move a failed row back to queued, it starts a new attempt (the attempt counter only grows)
and the finished attempt is kept in the task's history. Attempts are numbered from 1 everywhere
(table, history, journal, report, wire): a task's first attempt is attempt 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from warpdeck.engine.state.task_states import (
    IllegalTransition,
    Phase,
    StallReason,
    State,
    check_transition,
)

__all__ = [
    "ATTEMPT_OUTCOMES",
    "AttemptOutcome",
    "TaskAttempt",
    "TaskTable",
]

AttemptOutcome = Literal["done", "failed", "cancelled", "requeued"]
"""How an attempt ended; ``requeued``: taken back without failing it (a lost worker, a resumed run)."""
ATTEMPT_OUTCOMES: tuple[AttemptOutcome, ...] = get_args(AttemptOutcome)


@dataclass(frozen=True, slots=True)
class TaskAttempt:
    """One finished attempt of a task, kept so the detail view can explain a retry."""

    attempt: int
    """The attempt's number; the first is 1."""
    outcome: AttemptOutcome
    at: float
    reason: str = ""
    traceback: str = ""
    batch: int = -1
    """The batch that carried it in this run (-1: it never reached a lane, or ran in an earlier run): the batch log
    (engine/state/batch_log.py) tells where and when it ran."""


@dataclass(slots=True)
class _Sparse:
    """Per-task data only a few tasks have (errors, tracebacks, history, stall notes)."""

    error: dict[int, str] = field(default_factory=dict)
    traceback: dict[int, str] = field(default_factory=dict)
    history: dict[int, list[TaskAttempt]] = field(default_factory=dict)
    stall_note: dict[int, str] = field(default_factory=dict)
    flag: dict[int, str] = field(default_factory=dict)


_GROW = 1.5


_STATES: tuple[State, ...] = tuple(State)
"""Each state at its value's index (``State`` counts from 0 without gaps)."""
_PHASES: tuple[Phase, ...] = tuple(Phase)
_SET_CHECK = 4096
"""Up to this many rows, a move checks them for repeats with a set rather than a sort."""


class TaskTable:
    """Columns of task state, one row per task, indices stable for the life of the run.

    Bulk operations take index arrays so the engine moves a whole batch per call; each checks
    every row's transition and raises ``IllegalTransition`` before changing anything.
    """

    def __init__(self, capacity: int = 1024, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock or time.monotonic
        self.keys: list[str] = []
        self._n = 0
        self._cap = 0
        self._sparse = _Sparse()
        self.state = np.zeros(0, np.int8)
        self.phase = np.zeros(0, np.int8)
        self.stall = np.zeros(0, np.int8)
        self.stall_since = np.zeros(0, np.float64)
        self.attempt = np.zeros(0, np.int16)
        self.batch = np.zeros(0, np.int32)
        self.t_queued = np.zeros(0, np.float64)
        self.t_end = np.zeros(0, np.float64)
        self.nbytes_in = np.zeros(0, np.int64)
        self._counts = np.zeros((len(State), len(Phase)), np.int64)
        self._reserve(capacity)

    # -- size -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    def _reserve(self, cap: int) -> None:
        if cap <= self._cap:
            return
        for name in ("state", "phase", "stall", "stall_since", "attempt", "batch", "t_queued",
                     "t_end", "nbytes_in"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: self._n] = old[: self._n]
            setattr(self, name, new)
        self.batch[self._n:] = -1
        self._cap = cap

    def add(self, keys: Sequence[str], nbytes: int | Sequence[int] = 0) -> npt.NDArray[np.int64]:
        """Append queued tasks; returns their indices."""
        n = len(keys)
        if self._n + n > self._cap:
            self._reserve(max(int(self._cap * _GROW), self._n + n))
        lo, hi = self._n, self._n + n
        self.keys.extend(keys)
        self.state[lo:hi] = State.QUEUED
        self.phase[lo:hi] = Phase.NONE
        self.attempt[lo:hi] = 1
        self.t_queued[lo:hi] = self._clock()
        self.nbytes_in[lo:hi] = nbytes
        self._n = hi
        self._counts[State.QUEUED, Phase.NONE] += n
        return np.arange(lo, hi, dtype=np.int64)

    # -- reads ----------------------------------------------------------------------------------
    def counts(self) -> npt.NDArray[np.int64]:
        """(state, phase) count matrix, kept incrementally; a copy."""
        return self._counts.copy()

    def state_of(self, i: int) -> State:
        return State(int(self.state[i]))

    def phase_of(self, i: int) -> Phase:
        return Phase(int(self.phase[i]))

    def error(self, i: int) -> str:
        return self._sparse.error.get(i, "")

    def traceback(self, i: int) -> str:
        return self._sparse.traceback.get(i, "")

    def history(self, i: int) -> tuple[TaskAttempt, ...]:
        return tuple(self._sparse.history.get(i, ()))

    def stall_note(self, i: int) -> str:
        return self._sparse.stall_note.get(i, "")

    def flag(self, i: int) -> str:
        return self._sparse.flag.get(i, "")

    def flags(self) -> dict[int, str]:
        """Notes on tasks that finished but whose output is suspect (non-finite values, say)."""
        return dict(self._sparse.flag)

    def errors(self) -> dict[int, str]:
        """Errors of every task that has one (failed tasks and failed earlier attempts)."""
        return dict(self._sparse.error)

    # -- transitions ----------------------------------------------------------------------------
    def _check(self, idx: npt.NDArray[np.int64], to_state: State,
               to_phase: Phase) -> tuple[list[int], list[int]]:
        """Refuse an illegal move; the distinct (state, phase) codes of ``idx`` and their counts."""
        st = self.state[idx]
        ph = self.phase[idx]
        code = st.astype(np.int16) * 16 + ph
        first = int(code[0])
        if (code == first).all():  # rows of one batch share state and phase: no sort (see _move)
            listed, counts = [first], [len(idx)]
        else:
            codes, n = np.unique(code, return_counts=True)
            listed, counts = codes.tolist(), n.tolist()
        for c in listed:
            s, p = State(c // 16), Phase(c % 16)
            if not check_transition(s, p, to_state, to_phase):
                bad = int(idx[(st == s) & (ph == p)][0])
                raise IllegalTransition(self.keys[bad], s, p, to_state, to_phase)
        return listed, counts

    def _move(self, idx: npt.NDArray[np.int64], to_state: State, to_phase: Phase) -> npt.NDArray[np.int64]:
        # This runs on the event loop several times per batch. NumPy's sort (np.unique) lets go of
        # the GIL, and taking it back waits for whichever host thread runs Python meanwhile (up to
        # the 5 ms switch interval): a batch's distinct rows are checked with a set instead.
        if len(idx) == 1:  # a batch of one: no array machinery (engine overhead at batch 1)
            i = int(idx[0])
            s, p = _STATES[self.state[i]], _PHASES[self.phase[i]]  # a tuple lookup: Enum(value) costs ~1 us
            if not check_transition(s, p, to_state, to_phase):
                raise IllegalTransition(self.keys[i], s, p, to_state, to_phase)
            self._counts[s, p] -= 1
            self._counts[to_state, to_phase] += 1
            self.state[i] = to_state
            self.phase[i] = to_phase
            return idx
        if len(idx) == 0:
            return idx
        # A row named twice in one call moves once; counts follow the columns, not the call.
        if len(idx) > _SET_CHECK or len(set(idx.tolist())) != len(idx):
            idx = np.unique(idx)
        codes, n = self._check(idx, to_state, to_phase)
        for code, k in zip(codes, n, strict=True):
            self._counts[code // 16, code % 16] -= k
        self._counts[to_state, to_phase] += len(idx)
        self.state[idx] = to_state
        self.phase[idx] = to_phase
        return idx

    def start(self, idx: npt.NDArray[np.int64], batch_id: int) -> None:
        """Queued -> running/fill, as one batch."""
        idx = self._move(idx, State.RUNNING, Phase.FILL)
        self.batch[idx] = batch_id
        self._clear_stall(idx)

    def advance(self, idx: npt.NDArray[np.int64], phase: Phase) -> None:
        """Running/phase-1 -> running/phase."""
        self._move(idx, State.RUNNING, phase)

    def finish(self, idx: npt.NDArray[np.int64]) -> None:
        """Running/sink -> done."""
        idx = self._move(idx, State.DONE, Phase.NONE)
        self.t_end[idx] = self._clock()
        self._clear_stall(idx)

    def fail(self, idx: npt.NDArray[np.int64], reason: str, tb: str = "") -> None:
        """Queued or running -> failed, keeping the reason and traceback."""
        idx = self._move(idx, State.FAILED, Phase.NONE)
        self.t_end[idx] = self._clock()
        self._clear_stall(idx)
        for i in idx.tolist():
            self._sparse.error[i] = reason
            if tb:
                self._sparse.traceback[i] = tb

    def cancel(self, idx: npt.NDArray[np.int64], reason: str = "cancelled") -> None:
        """Queued or running -> cancelled."""
        idx = self._move(idx, State.CANCELLED, Phase.NONE)
        self.t_end[idx] = self._clock()
        self._clear_stall(idx)
        for i in idx.tolist():
            self._sparse.error[i] = reason

    def new_attempt(self, idx: npt.NDArray[np.int64], outcome: AttemptOutcome, reason: str = "", tb: str = "") -> None:
        """Close each task's current attempt with ``outcome`` and queue a fresh one.

        Allowed from running (a failed batch retried by policy, a lost worker's lease requeued)
        and from failed or cancelled (an operator's retry). Done tasks are never re-run.
        """
        if outcome not in ATTEMPT_OUTCOMES:
            raise ValueError(f"unknown attempt outcome {outcome!r}")
        idx = np.unique(idx)
        st = self.state[idx]
        if np.any((st == State.DONE) | (st == State.QUEUED)):
            bad = int(idx[(st == State.DONE) | (st == State.QUEUED)][0])
            raise IllegalTransition(self.keys[bad], self.state_of(bad), self.phase_of(bad), State.QUEUED, Phase.NONE)
        now = self._clock()
        np.subtract.at(self._counts, (st, self.phase[idx]), 1)
        self._counts[State.QUEUED, Phase.NONE] += len(idx)
        for i in idx.tolist():
            self._sparse.history.setdefault(i, []).append(
                TaskAttempt(int(self.attempt[i]), outcome, now, reason or self._sparse.error.get(i, ""),
                            tb or self._sparse.traceback.get(i, ""), int(self.batch[i])))
            if reason:
                self._sparse.error[i] = reason
            if tb:
                self._sparse.traceback[i] = tb
        self.state[idx] = State.QUEUED
        self.phase[idx] = Phase.NONE
        self.attempt[idx] += 1
        self.batch[idx] = -1
        self.t_end[idx] = 0.0
        self._clear_stall(idx)

    def restore(self, i: int, attempt: int, history: Sequence[TaskAttempt], error: str = "", tb: str = "") -> None:
        """Give a queued row the attempts a journal recorded for its task (a resumed run), so the
        attempt counter keeps growing across runs and the history explains earlier ones."""
        if self.state[i] != State.QUEUED or attempt < self.attempt[i]:
            raise IllegalTransition(self.keys[i], self.state_of(i), self.phase_of(i), State.QUEUED, Phase.NONE)
        self.attempt[i] = attempt
        if history:
            self._sparse.history[i] = list(history)
        if error:
            self._sparse.error[i] = error
        if tb:
            self._sparse.traceback[i] = tb

    def set_flag(self, idx: npt.NDArray[np.int64], note: str) -> None:
        """Attach a note to tasks that are done but whose output is suspect."""
        for i in idx.tolist():
            self._sparse.flag[i] = note

    # -- stalls ---------------------------------------------------------------------------------
    def set_stall(self, idx: npt.NDArray[np.int64], reason: StallReason, note: str = "") -> None:
        """Mark non-terminal tasks stalled; the since-time is kept if the reason is unchanged."""
        if reason is StallReason.NONE:
            self._clear_stall(idx)
            return
        if len(idx) == 0:
            return
        st = self.state[idx]
        if np.any(st >= State.DONE):
            bad = int(idx[st >= State.DONE][0])
            raise IllegalTransition(self.keys[bad], self.state_of(bad), self.phase_of(bad),
                                    self.state_of(bad), self.phase_of(bad))
        changed = idx[self.stall[idx] != reason]
        self.stall[changed] = reason
        self.stall_since[changed] = self._clock()
        if note:
            for i in changed.tolist():
                self._sparse.stall_note[i] = note

    def _clear_stall(self, idx: npt.NDArray[np.int64]) -> None:
        self.stall[idx] = StallReason.NONE
        if self._sparse.stall_note:
            for i in idx.tolist():
                self._sparse.stall_note.pop(i, None)

    def clear_stall(self, idx: npt.NDArray[np.int64]) -> None:
        """Remove any stall condition from these tasks."""
        self._clear_stall(idx)

    def indices(self, state: State | None = None, phase: Phase | None = None,
                stalled: bool | None = None) -> npt.NDArray[np.int64]:
        """Indices of tasks matching every given condition, in table order."""
        n = self._n
        mask = np.ones(n, bool)
        if state is not None:
            mask &= self.state[:n] == state
        if phase is not None:
            mask &= self.phase[:n] == phase
        if stalled is not None:
            mask &= (self.stall[:n] != 0) == stalled
        return np.flatnonzero(mask)

    def of(self, keys: Iterable[str]) -> npt.NDArray[np.int64]:
        """Indices of the given keys (linear scan; for commands, not hot paths)."""
        wanted = set(keys)
        return np.array([i for i, k in enumerate(self.keys) if k in wanted], np.int64)
