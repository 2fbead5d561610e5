"""A Ray actor killed (SIGKILL) or frozen (SIGSTOP) while it holds batches: convicted, its batches
requeued under the epoch fence (a new attempt each) and completed; every output written exactly
once and equal to what the stage computes; the actor comes back under a newer epoch and takes work
again. A fenced batch is given up at once (its result, if it ever comes, is never written). Real
Ray, real Mosquitto, the actor's real process."""

from __future__ import annotations

import os
import signal
from types import ModuleType
from typing import Any

from wd_broker import Mosquitto
from wd_build import spec as build_spec
from wd_control import EngineThread, wait_for
from wd_stages import RecordingSink, assert_doubled_once

from warpdeck.engine.api import Pause, PipelineSpec, Resume

COUNT = 480
BATCH = 8


def _spec(name: str) -> PipelineSpec:
    # 40 ms per batch of 8 (the stage sleeps): a run of a few seconds, long enough to kill into.
    return build_spec(["wd_stages:slow_double_40ms"], name=name, executor="ray", batch_size=BATCH,
                      source={"kind": "synthetic", "count": COUNT, "shape": [4], "dtype": "float32", "seed": 3})


def _busy_victim(et: EngineThread) -> tuple[Any, Any, int, int]:
    """The engine, and actor ray-1 once it is working with batches in hand: its pid and epoch."""
    eng = et.engine
    assert eng is not None and eng.executor is not None
    victim = eng.executor.workers[1]
    wait_for(lambda: victim.batches_done >= 2 and len(eng.leases.leased_to(victim.id)) >= 2, 60,
             "ray-1 working, batches in hand")
    assert victim.hello is not None
    return eng, victim, victim.hello.pid, victim.epoch


def _resume_and_finish(et: EngineThread, victim: Any, took_work: str) -> Any:
    """Resume the paused run, wait for its end; the victim must have done batches since."""
    done_before = victim.batches_done
    assert et.command(Resume()).ok
    wait_for(et.finished, 60, "run finished")
    report = et.report
    assert report.counts.done == COUNT and report.counts.failed == 0
    assert victim.batches_done > done_before, took_work
    return report


def test_a_killed_actor_loses_nothing_and_comes_back(ray_cluster: ModuleType, mosquitto: Mosquitto) -> None:
    sink = RecordingSink()
    with EngineThread(_spec("ray-kill"), mosquitto.address, sink=sink) as et:
        eng, victim, old_pid, old_epoch = _busy_victim(et)
        os.kill(old_pid, signal.SIGKILL)
        # Hold new batches until ray-1 is back, so that work is left for it whatever the timing.
        assert et.command(Pause()).ok
        wait_for(lambda: eng.leases.reclaimed >= 1, 10, "ray-1 convicted, its batches taken back")
        wait_for(lambda: victim.epoch > old_epoch, 60, "ray-1 restarted by Ray under a newer epoch")
        assert victim.hello is not None and victim.hello.pid != old_pid
        report = _resume_and_finish(et, victim, "the restarted actor took work again")
    assert_doubled_once(sink, COUNT)
    attempts = eng.table.attempt[: len(eng.table)]
    assert int((attempts == 2).sum()) == BATCH * eng.leases.reclaimed, "each taken-back task ran a second attempt"
    assert set(attempts.tolist()) == {1, 2}  # numbered from 1
    assert "ray-1" in report.control.workers_lost


def test_a_frozen_actor_is_given_up_at_once_and_re_born_when_it_wakes(ray_cluster: ModuleType,
                                                                        mosquitto: Mosquitto) -> None:
    sink = RecordingSink()
    with EngineThread(_spec("ray-freeze"), mosquitto.address, sink=sink) as et:
        eng, victim, pid, old_epoch = _busy_victim(et)
        os.kill(pid, signal.SIGSTOP)
        try:
            assert et.command(Pause()).ok  # hold new batches: work is left for ray-1 once it wakes
            # Silent: convicted by the monitor (phi / backstop); Ray says nothing (the process lives).
            wait_for(lambda: eng.leases.reclaimed >= 1, 15, "frozen ray-1 convicted")
            # Its fenced batches are given up at once (rejected): the engine does not wait for them.
            wait_for(lambda: eng.leases.rejected == eng.leases.reclaimed, 5, "its batches given up")
            assert not any(ln.inflight_ids() for ln in eng.lanes if ln.worker is victim)  # type: ignore[union-attr]
            assert eng.executor.convictions[0].why == "silent"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: victim.epoch > old_epoch, 30, "ray-1 re-born under a newer epoch")
        assert victim.hello is not None and victim.hello.pid == pid, "the same process, re-born (not restarted)"
        _resume_and_finish(et, victim, "the re-born actor took work again")
    assert eng.leases.rejected == eng.leases.reclaimed >= 1
    assert_doubled_once(sink, COUNT)
