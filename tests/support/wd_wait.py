"""Waiting on a condition inside an async test without blocking its event loop.

``wd_control.wait_for`` sleeps the calling thread: right for a sync test, whose engine runs on a
thread of its own, but in an async test it would stop that test's loop, so an aiomqtt client on it
would read nothing and miss its keepalives meanwhile. ``until`` checks the same way and sleeps on
the loop instead. It polls because what it waits for (the state of an engine on another thread, a
counter of the broker's traffic) has no event on this loop to wait on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(cond: Callable[[], object], limit_s: float, what: str = "condition", step: float = 0.01) -> float:
    """Check ``cond`` every ``step`` seconds until true; returns the seconds it took; fails after ``limit_s``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit_s:
            raise AssertionError(f"{what} not met within {limit_s} s")
        await asyncio.sleep(step)
    return time.monotonic() - t0
