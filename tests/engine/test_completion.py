"""A stream job's ``Completion`` keeps ``concurrent.futures.Future``'s contract where the engine uses it."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest

from warpdeck.engine.backends.completion import Completion, wait_async
from warpdeck.engine.backends.host_pool import HostPool


def test_callbacks_run_once_in_order_and_at_once_when_added_late() -> None:
    c = Completion()
    heard: list[str] = []
    c.add_done_callback(lambda f: heard.append(f"a:{f.result()}"))
    c.add_done_callback(lambda f: heard.append(f"b:{f.result()}"))
    assert heard == [] and not c.done()
    c.set_result(7)
    c.add_done_callback(lambda f: heard.append(f"late:{f.result()}"))
    assert heard == ["a:7", "b:7", "late:7"]
    with pytest.raises(cf.InvalidStateError):
        c.set_result(8)  # ended once
    assert c.result() == 7


def test_a_raising_callback_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    c = Completion()
    heard: list[int] = []
    c.add_done_callback(lambda f: 1 / 0)  # type: ignore[arg-type,return-value]
    c.add_done_callback(lambda f: heard.append(1))
    c.set_result(None)
    assert heard == [1]
    assert "callback raised" in caplog.text


def test_exceptions_timeouts_and_cancel_as_a_future_has_them() -> None:
    c = Completion()
    with pytest.raises(TimeoutError):
        c.result(timeout=0.01)
    c.set_exception(ValueError("bad row"))
    assert isinstance(c.exception(), ValueError)
    with pytest.raises(ValueError, match="bad row"):
        c.result()
    pending = Completion()
    assert pending.cancel() and pending.cancelled() and pending.done()
    assert not pending.set_running_or_notify_cancel()  # a cancelled job must not run
    with pytest.raises(cf.CancelledError):
        pending.result()
    running = Completion()
    assert running.set_running_or_notify_cancel()
    assert not running.cancel()  # a running job runs to its end


def test_a_thread_blocked_on_one_wakes_when_another_thread_ends_it() -> None:
    c = Completion()
    threading.Timer(0.05, c.set_result, ("ok",)).start()
    t = time.perf_counter()
    assert c.result(timeout=5) == "ok"
    assert time.perf_counter() - t < 2.0


def test_a_pool_runs_jobs_into_completions_and_drops_the_unstarted_at_shutdown() -> None:
    pool = HostPool("warpdeck-test-pool", 1)
    gate = threading.Event()
    first = pool.submit(lambda: gate.wait(5))
    later = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert first.result(timeout=5) is True
    assert later.cancelled()


async def test_wait_async_wakes_the_loop_and_a_cancelled_waiter_leaves_the_job_alone() -> None:
    c = Completion()
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, lambda: threading.Thread(target=c.set_result, args=(1,)).start())
    await asyncio.wait_for(wait_async(c), 5)
    assert c.result() == 1
    other = Completion()
    waiter = asyncio.create_task(wait_async(other))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not other.done()
    other.set_result(2)  # the waiter is gone: ending the job later harms nothing
    await asyncio.sleep(0.01)
