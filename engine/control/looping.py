"""What every control-plane client shares: a thread with an event loop of its own, stopped from
any thread, reconnection with jittered exponential backoff (0.1 s doubling to 2 s), and a
connection whose end is always taken note of.

aiomqtt sets a lost connection's exception on a future (``Client._disconnected``) that only its
message iterator reads; a loop that leaves by another way (a publish that failed first, a stop)
never reads it, and asyncio prints "Future exception was never retrieved" with the error on
stderr when the client is collected. ``connection`` reads it on the way out: the reconnect loop
has already handled that error (an ``MqttError``) or is stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiomqtt

from warpdeck.engine.control.mqtt_internals import disconnected

__all__ = ["FIRST_BACKOFF_S", "connection", "stop_loop_thread", "wait_backoff"]

FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0
#: Jitter from a generator of our own: the global one belongs to the application (and a
#: property-based test notices when a background thread draws from it).
_JITTER = random.Random()


def stop_loop_thread(loop: asyncio.AbstractEventLoop | None, stopping: asyncio.Event | None,
                     thread: threading.Thread | None, timeout: float) -> None:
    """Set ``stopping`` on ``loop`` (from any thread) and wait up to ``timeout`` for ``thread``."""
    if loop is not None and stopping is not None:
        with contextlib.suppress(RuntimeError):  # its loop already ended
            loop.call_soon_threadsafe(stopping.set)
    if thread is not None:
        thread.join(timeout)


async def wait_backoff(stopping: asyncio.Event, backoff: float) -> float:
    """Wait a jittered ``backoff`` (or until ``stopping``); return the next, doubled, backoff."""
    with contextlib.suppress(TimeoutError):
        # Not wait_for: on Python 3.11 it can swallow a cancellation that lands as the wait ends.
        async with asyncio.timeout(backoff * _JITTER.uniform(0.5, 1.0)):
            await stopping.wait()
    return min(_MAX_BACKOFF_S, backoff * 2)


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
