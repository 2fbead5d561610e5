"""A stop never hands a buffer on while a sink thread still reads it (issue 28, item 1).

The defect: stopping a run (SIGTERM, a cancelled engine) freed the release marker of every batch
still in the lane, including one whose sink was writing on a second sink thread. A later batch's
d2h was waiting on exactly that release: it ran, and copied its outputs into the pinned buffer the
sink was writing out. A Parquet part then landed holding another batch's values under these keys.

Here the sink writes whole batches and holds each write open on a gate: two sink threads hold
batches 0 and 1, and the d2h of batches 4 and 5 wait for their buffers. The run is stopped, batch
0's write is let through, then the rest once the lane has dealt with the waiting d2h jobs, and every
row the sink wrote must still hold what it held when the write began: twice its input.

A slot's ownership is checked too: a release freed while the job holding its buffer still runs
makes the next user of that buffer fail (``BufferStillHeld``) instead of overwriting it, so the
old stop path, put back, fails loudly rather than writing another batch's values.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from wd_build import spec
from wd_wait import until

from warpdeck.engine.api import Engine, IterableSource
from warpdeck.engine.backends.base import (
    BufferStillHeld,
    Marker,
    StreamsClosed,
    StreamSet,
    chain_release,
    free,
    pending_marker,
)
from warpdeck.engine.state.task_states import Phase

BATCH = 4
N = 12 * BATCH


class GatedBatchSink:
    """Writes whole batches; each write copies its rows, waits until its batch's gate is open (the
    first batch's gate, ``first``, or ``rest`` for the others), and copies them again."""

    def __init__(self) -> None:
        self.first = threading.Event()
        self.rest = threading.Event()
        self.entered = 0
        self.writes: list[tuple[list[str], np.ndarray, np.ndarray]] = []
        self._lock = threading.Lock()

    def write_batch(self, keys: list[str], outputs: np.ndarray) -> None:
        at_start = np.array(outputs, copy=True)
        with self._lock:
            self.entered += 1
        (self.first if keys[0] == "k0000" else self.rest).wait(30)
        with self._lock:
            self.writes.append((list(keys), at_start, np.array(outputs, copy=True)))

    def write(self, key: str, out: np.ndarray) -> None:  # pragma: no cover - the lanes use write_batch
        self.write_batch([key], out[None])


def _waiting(lane) -> list[Marker]:  # type: ignore[no-untyped-def]
    """The d2h jobs of the batches in the lane that have not run."""
    return [item.d2h for item in list(lane._inflight.values()) if not item.d2h.future.done()]


def _wait_all(jobs: list[Marker], timeout: float) -> None:
    """Block until every job of ``jobs`` has run or given up, at most ``timeout`` seconds in all."""
    end = time.monotonic() + timeout
    for m in jobs:
        m.future.wait(max(0.0, end - time.monotonic()))  # type: ignore[union-attr]


def _open_after(sink: GatedBatchSink, stopped: threading.Event, jobs: list[Marker]) -> None:
    """Once the lane is stopping, let batch 0's write finish; once the d2h jobs have run or given
    up (at most 3 s), the rest. Before the fix, batch 0's end let batch 4's d2h run, and batch 5's
    after it, whose release the stop had freed: it copied into the buffer that batch 1's write,
    still at its gate, was reading."""
    stopped.wait(30)
    sink.first.set()
    _wait_all(jobs, 3)
    sink.rest.set()


def _inputs() -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:04d}", np.full(8, float(i), np.float32)) for i in range(N)]


def _engine(sink: GatedBatchSink) -> Engine:
    s = spec(["wd_stages:double"], batch_size=BATCH, slot_depth=4, host={"sink_workers": 2},
             feeder={"auto_depth": False})
    return Engine(s, source=IterableSource(_inputs()), sink=sink)


async def _both_sinks_held(eng: Engine, sink: GatedBatchSink) -> list[Marker]:
    """Batches 0 and 1 at the sink's gate; 2 to 5 in the lane, the d2h of 4 and 5 waiting for the
    buffers batches 0 and 1 are being written from. Those waiting d2h jobs."""
    lane = eng.state.lanes[0]
    await until(lambda: sink.entered == 2 and len(lane.inflight_ids()) >= 5, 20, "batches 0-5 in the lane")
    return _waiting(lane)


async def test_a_stop_leaves_every_buffer_to_the_sink_that_reads_it() -> None:
    sink = GatedBatchSink()
    async with _engine(sink) as eng:
        lane = eng.state.lanes[0]
        waiting_d2h = await _both_sinks_held(eng, sink)
        # Open the gate once the stop has dealt with every waiting d2h (run it, or given it up).
        stopped = lane.streams._closed  # set as the stopping lane gives up what has not started
        opener = threading.Thread(target=_open_after, args=(sink, stopped, waiting_d2h), daemon=True)
        opener.start()
        # Leaving the engine's context before the run ends stops it, as a SIGTERM does.
    opener.join(30)
    assert sink.rest.is_set() and sink.writes
    values = dict(_inputs())
    for keys, at_start, at_end in sink.writes:
        np.testing.assert_array_equal(at_end, at_start)  # nobody wrote into the buffer meanwhile
        np.testing.assert_array_equal(at_end, 2 * np.stack([values[k] for k in keys]))


def test_a_job_whose_dependency_is_freed_after_a_stop_does_not_run() -> None:
    streams = StreamSet(0)
    gate = pending_marker(Phase.SINK)
    ran = threading.Event()
    job = streams.submit(Phase.D2H, ran.set, [gate])
    streams.abandon()
    free(gate)  # what a stopping lane does to every buffer's release
    assert isinstance(job.future.exception(timeout=5), StreamsClosed)
    assert not ran.is_set()
    streams.close()


def test_a_release_freed_while_its_buffer_is_held_fails_the_next_user() -> None:
    streams = StreamSet(0)
    reading = threading.Event()
    release_reader = threading.Event()

    def read() -> None:
        reading.set()
        release_reader.wait(10)

    sink = streams.submit(Phase.SINK, read)
    release = pending_marker(Phase.SINK)
    chain_release(sink, release)
    assert reading.wait(5)
    wrote = threading.Event()
    free(release)  # the bug: the buffer let go while the sink still reads it
    d2h = streams.submit(Phase.D2H, wrote.set, [release])
    exc = d2h.future.exception(timeout=5)
    assert isinstance(exc, BufferStillHeld) and "sink still holds" in str(exc)
    assert not wrote.is_set()
    release_reader.set()
    # Released by the holder itself, the buffer is handed on as usual.
    after = pending_marker(Phase.SINK)
    chain_release(streams.submit(Phase.SINK, lambda: None), after)
    assert streams.submit(Phase.D2H, wrote.set, [after]).future.exception(timeout=5) is None
    assert wrote.is_set()
    streams.close()


async def test_the_old_stop_path_fails_loudly_instead_of_writing_wrong_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Put the defect back: the stopping lane frees every release without abandoning the jobs that
    # wait for them, and those jobs run before the lane closes its streams.
    waiting: list[Marker] = []
    real_close = StreamSet.close

    def late_close(self: StreamSet) -> None:
        sink.first.set()
        _wait_all(waiting, 5)
        sink.rest.set()
        real_close(self)

    monkeypatch.setattr(StreamSet, "abandon", lambda self: None)
    monkeypatch.setattr(StreamSet, "close", late_close)
    sink = GatedBatchSink()
    async with _engine(sink) as eng:
        waiting.extend(await _both_sinks_held(eng, sink))
    # Batch 4's d2h waited for batch 0's sink, which had ended: it ran. Batch 5's release was freed
    # while batch 1's sink still held the buffer: it failed, and named why.
    failures = [m.future.exception(timeout=5) for m in waiting]
    held = [e for e in failures if isinstance(e, BufferStillHeld)]
    assert held and "d2h would use a buffer that sink still holds" in str(held[0])
    values = dict(_inputs())
    for keys, at_start, at_end in sink.writes:
        np.testing.assert_array_equal(at_end, at_start)
        np.testing.assert_array_equal(at_end, 2 * np.stack([values[k] for k in keys]))
