"""The host hears that device work ended when it ends: a waiter thread per stream, never a poll.

CuPy's job-end events are waited on by one thread per stream (``_Waiter``), which completes each
event's ``landed`` future; markers and dependent jobs wait on that future. The events here are
stand-ins whose ``done`` never turns true, so only that path can finish a wait: a poll of ``done``
would wait forever. The real events run in tests/gpu and benchmarks/gpu.py, on a card.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest

from warpdeck.engine.backends.base import Marker, StreamSet, chain_release
from warpdeck.engine.backends.cupy_backend import _Landing, _Waiter
from warpdeck.engine.state.task_states import Phase


class _SilentEvent:
    """A CUDA event stand-in: ``synchronize`` blocks until ``finish``; ``done`` never says so."""

    done = False

    def __init__(self, error: Exception | None = None) -> None:
        self._finished = threading.Event()
        self._error = error

    def finish(self) -> None:
        self._finished.set()

    def synchronize(self) -> None:
        self._finished.wait()
        if self._error is not None:
            raise self._error


def _watched(waiter: _Waiter, error: Exception | None = None) -> tuple[_SilentEvent, _Landing]:
    ev = _SilentEvent(error)
    landing = _Landing(ev)
    waiter.watch(landing)
    return ev, landing


def _device_marker(landing: _Landing) -> Marker:
    fut: cf.Future[_Landing] = cf.Future()
    fut.set_result(landing)  # the job has run: it queued the work and returned its end
    return Marker(Phase.H2D, fut, device=True)


def test_the_waiter_lands_events_in_order_and_passes_on_the_devices_error() -> None:
    waiter = _Waiter("warpdeck-test-landed")
    (a, la), (b, lb) = _watched(waiter), _watched(waiter, RuntimeError("illegal address"))
    assert not la.done and not lb.done
    a.finish()
    la.landed.result(timeout=5)
    assert not lb.landed.done()
    b.finish()
    with pytest.raises(RuntimeError, match="illegal address"):
        lb.landed.result(timeout=5)
    waiter.close()
    assert not any(t.name == "warpdeck-test-landed" for t in threading.enumerate())


async def test_a_marker_wakes_when_its_work_lands() -> None:
    waiter = _Waiter("warpdeck-test-landed")
    ev, landing = _watched(waiter)
    marker = _device_marker(landing)
    task = asyncio.ensure_future(marker.wait(timeout=10))
    await asyncio.sleep(0.05)
    assert not task.done()
    t = time.perf_counter()
    ev.finish()
    await task
    assert time.perf_counter() - t < 1.0  # woken by the landing, not by a timeout
    assert marker.t1 >= t
    waiter.close()


async def test_a_marker_whose_work_never_lands_times_out() -> None:
    waiter = _Waiter("warpdeck-test-landed")
    ev, landing = _watched(waiter)
    with pytest.raises(TimeoutError):
        await _device_marker(landing).wait(timeout=0.05)
    ev.finish()
    waiter.close()


def test_a_host_job_waits_for_the_device_work_it_depends_on() -> None:
    # A sink job depends on a d2h: it runs once the copy has landed, on the stream set's thread.
    waiter = _Waiter("warpdeck-test-landed")
    ev, landing = _watched(waiter)
    release = Marker(Phase.SINK, cf.Future(), device=True)
    chain_release(_device_marker(landing), release)
    streams = StreamSet(0)
    ran = streams.submit(Phase.SINK, time.perf_counter, [release])
    time.sleep(0.05)
    assert not ran.future.done()
    t = time.perf_counter()
    ev.finish()
    assert ran.future.result(timeout=5) >= t
    streams.close()
    waiter.close()
