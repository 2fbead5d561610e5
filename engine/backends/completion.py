"""A stream job's completion: what a marker holds, at a fraction of a ``concurrent.futures.Future``'s cost.

The decision this module protects: a batch makes about ten of these and the engine's loop looks at
them dozens of times per batch. A ``cf.Future`` enters a Python-level ``threading.Condition`` on
every look (``done``, ``exception``, ``result``, ``add_done_callback``): measured on a batch of one
task, 45 condition entries and 9 conditions made per batch, 40 % of the loop's CPU. Here a look at
a finished completion is an attribute read; a C lock is taken only to change its state or add a
callback; a thread that blocks on one gets an event made for it then.

It keeps ``cf.Future``'s contract where the engine uses it: ``set_running_or_notify_cancel``,
``cancel`` (only before the job runs), results and exceptions with a timeout, callbacks that run
once, at once when added to a finished one. ``wait_async`` is the asyncio bridge.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Completion", "JobEnd", "wait_async"]

_PENDING, _RUNNING, _FINISHED, _CANCELLED = range(4)
_log = logging.getLogger(__name__)


class Completion:
    """The end of one job: its result or exception, or cancelled before it ran."""

    __slots__ = ("_callbacks", "_event", "_exc", "_lock", "_result", "_state")

    def __init__(self) -> None:
        self._state = _PENDING
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Completion], None]] | None = None
        self._lock = threading.Lock()
        self._event: threading.Event | None = None

    def __repr__(self) -> str:
        return f"<Completion {('pending', 'running', 'finished', 'cancelled')[self._state]}>"

    def done(self) -> bool:
        """Finished or cancelled (never blocks)."""
        return self._state >= _FINISHED

    def running(self) -> bool:
        return self._state == _RUNNING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self) -> bool:
        """Cancel a job that has not started; True if it is cancelled now."""
        with self._lock:
            if self._state == _CANCELLED:
                return True
            if self._state != _PENDING:
                return False
            self._state = _CANCELLED
            callbacks, event = self._take()
        self._settle(callbacks, event)
        return True

    def set_running_or_notify_cancel(self) -> bool:
        """Before running the job: False if it was cancelled (then it must not run)."""
        with self._lock:
            if self._state == _CANCELLED:
                return False
            if self._state != _PENDING:
                raise cf.InvalidStateError(f"{self!r} cannot start")
            self._state = _RUNNING
            return True

    def set_result(self, result: Any) -> None:
        self._finish(result, None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(None, exc)

    def _finish(self, result: Any, exc: BaseException | None) -> None:
        with self._lock:
            if self._state >= _FINISHED:
                raise cf.InvalidStateError(f"{self!r} already ended")
            self._result, self._exc = result, exc
            self._state = _FINISHED
            callbacks, event = self._take()
        self._settle(callbacks, event)

    def _take(self) -> tuple[list[Callable[[Completion], None]] | None, threading.Event | None]:
        callbacks, self._callbacks = self._callbacks, None
        return callbacks, self._event

    def _settle(self, callbacks: list[Callable[[Completion], None]] | None, event: threading.Event | None) -> None:
        if event is not None:
            event.set()
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - as cf.Future: logged, the others still run
                _log.exception("a completion's callback raised")

    def add_done_callback(self, fn: Callable[[Completion], None]) -> None:
        """Call ``fn(self)`` once done: from the thread that ends the job, or at once if it has."""
        if self._state < _FINISHED:
            with self._lock:
                if self._state < _FINISHED:
                    if self._callbacks is None:
                        self._callbacks = [fn]
                    else:
                        self._callbacks.append(fn)
                    return
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - as cf.Future: logged, not raised into the caller
            _log.exception("a completion's callback raised")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done, at most ``timeout`` seconds; whether it is done."""
        if self._state >= _FINISHED:
            return True
        with self._lock:
            if self._state >= _FINISHED:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The job's result; raises its exception, ``cf.CancelledError`` or ``TimeoutError``."""
        exc = self.exception(timeout)
        if exc is not None:
            raise exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The job's exception (None: it succeeded); raises ``cf.CancelledError`` or ``TimeoutError``."""
        if self._state < _FINISHED and not self.wait(timeout):
            raise TimeoutError(f"{self!r} not done after {timeout}s")
        if self._state == _CANCELLED:
            raise cf.CancelledError
        return self._exc


JobEnd = Completion | cf.Future[Any]
"""What a marker holds: a completion, or a ``cf.Future`` (a device event's ``landed``, a test's)."""


async def wait_async(fut: JobEnd) -> None:
    """Wait from asyncio until ``fut`` is done, without blocking the loop. Cancelling the waiter
    leaves the job alone. Raises nothing: read the outcome from ``fut``."""
    if fut.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            loop.call_soon_threadsafe(_set_done, waiter)

    fut.add_done_callback(wake)
    await waiter


def _set_done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
