"""A Ray actor killed (SIGKILL) or frozen (SIGSTOP) while it holds batches: convicted, its batches
requeued under the epoch fence (a new attempt each) and completed; every output written exactly
once and equal to what the stage computes; the actor comes back under a newer epoch and takes work
again. Real Ray, real Mosquitto, the actor's real process."""

from __future__ import annotations

import asyncio
import os
import signal
from types import ModuleType

import numpy as np
from wd_broker import Mosquitto
from wd_build import spec as build_spec
from wd_control import EngineThread, wait_for
from wd_stages import RecordingSink

from warpdeck.engine.api import Command, CommandResult, Pause, PipelineSpec, Resume
from warpdeck.engine.sources import synthetic_values

COUNT = 480
BATCH = 8


def _spec(name: str) -> PipelineSpec:
    # 40 ms per batch of 8 (the stage sleeps): a run of a few seconds, long enough to kill into.
    return build_spec(["wd_stages:slow_double_40ms"], name=name, executor="ray", batch_size=BATCH,
                      source={"kind": "synthetic", "count": COUNT, "shape": [4], "dtype": "float32", "seed": 3})


def _command(et: EngineThread, cmd: Command) -> CommandResult:
    assert et.engine is not None and et._loop is not None
    return asyncio.run_coroutine_threadsafe(et.engine.command(cmd), et._loop).result(10)


def _check_outputs(sink: RecordingSink) -> None:
    assert len(sink.writes) == COUNT, "an output is missing"
    assert max(sink.writes.values()) == 1, "an output was written twice"
    inputs = synthetic_values(3, list(range(COUNT)), (4,), np.dtype("float32"))
    for i in range(COUNT):
        np.testing.assert_array_equal(sink.out[f"syn-{i:08d}"], inputs[i] * 2 + 1)


def test_a_killed_actor_loses_nothing_and_comes_back(ray_cluster: ModuleType, mosquitto: Mosquitto) -> None:
    sink = RecordingSink()
    with EngineThread(_spec("ray-kill"), mosquitto.address, sink=sink) as et:
        eng = et.engine
        assert eng is not None and eng.executor is not None
        victim = eng.executor.workers[1]
        wait_for(lambda: victim.batches_done >= 2 and len(eng.leases.leased_to(victim.id)) >= 2, 60,
                 "ray-1 working, batches in hand")
        assert victim.hello is not None
        old_pid, old_epoch = victim.hello.pid, victim.epoch
        os.kill(old_pid, signal.SIGKILL)
        wait_for(lambda: eng.leases.reclaimed >= 1, 10, "ray-1 convicted, its batches taken back")
        # Hold new batches until ray-1 is back, so that work is left for it whatever the timing.
        assert _command(et, Pause()).ok
        wait_for(lambda: victim.epoch > old_epoch, 60, "ray-1 restarted by Ray under a newer epoch")
        assert victim.hello is not None and victim.hello.pid != old_pid
        done_before = victim.batches_done
        assert _command(et, Resume()).ok
        wait_for(et.finished, 60, "run finished")
        report = et.report
    assert report.counts.done == COUNT and report.counts.failed == 0
    assert victim.batches_done > done_before, "the restarted actor took work again"
    _check_outputs(sink)
    attempts = eng.table.attempt[: len(eng.table)]
    assert int((attempts == 1).sum()) == BATCH * eng.leases.reclaimed, "each taken-back task ran a second attempt"
    assert set(attempts.tolist()) == {0, 1}
    assert "ray-1" in report.control.workers_lost


def test_a_frozen_actors_late_results_are_rejected(ray_cluster: ModuleType, mosquitto: Mosquitto) -> None:
    sink = RecordingSink()
    with EngineThread(_spec("ray-freeze"), mosquitto.address, sink=sink) as et:
        eng = et.engine
        assert eng is not None and eng.executor is not None
        victim = eng.executor.workers[1]
        wait_for(lambda: victim.batches_done >= 2 and len(eng.leases.leased_to(victim.id)) >= 2, 60,
                 "ray-1 working, batches in hand")
        assert victim.hello is not None
        pid, old_epoch = victim.hello.pid, victim.epoch
        os.kill(pid, signal.SIGSTOP)
        try:
            # Silent: convicted by the monitor (phi / backstop), its batches requeued and done by ray-0.
            wait_for(lambda: eng.leases.reclaimed >= 1, 15, "frozen ray-1 convicted")
            wait_for(lambda: et.snapshot() is not None and et.snapshot().counts.done == COUNT, 60, "all done on ray-0")
            assert not et.finished(), "the frozen actor's batches are still out"
        finally:
            os.kill(pid, signal.SIGCONT)
        # Its results come back under the convicted epoch: rejected, never written.
        wait_for(et.finished, 60, "run finished")
        wait_for(lambda: victim.epoch > old_epoch, 30, "ray-1 re-born under a newer epoch")
        report = et.report
    assert eng.leases.rejected == eng.leases.reclaimed >= 1
    assert report.counts.done == COUNT and report.counts.failed == 0
    assert victim.hello is not None and victim.hello.pid == pid, "the same process, re-born (not restarted)"
    _check_outputs(sink)
