"""What every control-plane client shares: a thread with an event loop of its own (``LoopThread``),
reconnection with jittered exponential backoff (``keep_connected``: 0.1 s doubling to 2 s, back to
0.1 s once a connection is made), and a connection whose end is always taken note of.

The decisions this module protects:
- Five parts run an event loop on a thread of their own (a hosted engine, the control plane, each
  heartbeater, the embedded broker, an attached control room's client), so that neither their work
  nor the engine's delays the other. ``LoopThread`` is that thread, written once: ``main(stopping)``
  runs on it until it returns; ``stop()`` from any thread, before or after the loop started, sets
  ``stopping`` and waits; whatever ``main`` raises is kept (``error``) and logged with its traceback
  (the run log), never lost with the thread; a thread that outlives the wait for it says so.
- aiomqtt sets a lost connection's exception on a future (``Client._disconnected``) that only its
  message iterator reads; a loop that leaves by another way (a publish that failed first, a stop)
  never reads it, and asyncio prints "Future exception was never retrieved" with the error on
  stderr when the client is collected. ``connection`` reads it on the way out: the reconnect loop
  has already handled that error (an ``MqttError``) or is stopping.
- aiomqtt waits for every acknowledgement with ``asyncio.wait_for``, which on Python 3.11 returns
  the result when a cancellation lands in the same turn as the acknowledgement: the cancellation is
  lost, and a task that publishes in a loop goes on. ``cancel_and_wait`` cancels again until each
  task has ended (a seeded hostile flood once held the control plane's thread past its 12 s stop so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from typing import Any

import aiomqtt

from warpdeck.engine.control.mqtt_internals import disconnected

__all__ = ["FIRST_BACKOFF_S", "LoopThread", "cancel_and_wait", "connection", "keep_connected", "wait_backoff"]

_log = logging.getLogger(__name__)

FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
_JITTER = random.Random()
"""Jitter from a generator of our own: the global one belongs to the application (and a property-based test notices when
a background thread draws from it)."""


class LoopThread:
    """``main(stopping)`` on an event loop of its own, on a daemon thread named ``name``."""

    def __init__(self, name: str, main: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._main = main
        self.loop: asyncio.AbstractEventLoop | None = None
        """The thread's loop, once it runs (kept after it ends: ``call_soon`` then does nothing)."""
        self._stopping: asyncio.Event | None = None
        self._stop_asked = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        """What ``main`` raised, if it did."""

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Set ``stopping`` (from any thread; also when the loop has not started yet) and wait up to
        ``timeout`` for the thread. False, with a warning, when it is still running after that."""
        self._stop_asked = True
        stopping = self._stopping
        if stopping is not None:
            self.call_soon(stopping.set)
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            _log.warning("thread %s did not stop within %.1f s", self.name, timeout)
            return False
        return True

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for ``main`` to end (without asking it to); True once it has, or
        when the thread never started."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def call_soon(self, fn: Callable[..., object], *args: object) -> bool:
        """Run ``fn(*args)`` on the loop (from any thread); False when the loop is not running."""
        loop = self.loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # its loop already ended
            return False
        return True

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - kept and logged: a thread's end is nobody's caller
            self.error = exc
            _log.error("%s stopped on an error", self.name, exc_info=exc)

    async def _serve(self) -> None:
        self._stopping = stopping = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        if self._stop_asked:  # stop() came before the loop ran
            stopping.set()
        await self._main(stopping)


async def keep_connected(
    stopping: asyncio.Event,
    client_kwargs: Callable[[], dict[str, Any]],
    session: Callable[[aiomqtt.Client], Awaitable[None]],
    on_lost: Callable[[aiomqtt.MqttError], None],
    *,
    on_last: Callable[[aiomqtt.MqttError], None] | None = None,
) -> None:
    """Connect with ``client_kwargs()`` (called again for every attempt) and run ``session(client)``;
    when connecting fails or the connection is lost (an ``MqttError``), tell ``on_lost`` and try again
    after a jittered backoff. Returns once ``stopping`` is set (a session returns when it sees it);
    an ``MqttError`` after that is no loss to retry, told to ``on_last`` if given (the control plane
    still notes its connection's end)."""
    backoff = FIRST_BACKOFF_S
    while not stopping.is_set():
        try:
            async with connection(**client_kwargs()) as client:
                backoff = FIRST_BACKOFF_S
                await session(client)
        except aiomqtt.MqttError as exc:
            if stopping.is_set():
                if on_last is not None:
                    on_last(exc)
                return
            on_lost(exc)
            backoff = await wait_backoff(stopping, backoff)


async def wait_backoff(stopping: asyncio.Event, backoff: float) -> float:
    """Wait a jittered ``backoff`` (or until ``stopping``); return the next, doubled, backoff."""
    with contextlib.suppress(TimeoutError):
        # Not wait_for: on Python 3.11 it can swallow a cancellation that lands as the wait ends.
        async with asyncio.timeout(backoff * _JITTER.uniform(0.5, 1.0)):
            await stopping.wait()
    return min(_MAX_BACKOFF_S, backoff * 2)


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]], every_s: float = 0.1) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again every ``every_s`` any that
    carried on (see the module's docstring); then raise the first exception one of them ended with,
    other than its cancellation, as awaiting each in turn would (every one is marked retrieved)."""
    pending = set(tasks)
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=every_s)
    errors = [t.exception() for t in tasks if not t.cancelled()]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


@contextlib.asynccontextmanager
async def connection(**kwargs: Any) -> AsyncIterator[aiomqtt.Client]:
    """``async with aiomqtt.Client(**kwargs)``, retrieving the lost connection's exception on exit
    (see the module's docstring); whatever the block raises still propagates."""
    client = aiomqtt.Client(**kwargs)
    try:
        async with client:
            yield client
    finally:
        ended = disconnected(client)
        if ended is not None and ended.done() and not ended.cancelled():
            ended.exception()  # marks it retrieved
