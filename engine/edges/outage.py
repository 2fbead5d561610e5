"""Outages: the disk under the outputs or the journal is full, read-only or failing.

The decisions this module protects:
- An environment error (no space, read-only file system, quota, I/O error, permission denied) is
  not the task's fault: it burns no attempt and fails nothing. The write that met it is held and
  tried again with backoff on the thread that made it (a lane's sink thread, the journal's
  writer), so everything already committed stays committed and the order of commits is unchanged.
- While any write is held the run is in an outage: the engine admits nothing and starts no batch
  (``Outage.active``), shows why (``OutageView``: what, the cause, the path, since when), and
  carries on by itself once every held write went through.
- The engine, not the writers, decides when to give up (``[faults] outage_timeout_s``): it calls
  ``Outage.abandon``, every held write gives up at once with ``OutageAbandoned``, and the run
  stops with nothing marked failed, so a plain resume finishes the work.
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy.typing as npt

from warpdeck.engine.edges.sinks import BatchWriter, RowsWriter, Sink, Staged, batch_writer, rows_writer
from warpdeck.engine.state.part_views import OutageView

__all__ = ["ENVIRONMENT_ERRNOS", "HeldSink", "Outage", "OutageAbandoned", "environment_cause",
           "sink_dir"]

ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EPERM})
"""Errors of the machine, not of the task: another attempt now would meet them again."""

# SQLite's primary result codes for the same causes (sqlite3.h): the journal's writer meets these.
_SQLITE_CAUSES = {3: "permission denied", 8: "read-only file system", 10: "input/output error",
                  13: "no space left on device", 14: "cannot open the journal file"}

BACKOFF_FIRST_S = 0.05
"""First wait before a held write is tried again, and the longest wait between tries."""
BACKOFF_MAX_S = 2.0

T = TypeVar("T")


_SHORT_WRITE = re.compile(r"^(\d+) requested and (\d+) written$")
"""NumPy's words for a short write to a real file (``np.save(path, a)``, ``a.tofile(f)``): an OSError with no errno.
Only the disk makes a write short (full, over quota, failing)."""


def environment_cause(exc: BaseException) -> str | None:
    """Why ``exc`` is an environment error, in words (``no space left on device``), or None for
    any other error. Looks through the chain of causes (a sink may wrap the OSError)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
            return os.strerror(e.errno).lower()
        if isinstance(e, OSError) and e.errno is None and (short := _SHORT_WRITE.match(str(e))):
            return f"short write: the disk took {short[2]} of {short[1]} items (full?)"
        if isinstance(e, sqlite3.Error):
            code = getattr(e, "sqlite_errorcode", None)
            if isinstance(code, int) and (code & 0xFF) in _SQLITE_CAUSES:
                return _SQLITE_CAUSES[code & 0xFF]
        e = e.__cause__ or e.__context__
    return None


def _where(exc: BaseException, fallback: str) -> str:
    """The directory an OSError names (``outputs/``), else ``fallback``."""
    name = getattr(exc, "filename", None)
    if isinstance(name, (str, os.PathLike)):
        return f"{Path(name).parent}{os.sep}"
    return fallback


class OutageAbandoned(Exception):
    """The engine gave up on a held write (the outage outlasted its timeout, or the run stopped).
    The task is neither done nor failed: a resume runs it again."""


@dataclass(slots=True)
class _Hold:
    what: str
    cause: str
    path: str
    since: float


class Outage:
    """Shared by the engine (on its loop) and the writers (on their threads); thread-safe."""

    def __init__(self, timeout_s: float = 600.0, t0: float | None = None) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._holds: dict[int, _Hold] = {}
        self._abandoned = threading.Event()
        self._t0 = time.perf_counter() if t0 is None else t0
        self.count = 0
        """Outages that began and ended during the run."""
        self.total_s = 0.0
        """Seconds spent in outages so far (the current one included once it ends)."""
        self.last = ""
        """The reason of the last outage that ended."""
        self._began: float | None = None

    def set_origin(self, t0: float) -> None:
        """The engine's start on ``time.perf_counter``'s clock (views count from it)."""
        self._t0 = t0

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def abandon(self) -> None:
        """Give up every held write now and every later one at once."""
        self._abandoned.set()

    def view(self) -> OutageView | None:
        """The outage now, or None when no write is held."""
        with self._lock:
            if not self._holds:
                return None
            holds = sorted(self._holds.values(), key=lambda h: h.since)
        what = ", ".join(dict.fromkeys(h.what for h in holds))
        first = holds[0]
        return OutageView(what, first.cause, first.path, first.since - self._t0, len(holds), self.timeout_s)

    def hold(self, what: str, cause: str, path: str) -> None:
        """The calling thread's write failed with ``cause``: it is held until ``release``."""
        now = time.perf_counter()
        with self._lock:
            if not self._holds:
                self._began = now
            self._holds.setdefault(threading.get_ident(), _Hold(what, cause, path, now))

    def release(self) -> None:
        """The calling thread's held write went through."""
        now = time.perf_counter()
        with self._lock:
            hold = self._holds.pop(threading.get_ident(), None)
            if hold is not None and not self._holds:
                self.last = f"{hold.what}: {hold.cause} ({hold.path})"
                self.count += 1
                if self._began is not None:
                    self.total_s += now - self._began
                self._began = None

    def retry(self, what: str, fallback_path: str, write: Callable[[], T]) -> T:
        """``write()``, held and tried again with backoff while it meets environment errors. Raises
        ``OutageAbandoned`` once the engine gives up, and any other error as it came."""
        delay = BACKOFF_FIRST_S
        held = ""
        try:
            while True:
                try:
                    return write()
                except Exception as exc:
                    cause = environment_cause(exc)
                    if cause is None:
                        raise
                    where = f"{what}: {cause} ({_where(exc, fallback_path)})"
                    if self._abandoned.is_set():
                        raise OutageAbandoned(f"{where}; the run stopped") from exc
                    if not held:
                        self.hold(what, cause, _where(exc, fallback_path))
                        held = where
                self._abandoned.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
        finally:
            if held:
                self.release()


class HeldSink:
    """A sink whose environment errors hold the write (``Outage.retry``) instead of failing it."""

    def __init__(self, sink: Sink, outage: Outage, where: str) -> None:
        self._sink = sink
        self._outage = outage
        self._where = where
        inner = batch_writer(sink)
        self.write_batch: BatchWriter | None = None if inner is None else (
            lambda keys, outs: outage.retry("sink", where, lambda: inner(keys, outs)))
        """The inner sink's ``write_batch``, held the same way (None: it writes key by key)."""
        self._inner_rows = rows_writer(sink)
        self.write_rows: RowsWriter | None = None if self._inner_rows is None else self._write_rows
        """The inner sink's ``write_rows``, whose outputs that met an environment error are held the same way."""

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        self._outage.retry("sink", self._where, lambda: self._sink.write(key, out))

    def _write_rows(self, keys: Sequence[str], outs: npt.NDArray[Any]) -> list[BaseException | None]:
        """The inner ``write_rows``; the outputs that met an environment error (a full disk) are
        written again, and only those, until they land or the engine gives up."""
        inner = self._inner_rows
        assert inner is not None
        errors: list[BaseException | None] = [None] * len(keys)
        todo = list(range(len(keys)))

        def attempt() -> None:
            nonlocal todo
            part = outs if len(todo) == len(keys) else outs[todo]
            again: list[int] = []
            held: BaseException | None = None
            for j, e in zip(todo, inner([keys[j] for j in todo], part), strict=True):
                if e is not None and environment_cause(e) is not None:
                    again.append(j)
                    held = held or e
                else:
                    errors[j] = e
            todo = again
            if held is not None:
                raise held

        self._outage.retry("sink", self._where, attempt)
        return errors

    def commit(self, keys: Sequence[str], staged: Staged) -> None:
        """Put what an actor staged in place (``StagingSink.commit`` through the wrapped sink)."""
        commit = self._sink.commit  # type: ignore[attr-defined]
        self._outage.retry("sink", self._where, lambda: commit(keys, staged))


def sink_dir(sink: Sink, run_dir: Path) -> str:
    """Where the sink writes, as an outage names it when its error names no file."""
    where = getattr(sink, "dir", None)
    return f"{where if isinstance(where, Path) else run_dir}{os.sep}"
