"""Warm worker processes that work on a batch's rows in place, in a shared slot buffer.

The decisions this module protects:
- Host work that holds the GIL (decoding in Python, tokenising, a user's own ``load`` or ``write``)
  runs in processes, each with its own interpreter, so it scales with cores the way a DataLoader's
  workers do; the engine's loop keeps its core.
- A pool runs one kind of work (``RowWork``): a fill's loader writing rows (``LoadRows``), or a
  sink's writer reading them (engine/run/process_sink.py). Either way the rows stay where they are.
- One copy: a worker maps the slot's shared buffer (engine/backends/shared_memory.py) and its loader
  writes each row in place (a writer reads them there). What travels back is each item's error (or
  None) and the CPU the batch cost, never the rows. Rows not in a shared buffer (a few of a batch,
  picked out) travel in the message instead. A loader with a ``load_batch(handles, out)`` method (an
  items source's ``ItemLoader``) is handed the batch's rows in one call and answers per item the
  same way; any other is called row by row.
- Workers are started once and stay warm; each unpickles its work once, so the user's module is
  imported once per worker. Each is a fresh interpreter (``python -c``, the engine's ``sys.path``
  handed over): nothing forks the engine's own process, whose threads and CUDA context a fork would
  copy half-made, and, unlike multiprocessing's spawn and forkserver, no worker runs the user's
  ``__main__`` again (a script without an ``if __name__ == "__main__"`` guard would start its run
  once more in every worker). So a loader must live in an importable module, never ``__main__``.
- A lane's fill thread checks out one idle worker for one batch and waits on its pipe with the GIL
  released. A worker that dies (SIGKILL, a segfault in a decoder, out of memory) or outlives the
  deadline fails only the batch it held (``WorkerLost``: its tasks are retried) and is replaced
  before the next batch.
- A worker ends when the engine's end of its socket closes, and a watch thread in it ends it when
  its parent changes (the engine died), so a SIGKILL of the engine leaves no worker running, not
  even one busy in a long item.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.connection as mpc
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.shared_memory import attach

__all__ = ["LoadRows", "ProcessPool", "RowLoader", "RowWork", "Rows", "WorkerLost", "WorkerView", "worker_main"]

RowLoader = Callable[[Any, npt.NDArray[Any]], None]
"""``loader(handle, row)``: writes one item's input into ``row`` in place (runs in a worker)."""
RowWork = Callable[[Any, npt.NDArray[Any]], list[BaseException | None]]
"""``work(payload, rows)``: one batch's work on its rows, in a worker; each row's error or None. A
failure of the whole batch is one exception in every row's place."""
Rows = tuple[str, int, int, tuple[int, ...], str] | npt.NDArray[Any]
"""Where a batch's rows are, as a worker finds them: in a shared buffer (its path, its size, the
rows' byte offset in it, their shape and dtype), or the rows themselves."""

_MAPPED_MAX = 32
"""Buffers a worker keeps mapped (a slot that grew leaves its old buffer behind)."""
_START_S = 120.0
"""How long a new worker may take to start and import the loader's module."""
_ORPHAN_POLL_S = 0.5
"""How often a worker looks whether the engine that started it is still there."""


class WorkerLost(RuntimeError):
    """The worker process working on a batch died or hung; the batch's tasks may be tried again."""

    def __init__(self, pid: int | None, why: str, role: str = "fill") -> None:
        super().__init__(f"{role} worker process {pid}: {why}")
        self.pid = pid
        self.why = why


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as the report and the control room show it."""

    pid: int
    jobs: int
    busy_s: float
    """Seconds it spent on batches since it started, and its age in seconds."""
    age_s: float

    @property
    def busy_share(self) -> float:
        return self.busy_s / self.age_s if self.age_s > 0 else 0.0


class _RemoteError(Exception):
    """An item's error that could not be sent back as itself (not picklable)."""


def _portable(exc: BaseException) -> tuple[BaseException | None, str, str]:
    """What travels back for a failed item: the exception itself when it pickles (an input error
    stays one: it is not retried), its words, and its traceback as text."""
    tb = "".join(traceback.format_exception(exc)).rstrip()
    words = f"{type(exc).__name__}: {exc}"
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - anything that stops it travelling
        return None, words, tb
    return exc, words, tb


def _revive(sent: tuple[BaseException | None, str, str] | None) -> BaseException | None:
    if sent is None:
        return None
    exc, words, tb = sent
    err = exc if exc is not None else _RemoteError(words)
    err.remote_traceback = tb  # type: ignore[attr-defined] # kept with the failed task (records.format_exception)
    return err


def _serve(conn: mpc.Connection) -> None:
    """A worker's life: unpickle its work, then work on batches until the engine closes the socket."""
    try:
        blob = conn.recv_bytes()
        work: RowWork = pickle.loads(blob)
    except BaseException as exc:  # noqa: BLE001 - said to the engine, which names it
        with contextlib.suppress(OSError):
            conn.send(("failed", "".join(traceback.format_exception(exc)).rstrip()))
        return
    conn.send(("ready", os.getpid()))
    mapped: OrderedDict[str, npt.NDArray[np.uint8]] = OrderedDict()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the engine is gone, or let this worker go
        if msg is None:
            return
        rows, payload = msg
        c0 = time.thread_time()
        sent = _portables(work(payload, _rows(rows, mapped)))
        try:
            conn.send((sent, time.thread_time() - c0))
        except (EOFError, OSError):
            return


def _rows(rows: Rows, mapped: OrderedDict[str, npt.NDArray[np.uint8]]) -> npt.NDArray[Any]:
    """In a worker: the batch's rows, mapped from their shared buffer (kept mapped for the next
    batches) or as they came."""
    if isinstance(rows, np.ndarray):
        return rows
    where, nbytes, offset, shape, dtype = rows
    buf = mapped.get(where)
    if buf is None or buf.size < nbytes:
        buf = mapped[where] = attach(where, nbytes)
        while len(mapped) > _MAPPED_MAX:
            mapped.popitem(last=False)
    mapped.move_to_end(where)
    dt = np.dtype(dtype)
    return buf[offset: offset + int(np.prod(shape)) * dt.itemsize].view(dt).reshape(shape)


def _portables(raised: Sequence[BaseException | None]) -> list[tuple[BaseException | None, str, str] | None]:
    """Each row's error as it travels back (``_portable``). A batch that failed as one shares one
    exception: it is formatted and pickled once."""
    sent: dict[int, tuple[BaseException | None, str, str]] = {}
    for e in raised:
        if e is not None and id(e) not in sent:
            sent[id(e)] = _portable(e)
    return [None if e is None else sent[id(e)] for e in raised]


@dataclass(frozen=True, slots=True)
class LoadRows:
    """A fill's work in a worker: ``loader`` writes each handle's item into its row, by its
    ``load_batch`` where it has one, else row by row."""

    loader: RowLoader

    def __call__(self, handles: Sequence[Any], out: npt.NDArray[Any]) -> list[BaseException | None]:
        whole = getattr(self.loader, "load_batch", None)
        if whole is None:
            errors: list[BaseException | None] = []
            for j, handle in enumerate(handles):
                try:
                    self.loader(handle, out[j])
                    errors.append(None)
                except Exception as exc:  # noqa: BLE001 - each item fails alone
                    errors.append(exc)
            return errors
        try:
            raised: list[BaseException | None] = whole(handles, out[: len(handles)])
        except Exception as exc:  # noqa: BLE001 - a loader's own slip: every item of the batch, as itself
            raised = [exc] * len(handles)
        return raised


def _parts(work: Any) -> list[Any]:
    """The work and the functions it is made of (a dataclass's callable fields, and theirs: an
    ``ItemLoader``'s ``load`` and ``load_batch`` in a ``LoadRows``), each of which a worker must
    import by its module."""
    held = [getattr(work, f.name) for f in fields(work)] if is_dataclass(work) else []
    return [work, *(p for f in held if callable(f) for p in _parts(f))]


def _orphan_watch(parent: int) -> None:
    """In a worker: end the process once its parent (the engine) is gone, even mid-item."""
    while os.getppid() == parent:
        time.sleep(_ORPHAN_POLL_S)
    os._exit(3)


def worker_main(fd: int, parent: int, path_json: str) -> None:
    """A worker process's entry (``python -c``): the engine's ``sys.path``, the watch, then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's to handle: it stops the pool
    sys.path[:0] = [p for p in json.loads(path_json) if p not in sys.path]
    threading.Thread(target=_orphan_watch, args=(parent,), name="orphan-watch", daemon=True).start()
    _serve(mpc.Connection(fd))


_BOOT = ("import sys; from warpdeck.engine.backends.process_pool import worker_main; "
         "worker_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])")
"""A worker's program: ``python -c _BOOT FD PARENT_PID SYS_PATH_JSON``."""


_ONE_THREAD = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
"""A worker's native math libraries on one thread each, unless the engine's environment says otherwise: a pool has a
worker per core already (a DataLoader's workers set torch's threads to 1 for the same reason), and OpenBLAS starting a
thread per core took a third of each worker's start (0.31 -> 0.22 s of CPU on the 2-core VM)."""


@dataclass(frozen=True, slots=True)
class _StartFailed:
    pid: int | None
    why: str


class _Worker:
    def __init__(self, blob: bytes, name: str) -> None:
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        # The engine's sys.path reaches the worker first in its PYTHONPATH (so ``warpdeck`` imports
        # whatever way the engine found it), then in full once it runs.
        env = {**_ONE_THREAD, **os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(fd), str(os.getpid()), json.dumps(sys.path)],
            pass_fds=(fd,), env=env, stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()  # the worker's end lives in the worker only: its death reads as end of file here
        self.conn = mpc.Connection(mine.detach())
        self.conn.send_bytes(blob)
        self.name = name
        self.pid: int | None = self.proc.pid
        self.ready = False
        self.jobs = 0
        self.busy_s = 0.0
        self.born = time.perf_counter()

    def view(self) -> WorkerView:
        return WorkerView(self.pid or 0, self.jobs, self.busy_s, time.perf_counter() - self.born)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(0.0, timeout))

    def stop(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.join(timeout)
        if self.alive():
            self.proc.kill()
            self.join(timeout)
        self.conn.close()

    def kill(self) -> None:
        self.proc.kill()
        self.join(5.0)
        self.conn.close()

    def ended(self) -> str:
        """How a worker that stopped answering ended, in words."""
        self.join(1.0)
        code = self.proc.returncode
        if code is None:
            return "stopped answering"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
        return f"exited with status {code}"


class ProcessPool:
    """``workers`` warm processes running ``work``; ``run`` hands one a batch. ``role`` names them
    (``fill``, ``sink``) in their process names and errors."""

    def __init__(self, name: str, work: RowWork, workers: int = 1, deadline_s: float = 300.0,
                 role: str = "fill") -> None:
        what = "loader" if role == "fill" else "writer"
        for part in _parts(work):
            if (getattr(part, "__module__", None) or type(part).__module__) == "__main__":
                raise ValueError(f"the {what} {part!r} is defined in __main__, which a worker process does not run: "
                                 "define it in a module")
        try:
            self._blob = pickle.dumps(work)
        except Exception as exc:
            raise ValueError(f"the {what} {work!r} cannot be sent to a worker process "
                             f"({type(exc).__name__}: {exc}): make it a module-level function") from exc
        self.role = role
        self._what = what
        self.name = name
        self.deadline_s = deadline_s
        self._size = max(1, int(workers))
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue[_Worker | _StartFailed | None] = queue.SimpleQueue()
        """Started workers free for a batch; a failed start; None: closed."""
        self._workers: list[_Worker] = []
        self._started = 0
        self._closed = False
        self.ready_at = 0.0
        """When the newest worker finished starting (``time.perf_counter``; 0: none yet)."""
        self.replaced = 0
        """Workers that died or hung and were replaced."""
        self.losses: list[tuple[int, str]] = []
        """Each replaced worker's pid and how it ended, newest last (the report names them)."""

    @property
    def workers(self) -> int:
        return self._size

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._workers if w.pid]

    def views(self) -> tuple[WorkerView, ...]:
        with self._lock:
            return tuple(w.view() for w in self._workers)

    def resize(self, workers: int) -> int:
        """Run ``workers`` processes from now on: new ones start at once (once the pool has started);
        surplus ones stop when they next come back idle."""
        with self._lock:
            self._size = max(1, int(workers))
            if self._workers and not self._closed:
                self._staff()
        return self._size

    def start(self) -> None:
        """Start the workers now rather than with the first batch."""
        with self._lock:
            if not self._closed:
                self._staff()

    @property
    def warming(self) -> bool:
        """Whether a worker is still starting (a tuner judging the pool's size waits for it)."""
        with self._lock:
            return any(not w.ready for w in self._workers)

    def _staff(self) -> None:
        while len(self._workers) < self._size:
            self._started += 1
            w = _Worker(self._blob, f"{self.name}-{self._started}")
            self._workers.append(w)
            threading.Thread(target=self._await_ready, args=(w,), name=f"{w.name}-start", daemon=True).start()

    def _await_ready(self, w: _Worker) -> None:
        """A new worker joins the idle ones once it has started and loaded the loader, so a batch
        never waits for an interpreter to start while a started worker is free, and the time a
        start takes is never counted as loading. A start that fails is said to the next batch."""
        try:
            said = self._answer(w, _START_S)
            why = "" if said[0] == "ready" else f"could not load the {self._what}:\n{said[1]}"
        except (EOFError, OSError, WorkerLost) as exc:
            why = f"did not start: {exc.why if isinstance(exc, WorkerLost) else w.ended()}"
        if not why:
            w.ready = True
            self.ready_at = time.perf_counter()
            self._idle.put(w)
            return
        self._replace(w, why, restart=False)  # restarted by the batch that hears of it, not in a loop
        self._idle.put(_StartFailed(w.pid, why))

    def run(self, rows: Rows, payload: Any) -> tuple[list[BaseException | None], float]:
        """Have one worker do the pool's work on one batch: ``payload`` and the ``rows`` (where they
        are, or themselves); each row's error (or None), and the CPU seconds it took. Blocks (a
        host thread): waits for an idle worker, then for its answer."""
        w = self._checkout()
        t0 = time.perf_counter()
        try:
            msg = pickle.dumps((rows, payload))
        except Exception as exc:
            self._checkin(w)  # nothing was sent: the worker is as it was
            raise ValueError(f"a handle of this batch cannot be sent to a {self.role} worker process "
                             f"({type(exc).__name__}: {exc})") from exc
        try:
            w.conn.send_bytes(msg)
            answer = self._answer(w, self.deadline_s)
        except (EOFError, OSError, WorkerLost) as exc:
            why = exc.why if isinstance(exc, WorkerLost) else w.ended()
            self._replace(w, why)
            raise WorkerLost(w.pid, why, self.role) from None
        w.jobs += 1
        w.busy_s += time.perf_counter() - t0
        self._checkin(w)
        errors, cpu = answer
        # One failure sent for several items (a batch load that raised) stays one exception here, so
        # the engine can tell the batch failed as a whole and retry its items one per batch.
        revived: dict[int, BaseException | None] = {}
        for e in errors:
            if id(e) not in revived:
                revived[id(e)] = _revive(e)
        return [revived[id(e)] for e in errors], float(cpu)

    def load(self, where: str, nbytes: int, shape: Sequence[int], dtype: np.dtype[Any],
             handles: Sequence[Any]) -> tuple[list[BaseException | None], float]:
        """``run`` for a fill: ``handles[j]`` into row j of the buffer at ``where`` (``nbytes``, seen
        from its start as ``shape``/``dtype``)."""
        return self.run((where, nbytes, 0, tuple(shape), np.dtype(dtype).str), list(handles))

    def _answer(self, w: _Worker, timeout: float) -> Any:
        if not w.conn.poll(timeout):
            w.kill()
            raise WorkerLost(w.pid, f"no answer after {timeout:g} s: hung, killed", self.role)
        return w.conn.recv()

    def _checkout(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the pool is closed")
            if not self._workers:
                self._staff()
        w = self._idle.get()
        if w is None:  # closed while waiting: wake the next waiter too
            self._idle.put(None)
            raise RuntimeError(f"{self.name}: the pool is closed")
        if isinstance(w, _StartFailed):
            with self._lock:
                if not self._closed:
                    self._staff()
            raise WorkerLost(w.pid, w.why, self.role)
        return w

    def _checkin(self, w: _Worker) -> None:
        with self._lock:
            surplus = len(self._workers) > self._size or self._closed
            if surplus:
                self._workers.remove(w)
        if surplus:
            w.stop()
        else:
            self._idle.put(w)

    def _replace(self, w: _Worker, why: str, restart: bool = True) -> None:
        if w.alive():
            w.kill()
        with contextlib.suppress(OSError):
            w.conn.close()
        with self._lock:
            if w in self._workers:
                self._workers.remove(w)
            self.replaced += 1
            self.losses.append((w.pid or 0, why))
            if restart and not self._closed:
                self._staff()

    def close(self, timeout: float = 5.0) -> None:
        """Stop every worker (those busy are killed after ``timeout``); safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
        self._idle.put(None)  # a fill thread waiting for a worker gives up
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(deadline - time.monotonic())
            if w.alive():
                w.proc.kill()
                w.join(timeout)
            w.conn.close()
