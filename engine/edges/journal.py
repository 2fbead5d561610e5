"""The run journal: every task's state, attempts and lease, in SQLite (WAL) inside the run directory.

The decisions this module protects:
- One writer thread owns the connection. The event loop only puts small records on a queue (a
  batch's row indices as one NumPy array), so a state change costs the loop one queue put per
  batch, never a disk write. The thread turns records into ``executemany`` calls and commits at
  most every ``interval`` seconds, and once more at close.
- A done row means the output exists. The dispatcher marks a task done only after the sink
  returned (the npy sink has renamed the file by then), records reach the queue in the order the
  table changed, and one thread applies them in that order: a committed done never precedes its
  output. The reverse can happen (output renamed, done not yet committed); resume handles that by
  asking the sink (``resume.py``).
- The journal shadows the table and is never a second source of truth: ``JournaledTable``
  records each transition after the table accepted it, so an illegal move never reaches the disk.
- A task that one commit both starts and finishes is written once, as done with its start's batch,
  epoch and attempts (``_started_and_done``): the state the two statements would leave, found only
  where no record between them could touch the task. A quarter to a third less SQLite work per
  task where batches take less than a commit interval.
- WAL with ``synchronous=NORMAL``: a killed process loses nothing committed; an OS crash may lose
  the last transactions, which a resume then redoes.
- One engine per run directory at a time, enforced with ``flock`` (released by the kernel when
  the process dies, so a SIGKILL never leaves a stale lock).
- An operator's cancel of a task not admitted yet is a row in ``cancels`` until the task is admitted
  and recorded cancelled, so a crash before its admission does not forget it.
- Attempts are numbered from 1 (schema 2); a schema-1 journal (numbered from 0) is renumbered once,
  when it is opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.outage import Outage, OutageAbandoned, environment_cause
from warpdeck.engine.edges.spec_diff import mismatch_message
from warpdeck.engine.state.task_states import State
from warpdeck.engine.state.tasks import TaskAttempt

__all__ = [
    "JOURNAL_NAME",
    "Journal",
    "JournalError",
    "PriorTask",
    "ResumeState",
    "RunDirBusy",
    "RunDirError",
    "SpecIdentity",
    "SpecMismatch",
    "read_task",
    "spec_identity",
]

JOURNAL_NAME = "journal.sqlite"
LOCK_NAME = "journal.lock"
SCHEMA_VERSION = "2"

_TUNING = {"backend", "lanes", "slot_depth", "batch_size", "batch_timeout_s", "retry", "feeder", "executor",
           "faults", "host"}
"""Fields that tune how a run goes but not what it produces; they may change between resumes. (``host`` joined them
later: ``_made_by_same`` accepts a journal whose identity still holds it.)"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tasks(
    key TEXT PRIMARY KEY, state INTEGER NOT NULL, attempts INTEGER NOT NULL,
    batch INTEGER NOT NULL DEFAULT -1, epoch INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '', traceback TEXT NOT NULL DEFAULT '', updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS history(
    key TEXT NOT NULL, attempt INTEGER NOT NULL, outcome TEXT NOT NULL, reason TEXT NOT NULL,
    traceback TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY(key, attempt)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cancels(key TEXT PRIMARY KEY, at REAL NOT NULL) WITHOUT ROWID;
"""


class RunDirError(Exception):
    """A run directory that cannot be used for this run."""

    def __init__(self, run_dir: Path, message: str) -> None:
        self.run_dir = run_dir
        super().__init__(message)


class SpecMismatch(RunDirError):
    """The run directory's journal was made by another spec; resuming it would mix two runs."""

    def __init__(self, run_dir: Path, journal: SpecIdentity, spec: SpecIdentity) -> None:
        self.journal = journal
        self.spec = spec
        super().__init__(run_dir, mismatch_message(run_dir, journal, spec))


class RunDirBusy(RunDirError):
    """Another engine holds the run directory's lock."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir, f"{run_dir}: run directory is in use by another warpdeck engine")


class JournalError(RunDirError):
    """The journal could not be written (disk full, permissions); durability of the run is lost."""

    def __init__(self, run_dir: Path, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(run_dir, f"{run_dir}: journal write failed: {type(cause).__name__}: {cause}")


@dataclass(frozen=True, slots=True)
class SpecIdentity:
    """Which spec made a run: its name and a hash of what decides the tasks and their outputs."""

    name: str
    digest: str
    spec: str = field(default="", compare=False)
    """The JSON hashed into ``digest``, so a refusal can name the fields that differ ("": not stored)."""


def spec_identity(spec: PipelineSpec) -> SpecIdentity:
    """Name and SHA-256 of the normalised spec, tuning fields left out (see ``_TUNING``)."""
    data = spec.model_dump(mode="json", exclude=_TUNING)
    if not data["steps"]:
        del data["steps"]  # a spec of one step is identified as it was before steps existed
    for stage in data["stages"] + [stage for step in data.get("steps", []) for stage in step["stages"]]:
        stage.pop("deadline_s", None)
    return _identity(spec.name, data)


def _identity(name: str, data: dict[str, Any]) -> SpecIdentity:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return SpecIdentity(name, hashlib.sha256(text.encode()).hexdigest(), text)


def _made_by_same(made_by: SpecIdentity, identity: SpecIdentity) -> bool:
    """Whether the journal's spec decides the same tasks and outputs as ``identity``: the same
    identity, or one made before a field became a tuning field, that matches once it is left out,
    or one made before a field was added that today's spec leaves null (``load_batch``,
    ``write_batch``: their absence meant what null means)."""
    if made_by == identity:
        return True
    if not made_by.spec or made_by.name != identity.name:
        return False
    data = json.loads(made_by.spec)
    for name in _TUNING:
        data.pop(name, None)
    if data.get("steps") == []:
        del data["steps"]  # no steps is one step, identified as it was before steps existed
    then = _identity(made_by.name, data)
    if then == identity:
        return True
    return bool(identity.spec) and then == _identity(identity.name, _less_new_nulls(json.loads(identity.spec), data))


def _less_new_nulls(now: Any, then: Any) -> Any:
    """``now`` less every null field that ``then``, at the same place, does not have."""
    if isinstance(now, dict) and isinstance(then, dict):
        return {k: _less_new_nulls(v, then.get(k)) for k, v in now.items() if v is not None or k in then}
    if isinstance(now, list) and isinstance(then, list) and len(now) == len(then):
        return [_less_new_nulls(a, b) for a, b in zip(now, then, strict=True)]
    return now


@dataclass(frozen=True, slots=True)
class PriorTask:
    """A task as the journal knows it: what a resumed run starts a task that is not done from, and
    what the detail of a task done in an earlier run shows."""

    key: str
    state: State
    attempts: int
    error: str
    traceback: str
    history: tuple[TaskAttempt, ...]


@dataclass(frozen=True, slots=True)
class ResumeState:
    """What the journal held when it was opened; ``resumed`` is False for a new run directory."""

    resumed: bool
    done: frozenset[str]
    prior: Mapping[str, PriorTask]
    cancels: frozenset[str] = frozenset()
    """Keys an operator cancelled before the feeder admitted them; cancelled when they are."""


_STOP = object()


class Journal:
    """The writer side of the journal; open with ``Journal.open`` (blocking: call it in a thread)."""

    def __init__(self, run_dir: Path, conn: sqlite3.Connection, lock_fd: int, interval: float) -> None:
        self.run_dir = run_dir
        self.path = run_dir / JOURNAL_NAME
        self.interval = interval
        self.error: BaseException | None = None
        """The write that failed for good: the engine stops on it, ``close`` raises it."""
        self.commits = 0
        self.outage: Outage | None = None
        """Where environment errors (a full or read-only disk) hold the writes instead of failing them; None: they fail
        the journal at once."""
        self._conn = conn
        self._lock_fd = lock_fd
        self._keys: Sequence[str] = ()
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake = threading.Event()
        """Cuts the batching wait short: set by flush and close."""
        self._abandoned = False
        self._thread = threading.Thread(target=self._write_loop, name="warpdeck-journal", daemon=True)
        self._thread.start()

    # -- opening ------------------------------------------------------------------------------------
    @classmethod
    def open(cls, run_dir: Path, identity: SpecIdentity, interval: float = 0.05) -> tuple[Journal, ResumeState]:
        """Lock ``run_dir``, open (or create) its journal, check it was made by ``identity``'s spec
        and read what a resume needs. Raises ``RunDirBusy``, ``SpecMismatch``, ``RunDirError`` for a
        journal SQLite cannot read, or ``JournalError`` where the disk refuses (full, read-only,
        failing)."""
        try:
            return cls._open(run_dir, identity, interval)
        except (OSError, sqlite3.Error) as exc:
            if environment_cause(exc) is not None:
                raise JournalError(run_dir, exc) from exc
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                # A file in the journal's place that SQLite cannot read: not ours to overwrite.
                raise RunDirError(run_dir, f"{run_dir / JOURNAL_NAME}: not a warpdeck journal ({exc}); "
                                           f"pass another --run-dir, or remove {run_dir}") from exc
            raise

    @classmethod
    def _open(cls, run_dir: Path, identity: SpecIdentity, interval: float) -> tuple[Journal, ResumeState]:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirBusy(run_dir) from None
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(run_dir / JOURNAL_NAME, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            if meta:
                made_by = SpecIdentity(meta.get("spec_name", "?"), meta.get("spec_digest", "?"), meta.get("spec", ""))
                if not _made_by_same(made_by, identity):
                    raise SpecMismatch(run_dir, made_by, identity)
                conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",  # an older journal: today's identity
                                 [("spec_digest", identity.digest), ("spec", identity.spec)])
                _renumber_attempts(conn, meta.get("schema", SCHEMA_VERSION))
            else:
                conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("schema", SCHEMA_VERSION), ("spec_name", identity.name), ("spec_digest", identity.digest),
                    ("spec", identity.spec), ("created", repr(time.time()))])
            state = _read_state(conn, resumed=bool(meta))
        except BaseException:
            if conn is not None:
                conn.close()
            os.close(fd)
            raise
        return cls(run_dir, conn, fd, interval), state

    def attach(self, keys: Sequence[str]) -> None:
        """The table's key list, so records can carry row indices instead of keys."""
        self._keys = keys

    # -- records (any thread; cheap) ------------------------------------------------------------------
    def admitted(self, rows: npt.NDArray[np.int64]) -> None:
        """New rows entered the table as queued (known keys keep their journaled state)."""
        self._q.put(("add", rows))

    def started(self, rows: npt.NDArray[np.int64], batch: int, attempts: npt.NDArray[Any], epoch: int = 0) -> None:
        """Rows were leased as batch ``batch`` under worker epoch ``epoch``."""
        self._q.put(("start", rows, batch, attempts, epoch))

    def finished(self, rows: npt.NDArray[np.int64]) -> None:
        """Rows are done: their outputs are in place."""
        self._q.put(("done", rows))

    def done_keys(self, keys: list[str]) -> None:
        """Keys found done outside the table (an output that survived a crash)."""
        self._q.put(("done_keys", keys))

    def ended(self, keys: list[str], state: State, reasons: list[str], tracebacks: list[str]) -> None:
        """Keys failed or were cancelled, each with its reason and traceback."""
        self._q.put(("end", keys, int(state), reasons, tracebacks))

    def requeued(self, keys: list[str], attempts: list[int], closed: list[TaskAttempt]) -> None:
        """Each key's attempt ``closed[j]`` ended and attempt ``attempts[j]`` is queued."""
        self._q.put(("requeue", keys, attempts, closed, time.time() - time.monotonic()))

    def cancel_waits(self, keys: list[str]) -> None:
        """Keys not admitted yet were cancelled: they are to be cancelled when admitted."""
        self._q.put(("cancel_waits", keys))

    def cancel_applied(self, keys: list[str]) -> None:
        """Waiting cancels were applied (their tasks are recorded cancelled) or dropped."""
        self._q.put(("cancel_applied", keys))

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything recorded so far is committed; False on timeout."""
        done = threading.Event()
        self._q.put(("flush", done))
        self._wake.set()
        return done.wait(timeout)

    def abandon(self) -> None:
        """Stop now without committing what is still queued, as a killed process would (tests of
        what a resume makes of a crash use it)."""
        if self._thread.is_alive():
            self._abandoned = True
            self._wake.set()
            self._q.put(_STOP)
            self._thread.join()
            self._conn.close()
            os.close(self._lock_fd)

    def close(self) -> None:
        """Commit what is left, stop the writer, release the run directory. Raises ``JournalError``
        if any write failed during the run."""
        if self._thread.is_alive():
            self._wake.set()
            self._q.put(_STOP)
            self._thread.join()
            self._conn.close()
            os.close(self._lock_fd)
        if self.error is not None:
            raise JournalError(self.run_dir, self.error)

    # -- the writer thread -------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            # Collect records for a while: one commit per interval (or per flush), never one per
            # batch. Commits happen only here, so what a kill loses is "since the last tick".
            self._wake.wait(self.interval)
            self._wake.clear()
            batch: list[Any] = []
            while True:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            if self._abandoned:
                return
            flushes = [op[1] for op in batch if op is not _STOP and op[0] == "flush"]
            ops = [op for op in batch if op is not _STOP and op[0] != "flush"]
            if ops and self.error is None:
                try:
                    if self.outage is None:
                        self._apply(ops)
                    else:  # a full or read-only disk holds the records (in order) until it passes
                        self.outage.retry("journal", f"{self.run_dir}{os.sep}", functools.partial(self._apply, ops))
                    self.commits += 1
                except (sqlite3.Error, OSError, OutageAbandoned) as exc:
                    # Keep draining so the loop never blocks; the engine stops on it (``error``),
                    # close() reports the loss.
                    self.error = exc
            for ev in flushes:
                ev.set()
            if any(op is _STOP for op in batch):
                return

    def _apply(self, ops: list[tuple[Any, ...]]) -> None:
        """Commit ``ops`` in one transaction, or nothing (rolled back, so they can be tried again)."""
        try:
            self._apply_ops(ops)
        except BaseException:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.rollback()
            raise

    def _apply_ops(self, ops: list[tuple[Any, ...]]) -> None:
        c = self._conn
        keys = self._keys
        now = time.time()
        finishing = _started_and_done(ops)
        out = _Statements(c)
        c.execute("BEGIN")
        for i, op in enumerate(ops):
            kind = op[0]
            if kind == "start":
                _, rows, batch, attempts, epoch = op
                done = finishing.get(i)
                if done is not None:  # started and done in this transaction: one statement for both
                    both = np.isin(rows, done) if len(rows) > 1 else np.ones(1, bool)
                    out.add("UPDATE tasks SET state=2, batch=?, epoch=?, attempts=?, updated=? WHERE key=?",
                            _started(rows[both], attempts[both], batch, epoch, now, keys))
                    if both.all():
                        continue
                    rows, attempts = rows[~both], attempts[~both]
                out.add("UPDATE tasks SET state=1, batch=?, epoch=?, attempts=?, updated=? WHERE key=?",
                        _started(rows, attempts, batch, epoch, now, keys))
            elif kind == "done":
                if finishing.get(-1 - i) is None:  # not already written with its start
                    out.add("UPDATE tasks SET state=2, updated=? WHERE key=?", [(now, keys[r]) for r in op[1].tolist()])
            elif kind == "add":
                out.add("INSERT INTO tasks(key, state, attempts, updated) VALUES (?, 0, 1, ?)"
                        " ON CONFLICT(key) DO NOTHING", [(keys[r], now) for r in op[1].tolist()])
            elif kind == "done_keys":
                out.add("INSERT INTO tasks(key, state, attempts, updated) VALUES (?, 2, 1, ?)"
                        " ON CONFLICT(key) DO UPDATE SET state=2, updated=excluded.updated", [(k, now) for k in op[1]])
            elif kind == "end":
                _, ks, state, reasons, tbs = op
                out.add("UPDATE tasks SET state=?, error=?, traceback=?, updated=? WHERE key=?",
                        [(state, r, t, now, k) for k, r, t in zip(ks, reasons, tbs, strict=True)])
            elif kind == "requeue":
                _, ks, attempts, closed, wall_offset = op
                out.add("UPDATE tasks SET state=0, attempts=?, batch=-1, error=?, traceback=?, updated=? WHERE key=?",
                        [(a, h.reason, h.traceback, now, k) for k, a, h in zip(ks, attempts, closed, strict=True)])
                out.add("INSERT OR REPLACE INTO history VALUES (?, ?, ?, ?, ?, ?)",
                        [(k, h.attempt, h.outcome, h.reason, h.traceback, h.at + wall_offset)
                         for k, h in zip(ks, closed, strict=True)])
            elif kind == "cancel_waits":
                out.add("INSERT OR REPLACE INTO cancels VALUES (?, ?)", [(k, now) for k in op[1]])
            elif kind == "cancel_applied":
                out.add("DELETE FROM cancels WHERE key=?", [(k,) for k in op[1]])
        out.flush()
        c.execute("COMMIT")


def _started(rows: npt.NDArray[np.int64], attempts: npt.NDArray[Any], batch: int, epoch: int, now: float,
             keys: Sequence[str]) -> list[tuple[Any, ...]]:
    """A start record's rows, as the parameters of its ``UPDATE``."""
    return [(batch, epoch, a, now, keys[r]) for r, a in zip(rows.tolist(), attempts.tolist(), strict=True)]


class _Statements:
    """Statements of one transaction, in order: a statement repeated back to back runs as one
    ``executemany`` (a batch of one task records a start and a done each: a call per record cost
    the writer thread more than SQLite's own work). Rows keep their order, so the outcome is the
    same as one call per record."""

    __slots__ = ("_conn", "_rows", "_sql")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._sql = ""
        self._rows: list[tuple[Any, ...]] = []

    def add(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if sql != self._sql:
            self.flush()
            self._sql = sql
        self._rows += rows

    def flush(self) -> None:
        if self._rows:
            self._conn.executemany(self._sql, self._rows)
            self._rows = []


_BY_KEY = frozenset(("done_keys", "end", "requeue"))
"""Records that name their tasks by key, not by row: which rows they touch is not looked up."""


def _started_and_done(ops: Sequence[tuple[Any, ...]]) -> dict[int, Any]:
    """The rows one transaction both starts and finishes, to be written once, as done with their
    start's batch, epoch and attempts: the final state the two statements leave, at a third less
    SQLite work per task where batches take less than a commit interval. For each ``done`` record:
    the nearest earlier record that touches any of its rows (``start``, ``done``, ``add`` by rows;
    a record by key stops the search: it may touch them) must be a ``start`` holding all of them.
    Keys: the start's index, with the rows it finishes; and ``-1 - i`` for each done record ``i``
    so merged."""
    merged: dict[int, Any] = {}
    bounds: dict[int, tuple[int, int]] = {}

    def span(j: int) -> tuple[int, int]:  # the rows' range: most records are disjoint by it alone
        if j not in bounds:
            rows = ops[j][1]
            n = len(rows)
            bounds[j] = (int(rows.min()), int(rows.max())) if n > 1 else (int(rows[0]),) * 2 if n else (0, -1)
        return bounds[j]

    for i, op in enumerate(ops):
        if op[0] != "done" or not len(op[1]):
            continue
        rows = op[1]
        lo, hi = span(i)
        for j in range(i - 1, -1, -1):
            other = ops[j]
            if other[0] in _BY_KEY:
                break
            if other[0] not in ("start", "done", "add"):
                continue
            olo, ohi = span(j)
            if ohi < lo or olo > hi:
                continue
            some, every = _found(rows, other[1])
            if not some:
                continue
            if other[0] == "start" and j not in merged and every:
                merged[j] = rows
                merged[-1 - i] = rows
            break
    return merged


_FEW = 64
"""Rows up to this many are matched as Python ints: ``np.isin`` costs ~30 us a call, most of a batch of one task's
journal work."""


def _found(rows: npt.NDArray[np.int64], other: npt.NDArray[np.int64]) -> tuple[bool, bool]:
    """Whether any, and whether every one, of ``rows`` is in ``other``."""
    if len(rows) <= _FEW and len(other) <= _FEW:
        theirs = set(other.tolist())
        hits = sum(r in theirs for r in rows.tolist())
        return hits > 0, hits == len(rows)
    hit = np.isin(rows, other)
    return bool(hit.any()), bool(hit.all())


def _renumber_attempts(conn: sqlite3.Connection, schema: str) -> None:
    """Schema 1 numbered attempts from 0; number them from 1, once."""
    if schema != "1":
        return
    conn.execute("BEGIN")
    conn.execute("UPDATE tasks SET attempts = attempts + 1")
    # Through negatives: (key, attempt) is the key, and attempt + 1 in place would meet the next row.
    conn.execute("UPDATE history SET attempt = -(attempt + 1)")
    conn.execute("UPDATE history SET attempt = -attempt")
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
    conn.execute("COMMIT")


def read_task(path: Path, key: str) -> PriorTask | None:
    """One task as the journal at ``path`` holds it, or None (blocking; any thread, beside a writer)."""
    if not path.is_file():
        return None
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return _tasks(conn, "t.key = ?", (key,)).get(key)


def _read_state(conn: sqlite3.Connection, resumed: bool) -> ResumeState:
    if not resumed:
        return ResumeState(False, frozenset(), {})
    cancels = frozenset(k for (k,) in conn.execute("SELECT key FROM cancels"))
    done = frozenset(k for (k,) in conn.execute("SELECT key FROM tasks WHERE state = 2"))
    return ResumeState(True, done, _tasks(conn, "t.state != 2"), cancels)


def _tasks(conn: sqlite3.Connection, where: str, args: tuple[str, ...] = ()) -> dict[str, PriorTask]:
    # Journal times are wall-clock; the table's clock is monotonic: shift history into it.
    shift = time.monotonic() - time.time()
    history: dict[str, list[TaskAttempt]] = {}
    for key, attempt, outcome, reason, tb, at in conn.execute(
            "SELECT h.key, h.attempt, h.outcome, h.reason, h.traceback, h.at FROM history h"
            f" JOIN tasks t ON t.key = h.key WHERE {where} ORDER BY h.key, h.attempt", args):
        history.setdefault(key, []).append(TaskAttempt(attempt, outcome, at + shift, reason, tb))
    return {key: PriorTask(key, State(state), attempts, error, tb, tuple(history.get(key, ())))
            for key, state, attempts, error, tb in conn.execute(
                f"SELECT key, state, attempts, error, traceback FROM tasks t WHERE {where}", args)}
