"""A convicted worker's batches go back to the queue and complete on another worker; a late result
from the convicted epoch is rejected: nothing lost, nothing committed twice. In-process workers (the
Ray backend will bring remote ones), a real Mosquitto, and the worker's real heartbeat connection
dropped without a goodbye, so the broker sends its Will."""

from __future__ import annotations

import wd_stages
from wd_broker import Mosquitto
from wd_build import spec as build_spec
from wd_control import EngineThread, wait_for
from wd_stages import RecordingSink

COUNT = 160


def test_a_convicted_workers_batches_complete_elsewhere_and_its_late_result_is_rejected(mosquitto: Mosquitto) -> None:
    wd_stages.HELD_LANES.clear()
    wd_stages.HELD_LANES.add(1)  # lane 1 is worker w1's only lane: its stage hangs
    wd_stages.RELEASE_LANES.clear()
    s = build_spec(["wd_stages:hold_lanes"], name="requeue", lanes=1, batch_size=8,
                   source={"kind": "synthetic", "count": COUNT, "shape": [4], "dtype": "float32"})
    sink = RecordingSink(sleep_s=0.002)
    try:
        with EngineThread(s, mosquitto.address, workers=2, sink=sink) as et:
            eng = et.engine
            assert eng is not None
            w0, w1 = eng.worker_ids
            wait_for(lambda: eng.control is not None and w1 in eng.control.heartbeaters
                     and eng.control.heartbeaters[w1].connected.is_set(), 10, "w1 heartbeating")
            wait_for(lambda: eng.leases.leased_to(w1), 10, "w1 holds a batch")
            held = eng.leases.leased_to(w1)
            old_epoch = eng.control.heartbeaters[w1].epoch  # type: ignore[union-attr]
            eng.control.heartbeaters[w1].kill()  # type: ignore[union-attr]
            wait_for(lambda: eng.leases.reclaimed >= len(held), 5, "w1's batches taken back")
            reclaimed = eng.leases.reclaimed  # what w1 held when convicted (it may have taken more meanwhile)
            verdict = next(v for v in eng.control.verdicts if v.worker_id == w1)  # type: ignore[union-attr]
            assert verdict.kind == "dead" and verdict.reason == "will" and verdict.epoch == old_epoch
            # Everything, the taken-back tasks included, completes on w0 while w1 still hangs.
            wait_for(lambda: (et.snapshot() is not None and et.snapshot().counts.done == COUNT), 30, "all done on w0")
            assert et.state_of(w1) == "dead" and et.state_of(w0) == "online"
            assert not et.finished(), "the run waits for the hung lane to give its batch back"
            # The hung stage returns: its result comes back under the convicted epoch.
            wd_stages.RELEASE_LANES.set()
            wait_for(et.finished, 10, "run finished")
            report = et.report
        assert eng.leases.rejected == reclaimed, "the late results were rejected"
        assert report.counts.done == COUNT and report.counts.failed == 0
        assert len(sink.writes) == COUNT
        assert max(sink.writes.values()) == 1, "an output written twice"
        # The taken-back tasks ran a second attempt; the others one.
        attempts = eng.table.attempt[: len(eng.table)]
        assert sorted(set(attempts.tolist())) == [1, 2] and int((attempts == 2).sum()) == 8 * reclaimed
        assert w1 in report.control.workers_lost
    finally:
        wd_stages.RELEASE_LANES.set()
        wd_stages.HELD_LANES.clear()
