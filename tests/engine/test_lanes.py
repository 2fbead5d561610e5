"""Lanes overlap their phases and never reuse a buffer before its last reader is done."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from wd_build import spec
from wd_stages import RecordingSink, SleepySource

from warpdeck.engine.api import Engine, RunReport
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.task_states import Phase


async def _run(s, source, sink) -> tuple[RunReport, list[BatchRecord]]:
    async with Engine(s, backend=None, source=source, sink=sink) as eng:
        report = await eng.wait()
        return report, list(eng.timeline)


def _interval(r: BatchRecord, p: Phase) -> tuple[float, float]:
    return r.phases[p - 1]


async def test_consecutive_batches_overlap_their_phases() -> None:
    # fill and compute both take 10 ms per batch: with double buffering, fill of batch n+1 runs
    # while batch n computes (one fill thread: with one per core, fills run two batches ahead).
    s = spec(["wd_stages:sleep_10ms"], batch_size=4, feeder={"auto_depth": False}, host={"fill_workers": 1})
    source = SleepySource(48, fill_s=0.010)
    report, records = await _run(s, source, RecordingSink())
    assert report.counts.done == 48
    records.sort(key=lambda r: r.batch)
    overlaps = 0
    for a, b in itertools.pairwise(records):
        c0, c1 = _interval(a, Phase.COMPUTE)
        f0, f1 = _interval(b, Phase.FILL)
        if f0 < c1 and c0 < f1:
            overlaps += 1
    assert overlaps >= len(records) // 2, f"only {overlaps} of {len(records) - 1} consecutive pairs overlapped"


@pytest.mark.parametrize("depth", [2, 3])
async def test_slot_buffers_are_not_reused_before_their_reader_is_done(depth: int) -> None:
    # Jittery fill, slow sink: every buffer-reuse edge gets exercised.
    s = spec(["wd_stages:sleep_2ms"], batch_size=3, slot_depth=depth, feeder={"auto_depth": False, "max_depth": 8})
    source = SleepySource(90, fill_s=0.0, jitter=[0.0, 0.004, 0.0, 0.0, 0.008])
    sink = RecordingSink(sleep_s=0.002)
    report, records = await _run(s, source, sink)
    assert report.counts.done == 90
    by_slot: dict[tuple[int, int], list[BatchRecord]] = {}
    for r in sorted(records, key=lambda r: r.batch):
        by_slot.setdefault((r.lane, r.slot), []).append(r)
    edges = [(Phase.FILL, Phase.H2D), (Phase.H2D, Phase.COMPUTE), (Phase.COMPUTE, Phase.D2H), (Phase.D2H, Phase.SINK)]
    checked = 0
    for seq in by_slot.values():
        for prev, nxt in itertools.pairwise(seq):
            for writer, reader in edges:
                # nxt writes the buffer that prev's `reader` phase read: it must start after.
                assert _interval(nxt, writer)[0] >= _interval(prev, reader)[1] - 1e-6
                checked += 1
    assert checked > 0
    # And the data proves it: every output is its own input doubled... here sleep stage copies.
    for key, out in sink.out.items():
        assert np.all(out == float(int(key[1:])))


async def test_outputs_match_inputs_under_reuse() -> None:
    s = spec(["wd_stages:double", "wd_stages:add_one"], batch_size=5, feeder={"auto_depth": False})
    sink = RecordingSink(sleep_s=0.001)
    report, _ = await _run(s, SleepySource(103, jitter=[0.0, 0.003]), sink)
    assert report.counts.done == 103
    assert sorted(sink.writes.values()) == [1] * 103
    for key, out in sink.out.items():
        assert np.all(out == 2 * float(int(key[1:])) + 1)


async def test_partial_last_batch_is_processed() -> None:
    s = spec(["wd_stages:double"], batch_size=16)
    sink = RecordingSink()
    report, records = await _run(s, SleepySource(37), sink)
    assert report.counts.done == 37
    assert sorted(r.tasks for r in records)[0] == 37 % 16


async def test_auto_depth_grows_the_ring_when_jitter_idles_the_bottleneck() -> None:
    s = spec(["wd_stages:sleep_2ms"], batch_size=2, feeder={"auto_depth": True, "max_depth": 6})
    source = SleepySource(400, fill_s=0.0, jitter=[0.0, 0.0, 0.0, 0.012])
    report, _ = await _run(s, source, RecordingSink())
    assert report.counts.done == 400
    assert report.slot_depth[0] > 2


async def test_fixed_depth_stays_put_without_auto() -> None:
    s = spec(["wd_stages:sleep_2ms"], batch_size=2, feeder={"auto_depth": False})
    report, _ = await _run(s, SleepySource(100, jitter=[0.0, 0.0, 0.0, 0.012]), RecordingSink())
    assert report.slot_depth == [2]


def _lane_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("warpdeck-lane")]


@pytest.mark.parametrize("after_done", [8, 40])
def test_cancelling_a_running_engine_ends_every_lane_thread(after_done: int) -> None:
    # Python joins executor threads at exit: one stream job left waiting on a release that
    # nobody frees keeps a finished process alive for ever (the control room's quit path).
    s = spec(["wd_stages:sleep_10ms"], batch_size=4, lanes=2, feeder={"auto_depth": False})

    async def main() -> None:
        async with Engine(s, backend=None, source=SleepySource(100_000, fill_s=0.001),
                          sink=RecordingSink(sleep_s=0.003)) as eng:
            run = asyncio.ensure_future(eng.wait())
            while eng.snapshot().counts.done < after_done:  # noqa: ASYNC110 - polls the engine's counts
                await asyncio.sleep(0.005)
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run

    before = set(_lane_threads())
    # In a thread of its own, so that a hang fails this test instead of stalling the suite.
    runner = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    runner.start()
    runner.join(timeout=20)
    assert not runner.is_alive(), "the cancelled engine never finished closing its lanes"
    deadline = time.monotonic() + 5
    while set(_lane_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not set(_lane_threads()) - before, f"lane threads still alive: {sorted(set(_lane_threads()) - before)}"


def test_a_process_exits_even_with_a_stream_job_waiting_for_ever(tmp_path: Path) -> None:
    # Python joins executor threads at exit. A job waiting on a release nobody will free (an
    # engine left running whose loop no longer turns) must not keep the finished process alive.
    script = tmp_path / "left_waiting.py"
    script.write_text(
        "from warpdeck.engine.backends.base import StreamSet, pending_marker\n"
        "from warpdeck.engine.state.task_states import Phase\n"
        "streams = StreamSet(0)\n"
        "streams.submit(Phase.D2H, lambda: None, [pending_marker(Phase.SINK)])\n"
        "print('leaving', flush=True)\n")
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        raise AssertionError("the process hung at exit") from None
    assert "leaving" in proc.stdout, proc.stderr


@pytest.mark.parametrize(("budget_mb", "fill", "depth"), [(1024, 2, 4), (20, 1, 2)])
async def test_the_fill_starts_on_a_thread_per_core_each_with_a_slot_the_memory_budget_holds(
        budget_mb: float, fill: int, depth: int) -> None:
    # Every slot of a new ring needs filling before the device starts, so the fill starts on one
    # thread per core; each thread needs a slot of its own, and a slot of 8 MiB (2 MiB of input and
    # of output, pinned and on the device) leaves a 20 MB budget room for one thread only.
    s = spec(["wd_stages:sleep_2ms"], batch_size=4, feeder={"memory_budget_mb": budget_mb}, host={"cpu_cores": 2})
    async with Engine(s, backend=None, source=SleepySource(12, shape=(65536,)), sink=RecordingSink()) as eng:
        assert eng.lanes[0].workers(Phase.FILL) == 2  # before the first batch: a slot's size is not known yet
        report = await eng.wait()
    assert report.counts.done == 12
    assert report.host_threads["0"]["fill"] == fill and report.slot_depth == [depth]
    assert not report.tuning  # three batches: the tuner's first window never closed
