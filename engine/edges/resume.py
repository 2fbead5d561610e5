"""Resuming a run from its journal: which tasks to skip, which to requeue, and from which attempt.

The decisions this module protects:
- Done tasks are dropped while the source is enumerated (in the feeder's pull thread), before
  anything is loaded: a done task is never re-read and never re-written. A source that can drop
  keys before it enumerates (``exclude``: the npy directory) does, so it never opens their files.
- A task the journal does not show done but whose output the sink already holds (the process died
  between the rename and the journal's commit) is taken as done only if the sink can check it: the
  rename is atomic, so that output is whole, and it must match the checksum the sink kept as
  it wrote it. One that does not match is removed by the sink and its task runs again.
- A task that was in flight starts a new attempt with its history kept: the attempt the crash cut
  short counts. Failed tasks stay failed, reason and traceback kept, unless the run is asked to
  retry them; cancelled ones run again (a cancel stops one run, it does not judge the input).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.journal import Journal, ResumeState
from warpdeck.engine.edges.sinks import DurableSink, Sink, rejected_outputs
from warpdeck.engine.edges.sources import SAFE_KEY, Source, source_describes, source_produces
from warpdeck.engine.state.batches import TaskInput
from warpdeck.engine.state.task_states import State
from warpdeck.engine.state.tasks import TaskAttempt, TaskTable

__all__ = ["IN_FLIGHT_REASON", "ResumingSource"]

IN_FLIGHT_REASON = "in flight when the engine stopped; requeued on resume"


class ResumingSource:
    """Wraps a run's source: filters what a journal says is finished and restores attempts.

    Until ``begin`` is called it passes everything through (a new run directory)."""

    def __init__(self, inner: Source, sink: Sink) -> None:
        self.inner = inner
        self._sink = sink
        self._state = ResumeState(False, frozenset(), {})
        self._journal: Journal | None = None
        self._excluded = False
        self._excluded_n = 0
        self.retry_failed = False
        self.skipped_done = 0
        """Tasks done in an earlier run, not run again."""
        self.outputs_recovered = 0
        """Of those, tasks whose output was found in place although the journal had no done row."""
        self.requeued_in_flight = 0
        """Tasks in flight when the earlier run stopped, started again as a new attempt."""
        self.retried_failed = 0
        """Failed tasks retried because the run was asked to (``--retry-failed``)."""

    @property
    def outputs_rejected(self) -> int:
        """Outputs in place that the journal had not marked done and that failed the sink's check:
        removed, their tasks run again."""
        return rejected_outputs(self._sink)

    @property
    def resumed(self) -> bool:
        """Whether the run directory held a journal when this run began."""
        return self._state.resumed

    def begin(self, state: ResumeState, journal: Journal, retry_failed: bool) -> None:
        """Use ``state`` (read from ``journal`` at open); call before the feeder pulls."""
        self._state = state
        self._journal = journal
        self.retry_failed = retry_failed
        exclude = getattr(self.inner, "exclude", None)
        if state.done and exclude is not None:
            self.skipped_done = self._excluded_n = int(exclude(state.done))
            self._excluded = True

    @property
    def finished_before(self) -> int:
        """Tasks an earlier run finished that this run leaves out: the source's total is this and
        ``total``."""
        return (self._excluded_n if self._excluded else len(self._state.done)) + self.outputs_recovered

    @property
    def total(self) -> int | None:
        """Tasks this run will see: the source's, less those finished earlier."""
        t = self.inner.total
        if t is None:
            return None
        return t - (0 if self._excluded else len(self._state.done)) - self.outputs_recovered

    def items(self) -> Iterator[TaskInput]:
        """The source's tasks less the finished ones (runs in the feeder's pull thread)."""
        done, prior = self._state.done, self._state.prior
        sink = self._sink if self._state.resumed and isinstance(self._sink, DurableSink) else None
        for item in self.inner.items():
            if item.key in done:
                self.skipped_done += 1
                continue
            if sink is not None and sink.committed(item.key):
                self.skipped_done += 1
                self.outputs_recovered += 1
                if self._journal is not None:
                    self._journal.done_keys([item.key])
                continue
            p = prior.get(item.key)
            if p is not None and p.state is State.FAILED and not self.retry_failed and not item.error:
                # Admitted failed (see Feeder.admit), keeping its reason: retrying is opt-in.
                yield dataclasses.replace(item, error=p.error or "failed in an earlier run")
            else:
                yield item

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        """The source's own load."""
        return self.inner.load(items, out)

    def finished_earlier(self, key: str) -> bool:
        """Whether an earlier run finished ``key`` (done in the journal, or its output in place), so
        this run will not yield it."""
        if key in self._state.done:
            return True
        # Only a key that could name an output is looked for (an operator's typo is no path).
        return (self._state.resumed and isinstance(self._sink, DurableSink) and SAFE_KEY.match(key) is not None
                and self._sink.committed(key))

    def produces(self, key: str) -> bool | None:
        """The source's answer, less the tasks an earlier run finished."""
        if self.finished_earlier(key):
            return False
        return source_produces(self.inner, key)

    def describe(self, key: str) -> str:
        """The source's own words on where ``key``'s input comes from."""
        return source_describes(self.inner, key)

    def restore(self, table: TaskTable, rows: npt.NDArray[np.int64], items: Sequence[TaskInput]) -> None:
        """Give freshly admitted rows the attempts and history their keys had (on the loop)."""
        prior = self._state.prior
        if not prior:
            return
        keys: list[str] = []
        attempts: list[int] = []
        closed: list[TaskAttempt] = []
        now = time.monotonic()
        for row, item in zip(rows.tolist(), items, strict=True):
            p = prior.get(item.key)
            if p is None:
                continue
            rerun = p.state in (State.RUNNING, State.CANCELLED) or (p.state is State.FAILED and self.retry_failed)
            if not rerun:  # queued, or failed and kept failed: same attempt
                table.restore(row, p.attempts, p.history, p.error, p.traceback)
                continue
            if p.state is State.RUNNING:
                last = TaskAttempt(p.attempts, "requeued", now, IN_FLIGHT_REASON)
                self.requeued_in_flight += 1
            elif p.state is State.FAILED:
                last = TaskAttempt(p.attempts, "failed", now, p.error, p.traceback)
                self.retried_failed += 1
            else:
                last = TaskAttempt(p.attempts, "cancelled", now, p.error)
            table.restore(row, p.attempts + 1, (*p.history, last), last.reason, last.traceback)
            keys.append(item.key)
            attempts.append(p.attempts + 1)
            closed.append(last)
        if keys and self._journal is not None:
            self._journal.requeued(keys, attempts, closed)

