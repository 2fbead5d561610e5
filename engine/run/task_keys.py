"""Commands and questions that name tasks by key: cancel, retry failed, detail.

The decisions this module protects:
- "Unknown" means unknown. A key is answered ``no task 'X'`` only when it is not in the task table,
  was not finished by an earlier run of the run directory, and is not a key the source will still
  yield. A source that can tell cheaply (``Source.produces``: a synthetic key parses back to its
  index, an npy directory has its file list) is asked; one that cannot (an iterable) is taken to
  hold the key only while it is not exhausted, and the answer says that it could not tell.
- A cancel of a task not admitted yet waits (in ``Feeder.withheld``, and in the journal, so a crash
  does not forget it) until the feeder admits the task; the task is then recorded cancelled at once
  and never runs. Once the source is exhausted, waiting cancels of keys it never yielded are dropped.
- A cancel answers for each task: cancelled (it was queued), stops at its next phase (running),
  cancelled when admitted, already done / failed / cancelled, or unknown. ``ok`` is False when any key
  was unknown, and the known ones are acted on all the same.
- A task cancelled while running leaves no output: its batch still carries its row to the sink, and
  the lanes' sink (``UnlessCancelled``) skips it. A task already in its sink phase is not cancelled
  (its write may have begun): it finishes, and the answer says so.
- A detail tells the task's whole story (engine/run/stories.py): its attempts from the batch log,
  which the task keys hold (``batches``: the dispatcher fills it), its input from the source and its
  output from the sink the lanes write through (the one ``guard`` wraps).
- Only the engine's loop calls in while the run lasts; after it, the table no longer changes and
  ``detail`` may be called from any thread.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.journal import Journal, read_task
from warpdeck.engine.edges.resume import ResumingSource
from warpdeck.engine.edges.sinks import BatchWriter, RowsWriter, Sink, Staged, StagingSink, batch_writer, rows_writer
from warpdeck.engine.edges.sources import Source, source_produces
from warpdeck.engine.run.batching import ReadyQueue
from warpdeck.engine.run.feeder import Feeder
from warpdeck.engine.run.stories import input_line, output_line, tell
from warpdeck.engine.state.batch_log import BatchLog
from warpdeck.engine.state.commands import CommandResult
from warpdeck.engine.state.snapshot import TaskDetail
from warpdeck.engine.state.task_states import Phase, StallReason, State
from warpdeck.engine.state.tasks import TaskTable

__all__ = ["BY_OPERATOR_EARLY", "TaskKeys", "UnlessCancelled", "Where"]

BY_OPERATOR = "cancelled by operator"
BY_OPERATOR_EARLY = "cancelled by operator before admission"
_NAMED = 3  # a few keys are named in an answer; more are counted
_UNKNOWN_NAMED = 5


class Where(enum.Enum):
    """Where a key outside the task table stands."""

    FINISHED_EARLIER = "finished by an earlier run"
    COMING = "the source will yield it"
    MAYBE = "the source cannot say and is not exhausted"
    NEVER = "the source would yield it, but the run admits nothing more"
    UNKNOWN = "unknown"


class TaskKeys:
    """Cancel, retry and detail by key for one engine run."""

    def __init__(self, table: TaskTable, ready: ReadyQueue, feeder: Feeder, source: Source,
                 resume: ResumingSource | None) -> None:
        self.table = table
        self.ready = ready
        self.feeder = feeder
        self.source = source
        self.resume = resume
        self.cancel_rows: set[int] = set()
        """Running rows an operator cancelled: cancelled when their batch reaches its next phase."""
        self.unwritten: set[str] = set()
        """Keys of tasks cancelled while running, whose outputs the lanes' sink must not write."""
        self.waiting = feeder.withheld
        """Keys cancelled before admission (the feeder takes each out as it admits it)."""
        self._journal: Journal | None = None
        self._journal_path: Path | None = None
        self.batches = BatchLog()
        """Where and when each recent batch ran, and the stalls (a detail's story)."""
        self.sink: Sink | None = None
        """The run's sink (set by ``guard``): a detail says where an output landed."""

    def guard(self, sink: Sink) -> UnlessCancelled:
        """``sink`` for the lanes: a task cancelled while running writes no output."""
        self.sink = sink
        return UnlessCancelled(sink, self.unwritten)

    def attach(self, journal: Journal, waiting: Iterable[str]) -> None:
        """Journal waiting cancels in ``journal``; ``waiting``: those an earlier run left there."""
        self._journal = journal
        self._journal_path = journal.path
        self.waiting.update(waiting)

    # -- the feeder admitted tasks -----------------------------------------------------------------
    def on_admit(self) -> None:
        """Record cancelled the admitted tasks whose cancel waited; once the source is exhausted,
        drop the cancels of keys it never yielded."""
        rows = self.feeder.cancelled_on_admit
        if rows:
            keys = [self.table.keys[r] for r in rows]
            self.table.cancel(np.array(rows, np.int64), BY_OPERATOR_EARLY)
            rows.clear()
            if self._journal is not None:
                self._journal.cancel_applied(keys)
        if self.feeder.exhausted and self.waiting:
            dropped = sorted(self.waiting)
            self.waiting.clear()
            if self._journal is not None:
                self._journal.cancel_applied(dropped)

    def on_phase(self, idx: npt.NDArray[np.int64]) -> None:
        """A batch of rows ``idx`` moved on: its rows cancelled while running are cancelled now."""
        marked = self.cancel_rows
        if not marked:
            return
        hit = [r for r in idx.tolist() if r in marked]
        if hit:
            rows = np.array(hit, np.int64)
            rows = rows[self.table.state[rows] == State.RUNNING]
            self.table.cancel(rows, BY_OPERATOR)
            self.unwritten.update(self.table.keys[r] for r in rows.tolist())
            marked.difference_update(hit)

    # -- cancel ------------------------------------------------------------------------------------
    def cancel_all(self) -> CommandResult:
        """Every unfinished task: queued ones now, running ones at their next phase; admit no more."""
        self.feeder.draining = True
        rows = np.flatnonzero(self.table.state[: len(self.table)] <= State.RUNNING)
        queued, running, writing = self._stop(rows)
        note = f"; {len(writing)} writing their output finish" if len(writing) else ""
        return CommandResult(True, len(queued) + len(running),
                             f"cancelled {len(queued)} queued; {len(running)} running stop at their next phase{note}")

    def cancel(self, keys: Sequence[str]) -> CommandResult:
        """Cancel the named tasks, saying what happened to each."""
        if not keys:
            return CommandResult(False, 0, "name the tasks to cancel, or cancel all")
        t = self.table
        rows = t.of(keys)
        finished = rows[t.state[rows] >= State.DONE]
        queued, running, writing = self._stop(rows[t.state[rows] <= State.RUNNING])
        parts = []
        if len(queued):
            parts.append(f"cancelled {len(queued)} queued")
        if len(running):
            names = [t.keys[r] for r in running.tolist()]
            parts.append(f"{names[0]} running: stops at its next phase" if len(names) == 1 else
                         f"{_names(names)} running stop at their next phase")
        if len(writing):
            names = [t.keys[r] for r in writing.tolist()]
            parts.append(f"{_names(names)}: already writing {'its' if len(names) == 1 else 'their'} output;"
                         " not cancelled")
        parts += [f"{_names(ks)} already {state}" for state, ks in _by_state(t, finished)]
        outside = self._outside(keys, rows)
        coming = outside[Where.COMING] + outside[Where.MAYBE]
        new = [k for k in coming if k not in self.waiting]
        self.waiting.update(new)
        if new and self._journal is not None:
            self._journal.cancel_waits(new)
        if ks := outside[Where.COMING]:
            parts.append(f"{ks[0]}: not admitted yet; cancelled when it is" if len(ks) == 1 else
                         f"{_names(ks)} not admitted yet; cancelled when they are")
        if ks := outside[Where.MAYBE]:
            it = "it" if len(ks) == 1 else "them"
            parts.append(f"{_names(ks)}: not admitted yet, and the source cannot say whether it will yield {it};"
                         " cancelled if it does")
        if ks := outside[Where.NEVER]:
            parts.append(f"{_names(ks)}: not admitted, and the run is draining: never runs")
        if ks := outside[Where.FINISHED_EARLIER]:
            parts.append(f"{_names(ks)} already done (in an earlier run)")
        unknown = outside[Where.UNKNOWN]
        if unknown:
            parts.append(_no_task(unknown))
        return CommandResult(not unknown, len(queued) + len(running) + len(coming), "; ".join(parts))

    def _stop(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], ...]:
        """Cancel the queued rows of ``rows`` now and mark the running ones (but those already
        writing their output); returns the queued, the running and the writing rows."""
        t = self.table
        queued = rows[t.state[rows] == State.QUEUED]
        self.ready.remove(queued.tolist())
        t.cancel(queued, BY_OPERATOR)
        running = rows[t.state[rows] == State.RUNNING]
        writing = running[t.phase[running] == Phase.SINK]
        running = running[t.phase[running] != Phase.SINK]
        self.cancel_rows.update(running.tolist())
        return queued, running, writing

    # -- retry -------------------------------------------------------------------------------------
    def retry(self, keys: Sequence[str]) -> CommandResult:
        """Give the named failed tasks (none named: every failed task) a new attempt."""
        t = self.table
        handles = self.feeder.handles
        if not keys:
            n = self._retry([r for r in t.indices(State.FAILED).tolist() if r in handles])
            return CommandResult(True, n, f"retrying {n} failed task(s)" if n else "no failed task to retry")
        rows = t.of(keys)
        failed = rows[t.state[rows] == State.FAILED].tolist()
        n = self._retry([r for r in failed if r in handles])
        parts = [f"retrying {n} failed task(s)"] if n else []
        if early := [t.keys[r] for r in failed if r not in handles]:
            parts.append(f"{_names(early)}: failed on admission, before loading; a run with --retry-failed retries"
                         f" {'it' if len(early) == 1 else 'them'}")
        others = rows[t.state[rows] != State.FAILED]
        parts += [f"{_names(ks)}: {state}, not failed" for state, ks in _by_state(t, others)]
        outside = self._outside(keys, rows)
        if ks := outside[Where.FINISHED_EARLIER]:
            parts.append(f"{_names(ks)}: done (in an earlier run), not failed")
        if ks := outside[Where.COMING] + outside[Where.MAYBE] + outside[Where.NEVER]:
            parts.append(f"{_names(ks)}: not admitted yet, not failed")
        unknown = outside[Where.UNKNOWN]
        if unknown:
            parts.append(_no_task(unknown))
        return CommandResult(n > 0 and not unknown, n, "; ".join(parts))

    def _retry(self, rows: list[int]) -> int:
        if rows:
            self.table.new_attempt(np.array(rows, np.int64), "failed")
            for r in rows:
                self.ready.put_retry(r, self.feeder.handles[r], isolate=True)
        return len(rows)

    # -- detail ------------------------------------------------------------------------------------
    def detail(self, key: str) -> TaskDetail | None:
        """Everything known about one task: from the table; for a task not admitted yet, where it
        stands; for one an earlier run finished, from the journal. None for an unknown key."""
        t = self.table
        rows = t.of([key])
        if len(rows):
            r = int(rows[0])
            state = t.state_of(r)
            story = tell(t, r, self.batches)
            item = self.feeder.handles.get(r)
            return TaskDetail(key, state.label, t.phase_of(r).label, int(t.attempt[r]),
                              int(t.batch[r]), StallReason(int(t.stall[r])).label, t.stall_note(r),
                              t.error(r), t.traceback(r), t.history(r), t.flag(r),
                              attempts=story.attempts, stalls=story.stalls,
                              input_from=input_line(self.source, key, item.batch_key if item else story.key),
                              output_to=output_line(self.sink, key, state), why=story.why,
                              admitted_at_s=story.admitted_at_s)
        where = self.where(key)
        if where is Where.UNKNOWN:
            return None
        if where is Where.FINISHED_EARLIER:
            prior = read_task(self._journal_path, key) if self._journal_path is not None else None
            return TaskDetail(key, "done", "none", prior.attempts if prior else 1, -1, "none", "", "", "",
                              prior.history if prior else (), admitted=False,
                              note="done in an earlier run (from the journal)",
                              input_from=input_line(self.source, key, None),
                              output_to=output_line(self.sink, key, State.DONE))
        note = {Where.COMING: "queued (not yet admitted)",
                Where.MAYBE: "queued (not yet admitted, if the source yields it: it cannot say)",
                Where.NEVER: "not admitted, and the run is draining: it never runs"}[where]
        if key in self.waiting:
            note += "; cancelled when it is admitted"
        return TaskDetail(key, "queued", "none", 1, -1, "none", "", "", "", (), admitted=False, note=note)

    # -- keys outside the table --------------------------------------------------------------------
    def where(self, key: str) -> Where:
        """Where a key that is not in the task table stands."""
        if self.resume is not None and self.resume.finished_earlier(key):
            return Where.FINISHED_EARLIER
        admitting = self.feeder.admitting
        yields = source_produces(self.source, key)
        if yields is None:
            return Where.MAYBE if admitting else Where.UNKNOWN
        if not yields:
            return Where.UNKNOWN
        return Where.COMING if admitting else Where.NEVER

    def _outside(self, keys: Sequence[str], rows: npt.NDArray[np.int64]) -> dict[Where, list[str]]:
        inside = {self.table.keys[r] for r in rows.tolist()}
        out: dict[Where, list[str]] = {w: [] for w in Where}
        for key in dict.fromkeys(keys):
            if key not in inside:
                out[self.where(key)].append(key)
        return out


class UnlessCancelled:
    """The lanes' sink: ``inner``, less the outputs of tasks cancelled while running (``skip``,
    filled on the loop before their batch's sink job is submitted; read on the sink thread)."""

    def __init__(self, inner: Sink, skip: set[str]) -> None:
        self.inner = inner
        self._skip = skip
        self._inner_batch = batch_writer(inner)
        self.write_batch: BatchWriter | None = None if self._inner_batch is None else self._write_batch
        """``write_batch`` where the inner sink has one (None: it writes key by key)."""
        self._inner_rows = rows_writer(inner)
        self.write_rows: RowsWriter | None = None if self._inner_rows is None else self._write_rows
        """``write_rows`` where the inner sink has one."""

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        """Write ``out`` under ``key`` unless the task was cancelled."""
        if key in self._skip:
            self._skip.discard(key)
            return
        self.inner.write(key, out)

    def _write_batch(self, keys: Sequence[str], outs: npt.NDArray[Any]) -> None:
        """The inner sink's ``write_batch`` for the keys not cancelled."""
        assert self._inner_batch is not None
        keep = [j for j, k in enumerate(keys) if k not in self._skip]
        if len(keep) < len(keys):
            self._skip.difference_update(keys)
            keys, outs = [keys[j] for j in keep], outs[keep]
        if keys:
            self._inner_batch(keys, outs)

    def _write_rows(self, keys: Sequence[str], outs: npt.NDArray[Any]) -> list[BaseException | None]:
        """The inner sink's ``write_rows`` for the keys not cancelled (theirs answer None: nothing to write)."""
        assert self._inner_rows is not None
        keep = [j for j, k in enumerate(keys) if k not in self._skip]
        if len(keep) == len(keys):
            return self._inner_rows(keys, outs)
        self._skip.difference_update(keys)
        errors: list[BaseException | None] = [None] * len(keys)
        if keep:
            for j, e in zip(keep, self._inner_rows([keys[j] for j in keep], outs[keep]), strict=True):
                errors[j] = e
        return errors

    def commit(self, keys: Sequence[str], staged: Staged) -> None:
        """The inner (staging) sink's ``commit`` of what an actor staged, less the outputs of tasks
        cancelled while it ran."""
        inner = self.inner
        assert isinstance(inner, StagingSink), "only a staging sink is given staged outputs"
        drop = self._skip.intersection(keys)
        self._skip.difference_update(drop)
        inner.commit(keys, staged, drop)


def _by_state(t: TaskTable, rows: npt.NDArray[np.int64]) -> list[tuple[str, list[str]]]:
    """The keys of ``rows`` grouped by state, in the order queued, running, done, failed, cancelled."""
    groups: dict[State, list[str]] = {}
    for r in rows.tolist():
        groups.setdefault(t.state_of(r), []).append(t.keys[r])
    return [(s.name.lower(), groups[s]) for s in State if s in groups]


def _names(keys: Sequence[str]) -> str:
    """A few keys by name, more by count."""
    return ", ".join(keys) if len(keys) <= _NAMED else f"{len(keys)}"


def _no_task(keys: Sequence[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_UNKNOWN_NAMED])
    more = f" and {len(keys) - _UNKNOWN_NAMED} more" if len(keys) > _UNKNOWN_NAMED else ""
    return f"no task {shown}{more}"
