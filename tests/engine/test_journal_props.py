"""Property test: random task lifecycles through a journaled table, crashes and resumes.

A hypothesis state machine drives a ``JournaledTable`` backed by a real SQLite journal: lease a
batch, move it a phase, complete it, fail it, lose its worker (requeue), cancel, retry failed
tasks, crash (with the journal flushed, or not: ``abandon`` drops what is still queued, as a kill
does) and resume (a new table rebuilt from the journal by ``ResumingSource``, as the engine does).
Invariants: every task is in exactly one state (or skipped as done by a resume); terminal states
are final within a run; attempts never decrease, across resumes too; a task the journal calls done
was done; nothing is both done and queued; after a flushed crash the journal equals the table;
and driving every task to the end leaves each one done, failed or cancelled.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from warpdeck.engine.edges.journal import Journal, SpecIdentity
from warpdeck.engine.edges.journaled_table import JournaledTable
from warpdeck.engine.edges.resume import ResumingSource
from warpdeck.engine.edges.sinks import NullSinkImpl
from warpdeck.engine.edges.sources import IterableSource
from warpdeck.engine.state.task_states import RUN_PHASES, Phase, State

ID = SpecIdentity("props", "0" * 64)
KEYS = [f"t{i:03d}" for i in range(12)]


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="wd-props-"))
        self.batches = itertools.count()
        self.done_ever: set[str] = set()  # keys some run finished: the only ones the journal may call done
        self.best_attempt = dict.fromkeys(KEYS, 0)  # highest attempt any run has committed to the journal
        self.table, self.journal, self.skipped = self._resume(retry_failed=False)
        self.prev_state: dict[str, int] = {}

    # -- helpers
    def _resume(self, retry_failed: bool) -> tuple[JournaledTable, Journal, set[str]]:
        journal, state = Journal.open(self.dir, ID, interval=3600)  # commits only on flush or close
        src = ResumingSource(IterableSource([(k, np.zeros(1)) for k in KEYS]), NullSinkImpl())
        table = JournaledTable(capacity=2)
        table.attach(journal)
        src.begin(state, journal, retry_failed)
        items = list(src.items())
        rows = table.add([t.key for t in items])
        src.restore(table, rows, items)
        for r, t in zip(rows.tolist(), items, strict=True):
            if t.error:  # failed earlier and not retried: admitted failed, as the scheduler does
                table.fail(np.array([r]), t.error)
        return table, journal, set(state.done)

    def _rows(self, state: State, phase: Phase | None = None) -> np.ndarray:
        return self.table.indices(state, phase)

    def _pick(self, data: st.DataObject, rows: np.ndarray) -> np.ndarray:
        picked = data.draw(st.sets(st.sampled_from(rows.tolist()), min_size=1, max_size=4))
        return np.array(sorted(picked), np.int64)

    # -- rules
    @precondition(lambda self: len(self._rows(State.QUEUED)))
    @rule(data=st.data())
    def lease(self, data: st.DataObject) -> None:
        self.table.start(self._pick(data, self._rows(State.QUEUED)), next(self.batches))

    @precondition(lambda self: len(self._rows(State.RUNNING)))
    @rule(data=st.data())
    def phase_change(self, data: st.DataObject) -> None:
        phase = data.draw(st.sampled_from(RUN_PHASES[:-1]))
        rows = self._rows(State.RUNNING, phase)
        if len(rows):
            self.table.advance(rows, Phase(phase + 1))

    @precondition(lambda self: len(self._rows(State.RUNNING, Phase.SINK)))
    @rule()
    def complete(self) -> None:
        rows = self._rows(State.RUNNING, Phase.SINK)
        self.table.finish(rows)
        self.done_ever.update(self.table.keys[r] for r in rows.tolist())

    @precondition(lambda self: len(self._rows(State.RUNNING)) + len(self._rows(State.QUEUED)))
    @rule(data=st.data(), cancel=st.booleans())
    def fail_or_cancel(self, data: st.DataObject, cancel: bool) -> None:
        rows = np.concatenate([self._rows(State.RUNNING), self._rows(State.QUEUED)])
        idx = self._pick(data, rows)
        if cancel:
            self.table.cancel(idx, "cancelled by operator")
        else:
            self.table.fail(idx, "boom", "Traceback: boom")

    @precondition(lambda self: len(self._rows(State.RUNNING)))
    @rule(data=st.data())
    def worker_lost(self, data: st.DataObject) -> None:
        self.table.new_attempt(self._pick(data, self._rows(State.RUNNING)), "requeued", "worker lost")

    @precondition(lambda self: len(self._rows(State.FAILED)))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self.table.new_attempt(self._pick(data, self._rows(State.FAILED)), "failed")

    @rule(flushed=st.booleans(), retry_failed=st.booleans())
    def crash_and_resume(self, flushed: bool, retry_failed: bool) -> None:
        before = {k: (int(self.table.state[r]), int(self.table.attempt[r])) for r, k in enumerate(self.table.keys)}
        if flushed:
            assert self.journal.flush(10)
            self._journal_equals(before)
        self.journal.abandon()
        self.table, self.journal, self.skipped = self._resume(retry_failed)
        self.prev_state = {}
        assert self.skipped <= self.done_ever, "the journal called a task done that never finished"
        for r, k in enumerate(self.table.keys):
            assert int(self.table.attempt[r]) >= self.best_attempt[k]
            if flushed:
                state, attempt = before[k]
                rerun = state in (State.RUNNING, State.CANCELLED) or (state == State.FAILED and retry_failed)
                assert int(self.table.attempt[r]) == attempt + rerun
                assert int(self.table.state[r]) == (State.FAILED if state == State.FAILED and not retry_failed
                                                    else State.QUEUED)
        if flushed:
            assert self.skipped == {k for k, (s, _) in before.items() if s == State.DONE}

    def _journal_equals(self, table: dict[str, tuple[int, int]]) -> None:
        with sqlite3.connect(self.dir / "journal.sqlite") as c:
            rows = {k: (s, a) for k, s, a in c.execute("SELECT key, state, attempts FROM tasks")}
        for k, v in table.items():
            assert rows[k] == v, (k, rows[k], v)
            self.best_attempt[k] = max(self.best_attempt[k], v[1])

    # -- invariants
    @invariant()
    def every_task_in_exactly_one_place(self) -> None:
        keys = list(self.table.keys)
        assert len(keys) == len(set(keys))
        assert set(keys) | self.skipped == set(KEYS) and not set(keys) & self.skipped
        n = len(self.table)
        st_, ph = self.table.state[:n], self.table.phase[:n]
        assert ((st_ == State.RUNNING) == (ph != Phase.NONE)).all()
        assert int(self.table.counts().sum()) == n

    @invariant()
    def terminal_states_are_final_and_attempts_grow(self) -> None:
        now = {k: (int(self.table.state[r]), int(self.table.attempt[r])) for r, k in enumerate(self.table.keys)}
        for k, (s, a) in self.prev_state.items():
            if State(s).terminal and now[k][1] == a:  # same attempt: a terminal state never moved
                assert now[k][0] == s
            assert now[k][1] >= a
        self.prev_state = now

    def teardown(self) -> None:
        try:
            # Run to completion: every live task leased and driven through its phases to done.
            queued = self._rows(State.QUEUED)
            if len(queued):
                self.table.start(queued, next(self.batches))
            for phase in RUN_PHASES[:-1]:
                rows = self._rows(State.RUNNING, phase)
                if len(rows):
                    self.table.advance(rows, Phase(phase + 1))
            self.table.finish(self._rows(State.RUNNING, Phase.SINK))
            n = len(self.table)
            assert set(self.table.state[:n].tolist()) <= {State.DONE, State.FAILED, State.CANCELLED}
            self.journal.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def test_random_lifecycles_crashes_and_resumes_keep_the_journal_invariants() -> None:
    run_state_machine_as_test(
        JournalMachine,
        settings=settings(max_examples=60, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
