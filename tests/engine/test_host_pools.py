"""Parallel host phases (issue 16): fill and sink on several threads per lane, results in order.

Real engines on real threads: the pool's ordering, a sink that finishes batches out of order while
the journal still commits them in order, and a loading-bound run that the tuner makes device-bound.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from wd_build import spec
from wd_stages import RecordingSink, SleepySource

from warpdeck.engine.api import Engine, RunReport, SpecError, parse_spec
from warpdeck.engine.backends.host_pool import HostPool


# -- the pool ------------------------------------------------------------------------------------------
def test_jobs_start_in_submission_order_and_a_grown_pool_runs_them_together() -> None:
    pool = HostPool("t", 1)
    started: list[int] = []
    gate = threading.Event()

    def job(i: int) -> int:
        started.append(i)
        gate.wait(5)
        return i

    futures = [pool.submit(job, i) for i in range(4)]
    pool.resize(4)
    deadline = time.monotonic() + 5
    while len(started) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert started == [0, 1, 2, 3]  # all four running at once, begun in order
    gate.set()
    assert [f.result(5) for f in futures] == [0, 1, 2, 3]
    assert pool.workers == 4
    pool.shutdown()


def test_a_shrink_drops_no_job_and_shutdown_cancels_what_never_started() -> None:
    pool = HostPool("t", 3)
    gate = threading.Event()
    running = [pool.submit(gate.wait, 5) for _ in range(3)]
    queued = [pool.submit(lambda i=i: i) for i in range(5)]
    pool.resize(1)  # the stop tokens queue behind the five jobs
    gate.set()
    assert [f.result(5) for f in queued] == list(range(5))
    assert all(f.result(5) for f in running)
    assert pool.workers == 1
    blocker, began = threading.Event(), threading.Event()

    def busy_job() -> bool:
        began.set()
        return blocker.wait(5)

    busy = pool.submit(busy_job)
    never = pool.submit(lambda: 1)
    assert began.wait(5)
    threading.Timer(0.05, blocker.set).start()
    pool.shutdown(wait=True, cancel_futures=True)  # waits for the running job, drops the queued one
    assert busy.result(5) is True
    assert never.cancelled()
    assert pool.workers == 1  # a finished lane still says what it ran with
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 0)


# -- the lane --------------------------------------------------------------------------------------------
class ShuffledSink(RecordingSink):
    """Sleeps a random time on each batch's first write, so parallel sinks finish out of order;
    remembers the order batches finished in."""

    def __init__(self, batch: int, seed: int) -> None:
        super().__init__()
        self.batch = batch
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.finished: list[int] = []

    def write(self, key: str, out: np.ndarray) -> None:
        i = int(key[1:])
        if i % self.batch == 0:
            with self.lock:
                pause = self.rng.choice((0.0, 0.002, 0.02))
            time.sleep(pause)
        super().write(key, out)
        if i % self.batch == self.batch - 1:
            with self.lock:
                self.finished.append(i // self.batch)


async def test_parallel_sinks_finish_out_of_order_but_the_journal_commits_in_order(tmp_path: Path) -> None:
    s = spec(["wd_stages:double"], batch_size=4, host={"sink_workers": 4}, batch_timeout_s=1.0)
    sink = ShuffledSink(4, seed=5)
    async with Engine(s, tmp_path, source=SleepySource(160), sink=sink) as eng:
        report = await eng.wait()
        records = list(eng.timeline)
    assert report.counts.done == 160 and report.host_threads["0"]["sink"] == 4
    assert sink.finished != sorted(sink.finished), "the sinks never overlapped: the test proves nothing"
    assert [r.batch for r in records] == sorted(r.batch for r in records)  # reported in batch order
    with sqlite3.connect(tmp_path / "journal.sqlite") as c:
        rows = c.execute("SELECT batch FROM tasks WHERE state = 2 ORDER BY updated, batch").fetchall()
    batches = [b for (b,) in rows]
    assert len(batches) == 160
    assert batches == sorted(batches), "the journal recorded a later batch done before an earlier one"
    assert all(np.array_equal(sink.out[f"t{i:06d}"], np.full(4, 2.0 * i)) for i in range(160))


async def _sleepy_run(fill_workers: int | None) -> RunReport:
    # Loading takes 3x compute and waits (as I/O does): one loading thread keeps the device a third busy.
    host = {"fill_workers": fill_workers} if fill_workers else {}
    s = spec(["wd_stages:sleep_10ms"], batch_size=4, host=host)
    async with Engine(s, backend=None, source=SleepySource(4 * 150, fill_s=0.030), sink=RecordingSink()) as eng:
        return await eng.wait()


async def test_the_tuner_gives_a_loading_bound_lane_the_threads_it_needs() -> None:
    one = await _sleepy_run(1)
    tuned = await _sleepy_run(None)
    assert one.host_threads["0"]["fill"] == 1 and one.bottleneck_phase == "fill"
    assert "pinned at 1" in one.bottleneck
    assert tuned.host_threads["0"]["fill"] >= 3, tuned.tuning
    assert tuned.slot_depth[0] >= tuned.host_threads["0"]["fill"] + 2
    # Ratios only (timings belong in benchmarks/overlap.py): the device is kept far busier.
    assert tuned.device_busy >= 1.8 * one.device_busy, (tuned.device_busy, one.device_busy)
    assert tuned.steady_tasks_s >= 1.8 * one.steady_tasks_s
    for r in (one, tuned):
        assert r.overlap_efficiency <= 1.0
        assert r.phase_clocks["compute"].startswith("host")


def test_a_pinned_count_above_max_workers_names_the_field() -> None:
    with pytest.raises(SpecError, match="fill_workers"):
        parse_spec({"name": "x", "source": {"kind": "synthetic", "count": 1, "shape": [1]},
                    "stages": [{"fn": "wd_stages:double"}], "host": {"fill_workers": 9, "max_workers": 8}})
