"""A stop never hands a buffer on while a sink thread still reads it (issue 28, item 1).

The defect: stopping a run (SIGTERM, a cancelled engine) freed the release marker of every batch
still in the lane, including one whose sink was writing on a second sink thread. A later batch's
d2h was waiting on exactly that release: it ran, and copied its outputs into the pinned buffer the
sink was writing out. A Parquet part then landed holding another batch's values under these keys.

Here the sink writes whole batches and holds each write open on a gate: two sink threads hold
batches 0 and 1, and the d2h of batches 4 and 5 wait for their buffers. The run is stopped, batch
0's write is let through, then the rest once the lane has dealt with the waiting d2h jobs, and every
row the sink wrote must still hold what it held when the write began: twice its input.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np
from wd_build import spec
from wd_wait import until

from warpdeck.engine.api import Engine, IterableSource
from warpdeck.engine.backends.base import Marker, StreamsClosed, StreamSet, free, pending_marker
from warpdeck.engine.state.tasks import Phase

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


def _open_after(sink: GatedBatchSink, stopped: threading.Event, jobs: list[Marker]) -> None:
    """Once the lane is stopping, let batch 0's write finish; once the d2h jobs have run or given
    up (at most 3 s), the rest. Before the fix, batch 0's end let batch 4's d2h run, and batch 5's
    after it, whose release the stop had freed: it copied into the buffer that batch 1's write,
    still at its gate, was reading."""
    stopped.wait(30)
    sink.first.set()
    cf.wait([m.future for m in jobs], timeout=3)
    sink.rest.set()


def _inputs() -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:04d}", np.full(8, float(i), np.float32)) for i in range(N)]


async def test_a_stop_leaves_every_buffer_to_the_sink_that_reads_it() -> None:
    sink = GatedBatchSink()
    s = spec(["wd_stages:double"], batch_size=BATCH, slot_depth=4, host={"sink_workers": 2},
             feeder={"auto_depth": False})
    async with Engine(s, source=IterableSource(_inputs()), sink=sink) as eng:
        lane = eng.state.lanes[0]
        # Both sink threads hold a batch, and the d2h of the batches after them wait for those buffers.
        # Batches 0 and 1 at the sink's gate; 2 to 5 in the lane, the d2h of 4 and 5 waiting for
        # the buffers batches 0 and 1 are being written from.
        await until(lambda: sink.entered == 2 and len(lane.inflight_ids()) >= 5, 20, "batches 0-5 in the lane")
        waiting_d2h = _waiting(lane)
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
