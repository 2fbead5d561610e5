"""The task table and its transition rules (engine/state/tasks.py).

The legality oracle below is written from ``check_transition``'s docstring, not from its code, so
the parametrized table compares the implementation against the written rules.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import get_args

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from warpdeck.engine.state.task_states import (
    IllegalTransition,
    Phase,
    PhaseName,
    StallName,
    StallReason,
    State,
    StateName,
    check_transition,
)
from warpdeck.engine.state.tasks import ATTEMPT_OUTCOMES, AttemptOutcome, TaskTable


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


# -- the written rules, independently ---------------------------------------------------------------
_CHAIN = [Phase.FILL, Phase.H2D, Phase.COMPUTE, Phase.D2H, Phase.SINK]


def rule_says_legal(state: State, phase: Phase, to_state: State, to_phase: Phase) -> bool:
    """The docstring of check_transition, spelled out move by move."""
    if state in (State.DONE, State.FAILED, State.CANCELLED):
        return False  # "Terminal states go nowhere."
    if to_state is State.RUNNING:
        if state is State.QUEUED:
            return to_phase is Phase.FILL  # "queued -> running/fill"
        # "running phases advance one step at a time (fill -> h2d -> compute -> d2h -> sink)"
        return phase in _CHAIN[:-1] and to_phase is _CHAIN[_CHAIN.index(phase) + 1]
    if to_phase is not Phase.NONE:
        return False  # Phase NONE is the phase of every task that is not running.
    if to_state is State.DONE:
        return state is State.RUNNING and phase is Phase.SINK  # "running/sink -> done"
    # "queued or running -> failed or cancelled"; back to queued is a new attempt, never a transition
    return to_state in (State.FAILED, State.CANCELLED)


_ALL = list(itertools.product(State, Phase, State, Phase))


@pytest.mark.parametrize(("state", "phase", "to_state", "to_phase"), _ALL,
                         ids=[f"{a.name}/{b.name}->{c.name}/{d.name}" for a, b, c, d in _ALL])
def test_check_transition_matches_the_documented_rules(state: State, phase: Phase, to_state: State,
                                                        to_phase: Phase) -> None:
    assert check_transition(state, phase, to_state, to_phase) is rule_says_legal(state, phase, to_state, to_phase)


def test_documented_rules_allow_exactly_the_happy_path_moves_from_valid_states() -> None:
    # Guards the oracle itself: from the states a task can really be in, these are all the legal moves.
    valid_from = [(State.QUEUED, Phase.NONE)] + [(State.RUNNING, p) for p in _CHAIN]
    legal = {(s, p, ts, tp) for s, p in valid_from for ts in State for tp in Phase if rule_says_legal(s, p, ts, tp)}
    assert legal == {
        (State.QUEUED, Phase.NONE, State.RUNNING, Phase.FILL),
        (State.QUEUED, Phase.NONE, State.FAILED, Phase.NONE),
        (State.QUEUED, Phase.NONE, State.CANCELLED, Phase.NONE),
        (State.RUNNING, Phase.FILL, State.RUNNING, Phase.H2D),
        (State.RUNNING, Phase.H2D, State.RUNNING, Phase.COMPUTE),
        (State.RUNNING, Phase.COMPUTE, State.RUNNING, Phase.D2H),
        (State.RUNNING, Phase.D2H, State.RUNNING, Phase.SINK),
        (State.RUNNING, Phase.SINK, State.DONE, Phase.NONE),
        *((State.RUNNING, p, State.FAILED, Phase.NONE) for p in _CHAIN),
        *((State.RUNNING, p, State.CANCELLED, Phase.NONE) for p in _CHAIN),
    }


# -- helpers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("members", "names"), [(State, StateName), (Phase, PhaseName), (StallReason, StallName)],
                         ids=["state", "phase", "stall"])
def test_each_member_is_spelt_by_its_literal_in_member_order(members: type[State], names: object) -> None:
    assert [m.label for m in members] == [m.name.lower() for m in members] == list(get_args(names))


def test_attempt_outcomes_keep_the_names_journals_hold() -> None:
    assert ATTEMPT_OUTCOMES == get_args(AttemptOutcome) == ("done", "failed", "cancelled", "requeued")


def rows(*i: int) -> np.ndarray:
    return np.array(i, np.int64)


def recount(t: TaskTable) -> np.ndarray:
    n = len(t)
    out = np.zeros((len(State), len(Phase)), np.int64)
    np.add.at(out, (t.state[:n].astype(np.int64), t.phase[:n].astype(np.int64)), 1)
    return out


def columns(t: TaskTable) -> dict[str, object]:
    n = len(t)
    return {"state": t.state[:n].copy(), "phase": t.phase[:n].copy(), "attempt": t.attempt[:n].copy(),
            "stall": t.stall[:n].copy(), "batch": t.batch[:n].copy(), "counts": t.counts(),
            "history": [t.history(i) for i in range(n)], "errors": t.errors()}


def assert_same_columns(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for k, value in a.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, b[k], err_msg=k)
        else:
            assert value == b[k], k


def run_to(t: TaskTable, idx: np.ndarray, phase: Phase, batch_id: int = 0) -> None:
    t.start(idx, batch_id)
    for p in _CHAIN[1:_CHAIN.index(phase) + 1]:
        t.advance(idx, p)


# -- adding ---------------------------------------------------------------------------------------
def test_add_puts_new_tasks_in_queued_with_phase_none() -> None:
    t = TaskTable()
    idx = t.add(["a", "b", "c"])
    np.testing.assert_array_equal(idx, [0, 1, 2])
    expected = np.zeros((len(State), len(Phase)), np.int64)
    expected[State.QUEUED, Phase.NONE] = 3
    np.testing.assert_array_equal(t.counts(), expected)
    assert [t.state_of(i) for i in range(3)] == [State.QUEUED] * 3
    assert t.keys == ["a", "b", "c"]


def test_add_past_capacity_keeps_earlier_rows_and_unassigned_batch() -> None:
    t = TaskTable(capacity=2)
    t.add(["a", "b"])
    run_to(t, rows(0), Phase.H2D, batch_id=7)
    t.add(["c", "d", "e"])
    assert len(t) == 5
    assert (t.state_of(0), t.phase_of(0), int(t.batch[0])) == (State.RUNNING, Phase.H2D, 7)
    np.testing.assert_array_equal(t.batch[1:5], [-1, -1, -1, -1])
    np.testing.assert_array_equal(t.counts(), recount(t))


def test_add_stamps_queue_time_from_the_clock() -> None:
    clock = FakeClock(5.0)
    t = TaskTable(clock=clock)
    t.add(["a"])
    clock.t = 9.0
    t.add(["b"])
    np.testing.assert_array_equal(t.t_queued[:2], [5.0, 9.0])


# -- the happy path ------------------------------------------------------------------------------
def test_start_advance_finish_moves_a_batch_through_every_phase_to_done() -> None:
    clock = FakeClock(1.0)
    t = TaskTable(clock=clock)
    t.add(["a", "b", "c"])
    batch = rows(0, 2)
    t.start(batch, batch_id=4)
    assert int(t.counts()[State.RUNNING, Phase.FILL]) == 2
    np.testing.assert_array_equal(t.batch[:3], [4, -1, 4])
    for p in _CHAIN[1:]:
        t.advance(batch, p)
        assert int(t.counts()[State.RUNNING, p]) == 2
        assert int(t.counts()[State.RUNNING].sum()) == 2
    clock.t = 3.5
    t.finish(batch)
    c = t.counts()
    assert int(c[State.DONE, Phase.NONE]) == 2
    assert int(c[State.QUEUED, Phase.NONE]) == 1
    assert int(c[State.RUNNING].sum()) == 0
    assert [t.state_of(i) for i in range(3)] == [State.DONE, State.QUEUED, State.DONE]
    np.testing.assert_array_equal(t.t_end[[0, 2]], [3.5, 3.5])


def test_fail_keeps_reason_and_traceback() -> None:
    t = TaskTable()
    t.add(["a", "b"])
    t.start(rows(0, 1), 0)
    t.fail(rows(1), "compute: boom", "Traceback: boom")
    assert t.state_of(1) is State.FAILED
    assert (t.error(1), t.traceback(1)) == ("compute: boom", "Traceback: boom")
    assert t.errors() == {1: "compute: boom"}
    assert t.state_of(0) is State.RUNNING


def test_cancel_from_queued_records_the_reason() -> None:
    t = TaskTable()
    t.add(["a"])
    t.cancel(rows(0), "cancelled by operator")
    assert t.state_of(0) is State.CANCELLED
    assert t.error(0) == "cancelled by operator"


# -- illegal moves ---------------------------------------------------------------------------------
def test_a_batch_with_one_illegal_row_raises_and_changes_no_row() -> None:
    t = TaskTable()
    t.add(["a", "b", "c"])
    t.start(rows(1), 0)  # b is running/fill: starting it again is illegal
    before = columns(t)
    with pytest.raises(IllegalTransition) as info:
        t.start(rows(0, 1, 2), 1)
    assert info.value.key == "b"
    assert (info.value.state, info.value.phase) == (State.RUNNING, Phase.FILL)
    assert (info.value.to_state, info.value.to_phase) == (State.RUNNING, Phase.FILL)
    assert_same_columns(before, columns(t))


def test_skipping_a_phase_raises_and_changes_nothing() -> None:
    t = TaskTable()
    t.add(["a"])
    t.start(rows(0), 0)
    before = columns(t)
    with pytest.raises(IllegalTransition, match=r"running/fill -> running/compute"):
        t.advance(rows(0), Phase.COMPUTE)
    assert_same_columns(before, columns(t))


def test_finish_before_the_sink_phase_raises() -> None:
    t = TaskTable()
    t.add(["a"])
    run_to(t, rows(0), Phase.D2H)
    with pytest.raises(IllegalTransition):
        t.finish(rows(0))
    assert (t.state_of(0), t.phase_of(0)) == (State.RUNNING, Phase.D2H)


def test_failed_task_cannot_advance() -> None:
    t = TaskTable()
    t.add(["a"])
    t.start(rows(0), 0)
    t.fail(rows(0), "fill: bad input")
    before = columns(t)
    with pytest.raises(IllegalTransition):
        t.advance(rows(0), Phase.H2D)
    assert_same_columns(before, columns(t))


@pytest.mark.parametrize("terminal", ["done", "failed", "cancelled"])
@pytest.mark.parametrize("move", ["start", "fail", "cancel", "finish"])
def test_terminal_states_are_final(terminal: str, move: str) -> None:
    t = TaskTable()
    t.add(["a"])
    run_to(t, rows(0), Phase.SINK)
    {"done": lambda: t.finish(rows(0)), "failed": lambda: t.fail(rows(0), "x"),
     "cancelled": lambda: t.cancel(rows(0))}[terminal]()
    before = columns(t)
    with pytest.raises(IllegalTransition):
        {"start": lambda: t.start(rows(0), 1), "fail": lambda: t.fail(rows(0), "again"),
         "cancel": lambda: t.cancel(rows(0)), "finish": lambda: t.finish(rows(0))}[move]()
    assert_same_columns(before, columns(t))


# -- new attempts ---------------------------------------------------------------------------------
def test_new_attempt_from_running_requeues_with_a_higher_attempt_and_history() -> None:
    clock = FakeClock(2.0)
    t = TaskTable(clock=clock)
    t.add(["a", "b"])
    run_to(t, rows(0, 1), Phase.COMPUTE, batch_id=3)
    t.set_stall(rows(0), StallReason.HUNG, "deadline passed")
    clock.t = 6.0
    t.new_attempt(rows(0), "requeued", "worker lost", "tb-0")
    assert (t.state_of(0), t.phase_of(0)) == (State.QUEUED, Phase.NONE)
    assert int(t.attempt[0]) == 2  # attempts are numbered from 1
    assert int(t.attempt[1]) == 1
    assert int(t.batch[0]) == -1
    assert int(t.stall[0]) == StallReason.NONE
    (h,) = t.history(0)
    assert (h.attempt, h.outcome, h.at, h.reason, h.traceback) == (1, "requeued", 6.0, "worker lost", "tb-0")
    np.testing.assert_array_equal(t.counts(), recount(t))


def test_new_attempt_from_failed_keeps_the_failure_in_history() -> None:
    t = TaskTable()
    t.add(["a"])
    t.start(rows(0), 0)
    t.fail(rows(0), "compute: ZeroDivisionError", "Traceback (most recent call last): ...")
    t.new_attempt(rows(0), "failed")
    t.start(rows(0), 1)
    t.fail(rows(0), "compute: again", "tb 2")
    t.new_attempt(rows(0), "failed")
    assert int(t.attempt[0]) == 3
    assert t.state_of(0) is State.QUEUED
    first, second = t.history(0)
    assert (first.attempt, first.outcome, first.reason) == (1, "failed", "compute: ZeroDivisionError")
    assert first.traceback == "Traceback (most recent call last): ..."
    assert (second.attempt, second.reason, second.traceback) == (2, "compute: again", "tb 2")


def test_new_attempt_from_cancelled_is_allowed() -> None:
    t = TaskTable()
    t.add(["a"])
    t.cancel(rows(0))
    t.new_attempt(rows(0), "cancelled")
    assert (t.state_of(0), int(t.attempt[0])) == (State.QUEUED, 2)


@pytest.mark.parametrize("where", ["done", "queued"])
def test_new_attempt_on_done_or_queued_raises_and_changes_nothing(where: str) -> None:
    t = TaskTable()
    t.add(["a", "b"])
    t.start(rows(0), 0)
    if where == "done":
        run_to(t, rows(1), Phase.SINK, batch_id=1)
        t.finish(rows(1))
    before = columns(t)
    with pytest.raises(IllegalTransition) as info:
        t.new_attempt(rows(0, 1), "failed", "retry")
    assert info.value.key == "b"
    assert_same_columns(before, columns(t))


def test_new_attempt_with_an_unknown_outcome_raises_value_error() -> None:
    t = TaskTable()
    t.add(["a"])
    t.start(rows(0), 0)
    with pytest.raises(ValueError, match="unknown attempt outcome 'crashed'"):
        t.new_attempt(rows(0), "crashed")
    assert int(t.attempt[0]) == 1


def test_counts_match_columns_when_a_row_repeats_in_one_call() -> None:
    t = TaskTable()
    t.add(["a", "b"])
    with contextlib.suppress(ValueError):  # refusing a repeated row is fine too, if the counts stay right
        t.start(rows(0, 0), 0)
    np.testing.assert_array_equal(t.counts(), recount(t))


# -- stalls ---------------------------------------------------------------------------------------
def test_set_stall_on_a_done_task_raises_and_changes_nothing() -> None:
    t = TaskTable()
    t.add(["a", "b"])
    run_to(t, rows(0), Phase.SINK)
    t.finish(rows(0))
    with pytest.raises(IllegalTransition):
        t.set_stall(rows(0, 1), StallReason.MEMORY)
    np.testing.assert_array_equal(t.stall[:2], [0, 0])


def test_stall_since_is_kept_while_the_reason_is_unchanged() -> None:
    clock = FakeClock(10.0)
    t = TaskTable(clock=clock)
    t.add(["a"])
    t.set_stall(rows(0), StallReason.MEMORY, "no free slot")
    clock.t = 14.0
    t.set_stall(rows(0), StallReason.MEMORY)
    assert float(t.stall_since[0]) == 10.0
    assert t.stall_note(0) == "no free slot"


def test_stall_since_resets_when_the_reason_changes() -> None:
    clock = FakeClock(10.0)
    t = TaskTable(clock=clock)
    t.add(["a"])
    t.set_stall(rows(0), StallReason.MEMORY)
    clock.t = 14.0
    t.set_stall(rows(0), StallReason.CONTROL, "paused")
    assert (int(t.stall[0]), float(t.stall_since[0])) == (StallReason.CONTROL, 14.0)
    assert t.stall_note(0) == "paused"


def test_set_stall_none_clears_the_stall_and_its_note() -> None:
    t = TaskTable()
    t.add(["a"])
    t.set_stall(rows(0), StallReason.BACKPRESSURE, "sink slow")
    t.set_stall(rows(0), StallReason.NONE)
    assert int(t.stall[0]) == 0
    assert t.stall_note(0) == ""


def test_start_clears_a_queued_tasks_stall() -> None:
    t = TaskTable()
    t.add(["a"])
    t.set_stall(rows(0), StallReason.CONTROL, "paused")
    t.start(rows(0), 0)
    assert int(t.stall[0]) == 0
    np.testing.assert_array_equal(t.indices(stalled=True), [])


def test_indices_filters_by_state_phase_and_stall() -> None:
    t = TaskTable()
    t.add(["a", "b", "c", "d"])
    run_to(t, rows(1, 3), Phase.H2D)
    t.set_stall(rows(3), StallReason.MEMORY)
    np.testing.assert_array_equal(t.indices(State.QUEUED), [0, 2])
    np.testing.assert_array_equal(t.indices(State.RUNNING, Phase.H2D), [1, 3])
    np.testing.assert_array_equal(t.indices(State.RUNNING, stalled=True), [3])
    np.testing.assert_array_equal(t.of(["d", "a", "zzz"]), [0, 3])


# -- random operation sequences -------------------------------------------------------------------
class TaskTableMachine(RuleBasedStateMachine):
    """Random operations on random subsets of rows; each is predicted legal or illegal first."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.table = TaskTable(capacity=2, clock=self.clock)  # small: growth happens during the run
        self.model: list[tuple[State, Phase]] = []
        self.model_attempt: list[int] = []
        self.prev_attempt = np.zeros(0, np.int64)
        self.prev_state = np.zeros(0, np.int64)
        self.reopened: set[int] = set()
        self.batch_ids = itertools.count()

    # -- helpers
    def _draw_rows(self, data: st.DataObject) -> np.ndarray:
        picked = data.draw(st.sets(st.integers(0, len(self.model) - 1), min_size=1, max_size=4))
        if data.draw(st.booleans()):
            # a batch-like selection: the rows sharing the first pick's state and phase, so legal
            # moves deep into the chain (and to done) are reached often
            first = min(picked)
            picked = {i for i, sp in enumerate(self.model) if sp == self.model[first]}
        return np.array(sorted(picked), np.int64)

    def _transition(self, idx: np.ndarray, to_state: State, to_phase: Phase, op: object) -> None:
        self.clock.t += 1.0
        legal = all(check_transition(*self.model[i], to_state, to_phase) for i in idx.tolist())
        if legal:
            op()  # type: ignore[operator]
            for i in idx.tolist():
                self.model[i] = (to_state, to_phase)
        else:
            before = columns(self.table)
            with pytest.raises(IllegalTransition):
                op()  # type: ignore[operator]
            assert_same_columns(before, columns(self.table))

    # -- rules
    @initialize(n=st.integers(1, 4))
    def first_tasks(self, n: int) -> None:
        self.add(n)

    @rule(n=st.integers(1, 3))
    def add(self, n: int) -> None:
        first = len(self.model)
        self.table.add([f"t{first + j}" for j in range(n)])
        self.model += [(State.QUEUED, Phase.NONE)] * n
        self.model_attempt += [1] * n  # attempts are numbered from 1

    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        if self.model:
            idx = self._draw_rows(data)
            self._transition(idx, State.RUNNING, Phase.FILL, lambda: self.table.start(idx, next(self.batch_ids)))

    @rule(data=st.data(), phase=st.one_of(st.none(), st.sampled_from(list(Phase))))
    def advance(self, data: st.DataObject, phase: Phase | None) -> None:
        if self.model:
            idx = self._draw_rows(data)
            if phase is None:  # usually the next phase of the first row, sometimes any phase
                phase = Phase(min(int(self.model[int(idx[0])][1]) + 1, Phase.SINK))
            self._transition(idx, State.RUNNING, phase, lambda: self.table.advance(idx, phase))

    @rule(data=st.data())
    def lane_step(self, data: st.DataObject) -> None:
        """What a lane does: move every row of one running phase to the next phase, or to done."""
        running = [i for i, (s, _) in enumerate(self.model) if s is State.RUNNING]
        if not running:
            return
        phase = self.model[data.draw(st.sampled_from(running))][1]
        idx = np.array([i for i in running if self.model[i][1] is phase], np.int64)
        for _ in range(data.draw(st.integers(1, 5))):  # one or more phases in a row
            if phase is Phase.SINK:
                self._transition(idx, State.DONE, Phase.NONE, lambda: self.table.finish(idx))
                return
            phase = Phase(phase + 1)
            self._transition(idx, State.RUNNING, phase, lambda p=phase: self.table.advance(idx, p))

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        if self.model:
            idx = self._draw_rows(data)
            self._transition(idx, State.DONE, Phase.NONE, lambda: self.table.finish(idx))

    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        if self.model:
            idx = self._draw_rows(data)
            self._transition(idx, State.FAILED, Phase.NONE, lambda: self.table.fail(idx, "boom", "tb"))

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if self.model:
            idx = self._draw_rows(data)
            self._transition(idx, State.CANCELLED, Phase.NONE, lambda: self.table.cancel(idx))

    @rule(data=st.data(), outcome=st.sampled_from(ATTEMPT_OUTCOMES))
    def new_attempt(self, data: st.DataObject, outcome: str) -> None:
        if not self.model:
            return
        idx = self._draw_rows(data)
        # new_attempt's docstring: allowed from running, failed or cancelled; done is never re-run.
        legal = all(self.model[i][0] in (State.RUNNING, State.FAILED, State.CANCELLED) for i in idx.tolist())
        if legal:
            self.table.new_attempt(idx, outcome, "retry")
            for i in idx.tolist():
                self.model[i] = (State.QUEUED, Phase.NONE)
                self.model_attempt[i] += 1
                self.reopened.add(i)
        else:
            before = columns(self.table)
            with pytest.raises(IllegalTransition):
                self.table.new_attempt(idx, outcome, "retry")
            assert_same_columns(before, columns(self.table))

    @rule(data=st.data(), reason=st.sampled_from(list(StallReason)))
    def set_stall(self, data: st.DataObject, reason: StallReason) -> None:
        if not self.model:
            return
        idx = self._draw_rows(data)
        legal = reason is StallReason.NONE or all(not self.model[i][0].terminal for i in idx.tolist())
        if legal:
            self.table.set_stall(idx, reason, "note")
            np.testing.assert_array_equal(self.table.stall[idx], int(reason))
        else:
            before = columns(self.table)
            with pytest.raises(IllegalTransition):
                self.table.set_stall(idx, reason)
            assert_same_columns(before, columns(self.table))

    # -- invariants
    @invariant()
    def columns_match_the_model(self) -> None:
        n = len(self.model)
        assert len(self.table) == n
        assert [(self.table.state_of(i), self.table.phase_of(i)) for i in range(n)] == self.model
        assert self.table.attempt[:n].tolist() == self.model_attempt

    @invariant()
    def each_task_is_in_exactly_one_valid_state(self) -> None:
        n = len(self.table)
        st_, ph = self.table.state[:n], self.table.phase[:n]
        assert set(st_.tolist()) <= {s.value for s in State}
        # running tasks have a run phase; every other task has phase NONE
        assert ((st_ == State.RUNNING) == (ph != Phase.NONE)).all()
        assert int(self.table.counts().sum()) == n

    @invariant()
    def counts_equal_a_recount_of_the_columns(self) -> None:
        np.testing.assert_array_equal(self.table.counts(), recount(self.table))

    @invariant()
    def attempts_never_decrease_and_each_has_history(self) -> None:
        n = len(self.table)
        att = self.table.attempt[:n].astype(np.int64)
        assert (att[: len(self.prev_attempt)] >= self.prev_attempt).all()
        self.prev_attempt = att
        for i in range(n):
            assert [h.attempt for h in self.table.history(i)] == list(range(1, int(att[i])))  # numbered from 1

    @invariant()
    def terminal_states_stay_terminal_unless_a_new_attempt(self) -> None:
        n = len(self.table)
        now = self.table.state[:n].astype(np.int64)
        for i, s in enumerate(self.prev_state.tolist()):
            if State(s).terminal and i not in self.reopened:
                assert now[i] == s
        self.prev_state = now
        self.reopened.clear()

    @invariant()
    def no_terminal_task_is_stalled(self) -> None:
        n = len(self.table)
        assert not ((self.table.state[:n] >= State.DONE) & (self.table.stall[:n] != 0)).any()


def test_random_operation_sequences_keep_the_table_invariants() -> None:
    run_state_machine_as_test(
        TaskTableMachine,
        settings=settings(max_examples=150, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
