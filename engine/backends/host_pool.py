"""A stream's threads: a pool whose size can change while it runs (one thread: a device stream).

The decisions this module protects:
- Jobs start in submission order (one FIFO queue), so a lane's fills and sinks begin in batch
  order; they may finish out of order, and the lane takes their results in order (engine/run/lanes.py).
- The size changes without stopping anything: growing starts threads at once (once the pool has
  had a job); shrinking posts one stop token per thread to let go, behind the jobs already queued,
  so no job is dropped.
- Threads start with the first job, as ``ThreadPoolExecutor``'s do: a lane built and never run (an
  engine whose start failed, one made only for its snapshot) leaves no thread behind.
- ``concurrent.futures.ThreadPoolExecutor`` cannot shrink and its size is private, hence this.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from warpdeck.engine.backends.completion import Completion

__all__ = ["HostPool"]

_Job = tuple[Completion, Callable[[], Any]]


class HostPool:
    """An executor of ``workers`` threads named ``name-N``, resizable with ``resize``."""

    def __init__(self, name: str, workers: int = 1) -> None:
        self.name = name
        self._q: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._size = max(1, int(workers))
        self._running = 0  # threads started and not told to stop: _size once the first job came
        self._started = 0
        self._shutdown = False

    @property
    def workers(self) -> int:
        """The threads this pool runs jobs on (after a shrink, those letting go are not counted;
        after shutdown, the size it had)."""
        return self._size

    def resize(self, workers: int) -> int:
        """Run on ``workers`` threads (at least one) from now on; returns the size set."""
        workers = max(1, int(workers))
        with self._lock:
            if self._shutdown:
                return self._size
            self._size = workers
            if self._running:
                self._staff()
        return workers

    def _staff(self) -> None:
        """Start or let go of threads until ``_size`` run (under the lock)."""
        while self._running < self._size:
            self._started += 1
            t = threading.Thread(target=self._work, name=f"{self.name}-{self._started}", daemon=True)
            self._threads.append(t)
            t.start()
            self._running += 1
        while self._running > self._size:
            self._q.put(None)  # one thread lets go once the jobs queued before it have started
            self._running -= 1
        self._threads = [t for t in self._threads if t.is_alive()]

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Completion:
        """Run ``fn(*args, **kwargs)`` on one of the pool's threads; its completion."""
        f = Completion()
        self.submit_into(f, (lambda: fn(*args, **kwargs)) if args or kwargs else fn)
        return f

    def submit_into(self, f: Completion, fn: Callable[[], Any]) -> None:
        """``submit``, completing a future the caller made (a stream's marker holds it before
        its job exists: one future per job, not two)."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self.name}: cannot submit after shutdown")
            self._q.put((f, fn))
            if not self._running:
                self._staff()

    def _work(self) -> None:
        while (item := self._q.get()) is not None:
            f, fn = item
            if not f.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - the job's failure belongs to its future
                f.set_exception(exc)
            else:
                f.set_result(result)
            del item, f, fn

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            letting_go = 0  # stop tokens of earlier shrinks: their threads still need them
            if cancel_futures:
                while True:
                    try:
                        item = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        letting_go += 1
                    else:
                        item[0].cancel()
            for _ in range(self._running + letting_go):
                self._q.put(None)
            # ``workers`` keeps the last size: a finished run's report says what it ran with.
            threads = list(self._threads)
        if wait:
            for t in threads:
                t.join()
