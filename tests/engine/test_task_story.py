"""A task's whole story through ``Engine.task_detail``: each attempt's batch, lane, slot, worker and
epoch, its queue wait and phase times (on the batch record's clock), its stalls, input and output,
the traceback of a failure and the line that says why it took this long (engine/run/stories.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import wd_stages
from wd_build import spec
from wd_stages import POISON, RecordingSink

from warpdeck.engine.api import (
    AttemptStory,
    BatchRecord,
    Engine,
    Pause,
    PhaseTime,
    Resume,
    TaskDetail,
)
from warpdeck.engine.edges.config import SyntheticSource
from warpdeck.engine.edges.sinks import CallableSinkImpl, NullSinkImpl, sink_describes
from warpdeck.engine.edges.sources import IterableSource, SyntheticSourceImpl, source_describes
from warpdeck.engine.state.batch_log import BatchLog
from warpdeck.engine.state.batches import Batch, BatchKey
from warpdeck.engine.state.task_states import StallReason
from warpdeck.engine.state.tasks import TaskTable
from warpdeck.engine.state.why_slow import explain

PHASES = ["fill", "h2d", "compute", "d2h", "sink"]
CLOCK_EPS = 1e-4
"""Phase times are kept as float32 offsets from the batch's formation: microseconds over a short run."""


def _arrays(n: int, poison_at: set[int] = frozenset()) -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:04d}", np.full(4, POISON if i in poison_at else float(i))) for i in range(n)]


def _detail(eng: Engine, key: str) -> TaskDetail:
    d = eng.task_detail(key)
    assert d is not None
    return d


def _record(eng: Engine, batch: int) -> BatchRecord:
    return next(r for r in eng.timeline if r.batch == batch)


async def test_a_done_task_tells_where_it_ran_its_phase_times_its_input_and_output(tmp_path: Path) -> None:
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    for i in range(12):
        np.save(inputs / f"img-{i:02d}.npy", np.full(4, i, np.float32))
    s = spec(["wd_stages:double"], batch_size=4, source={"kind": "npy_dir", "path": str(inputs)},
             sink={"kind": "npy_dir", "path": str(outputs)})
    async with Engine(s) as eng:
        await eng.wait()
    d = _detail(eng, "img-05")
    assert d.state == "done" and [a.outcome for a in d.attempts] == ["done"]
    a = d.attempts[0]
    assert a.batch == d.batch >= 0 and a.kept
    assert a.lane == _record(eng, a.batch).lane and a.slot == _record(eng, a.batch).slot >= 0
    assert a.worker == eng.worker_id and a.epoch >= 0
    # Five phases in order, on the record's clock, within the batch's record.
    rec = _record(eng, a.batch)
    assert [p.phase for p in a.phases] == PHASES
    t0 = eng.snapshot().t0
    for p, (start, end) in zip(a.phases, rec.phases, strict=True):
        assert abs(p.start_s + t0 - start) < CLOCK_EPS and abs(p.took_s - (end - start)) < CLOCK_EPS
    assert sum(p.took_s for p in a.phases) <= rec.end - rec.start + CLOCK_EPS
    # Queued before its fill began, and ended (done) after its sink.
    assert a.queued_at_s is not None and a.queue_wait_s is not None and a.ended_at_s is not None
    assert d.admitted_at_s == a.queued_at_s
    assert abs(a.queued_at_s + a.queue_wait_s - a.phases[0].start_s) < CLOCK_EPS
    assert a.ended_at_s >= a.phases[-1].start_s + a.phases[-1].took_s - CLOCK_EPS
    assert d.input_from == f"{inputs / 'img-05.npy'} · float32 [4]"
    assert d.output_to == f"written to {outputs / 'img-05.npy'}" and (outputs / "img-05.npy").is_file()
    assert d.why and d.traceback == ""


async def test_a_failed_task_keeps_its_traceback_and_every_attempt() -> None:
    s = spec(["wd_stages:poison"], batch_size=8, retry={"max_attempts": 2})
    async with Engine(s, source=IterableSource(_arrays(16, {3})), sink=RecordingSink()) as eng:
        await eng.wait()
    d = _detail(eng, "k0003")
    assert d.state == "failed" and [a.outcome for a in d.attempts] == ["failed", "failed"]
    assert "ValueError: poisoned input" in d.error and "in poison" in d.traceback
    for a in d.attempts:
        assert a.phases[-1].phase == "compute" and a.reason.startswith("compute: ValueError")
        assert a.ended_at_s is not None
    assert d.output_to == "none: the task failed"
    assert d.input_from == "an array from a Python iterable · float64 [4]"
    # Which part was largest depends on the machine; the line always names one.
    assert d.why.startswith(("1 earlier attempt (failed) took", "waited", "held", *PHASES)), d.why


async def test_a_retried_task_shows_two_attempts_in_different_batches() -> None:
    s = spec(["wd_stages:poison"], batch_size=8, retry={"max_attempts": 2})
    async with Engine(s, source=IterableSource(_arrays(16, {3})), sink=RecordingSink()) as eng:
        await eng.wait()
    d = _detail(eng, "k0004")  # a neighbour of the poisoned input: its batch failed, its retry did not
    first, second = d.attempts
    assert (first.outcome, second.outcome) == ("failed", "done") and d.state == "done"
    assert first.batch == d.history[0].batch and second.batch == d.batch and first.batch != second.batch
    assert first.ended_at_s == second.queued_at_s  # the retry was queued when the first attempt ended
    assert second.queue_wait_s is not None and [p.phase for p in second.phases] == PHASES
    assert d.output_to.startswith("handed to RecordingSink")


async def test_a_wait_while_paused_is_named_in_the_why_line() -> None:
    s = spec(["wd_stages:double"], batch_size=4, source={"kind": "synthetic", "count": 32, "shape": [4],
                                                         "dtype": "float64"})
    async with Engine(s, snapshot_interval=0.05) as eng:
        await eng.command(Pause())
        seen = 0
        async for _snap in eng.publisher.stream():  # a few snapshots: the lanes are held meanwhile
            seen += 1
            if seen == 6:
                break
        await eng.command(Resume())
        await eng.wait()
    held = [d for d in (_detail(eng, f"syn-{i:08d}") for i in range(32))
            if (d.attempts[0].queue_wait_s or 0.0) > 0.1]
    assert held, "no task waited through the pause"
    for d in held:
        assert d.why.startswith("waited"), d.why
        assert "while the lanes were held" in d.why, d.why


async def test_a_task_whose_batch_the_log_no_longer_keeps_is_told_from_the_table() -> None:
    s = spec(["wd_stages:double"], batch_size=2, source={"kind": "synthetic", "count": 16, "shape": [4],
                                                         "dtype": "float64"})
    eng = Engine(s)
    eng.task_keys.batches = BatchLog(capacity=4)  # the newest four batches of eight
    async with eng:
        await eng.wait()
    old, new = _detail(eng, "syn-00000000"), _detail(eng, "syn-00000015")
    assert not old.attempts[0].kept and old.attempts[0].phases == () and old.attempts[0].batch == old.batch
    assert "no longer kept" in old.why and old.why.startswith("done ")
    assert new.attempts[0].kept and len(new.attempts[0].phases) == 5


async def test_backpressure_stalls_are_kept_with_their_batch() -> None:
    # One sink thread writing slowly: the lane waits for its output slots (backpressure).
    s = spec(["wd_stages:double"], batch_size=2, slot_depth=2, host={"sink_workers": 1},
             source={"kind": "synthetic", "count": 24, "shape": [4], "dtype": "float64"})
    async with Engine(s, sink=RecordingSink(sleep_s=0.005)) as eng:
        await asyncio.wait_for(eng.wait(), 60)
    stalls = [(d.key, st) for d in (_detail(eng, f"syn-{i:08d}") for i in range(24)) for st in d.stalls]
    assert any(st.reason == "backpressure" for _, st in stalls)
    for _key, st in stalls:
        assert st.lasted_s >= 0 and st.attempt == 1 and st.note


def test_the_why_line_names_the_largest_part_and_its_cause() -> None:
    a = AttemptStory(1, "done", 7, 0, 1, "gpu", 1, queued_at_s=10.0, queue_wait_s=1.2,
                     phases=(PhaseTime("fill", 11.2, 0.002), PhaseTime("h2d", 11.202, 0.001),
                             PhaseTime("compute", 11.203, 0.011), PhaseTime("d2h", 11.214, 0.001),
                             PhaseTime("sink", 11.215, 0.003)),
                     ended_at_s=11.218)

    def backpressure(start: float, end: float, lane: int | None) -> str:
        return "behind backpressure" if lane is None and (start, end) == (10.0, 11.2) else ""

    assert explain([a], backpressure, 20.0) == "waited 1.2 s in queue behind backpressure; compute 11 ms"
    slow = AttemptStory(1, "done", 7, queued_at_s=0.0, queue_wait_s=0.003,
                        phases=(PhaseTime("fill", 0.003, 0.001), PhaseTime("compute", 0.004, 0.85)),
                        ended_at_s=0.854)
    assert explain([slow], lambda *_: "", 1.0) == "compute took 850 ms of 854 ms; waited 3.0 ms in queue"


def test_the_batch_log_keeps_the_newest_batches_and_stalls() -> None:
    table = TaskTable()
    table.add(["t"])
    log = BatchLog(capacity=4, stall_capacity=3)
    key = BatchKey("test", (4,), "float32")
    epoch = 1_795_656_870_866_520  # epochs are birth times: far past an int32
    for i in range(10):
        log.started(Batch(i, key, np.array([0], np.int64), [], time.monotonic(), lane=0, slot=i % 2), "w", epoch,
                    table)
        log.stalled(i, 0, StallReason.BACKPRESSURE, 1.0 + i, 1.5 + i, "slow sink")
    assert log.get(5) is None
    kept = log.get(9)
    assert kept is not None and (kept.epoch, kept.worker, kept.key, kept.ok) == (epoch, "w", key, None)
    assert [s.batch for s in log.stalls_of(range(10))] == [7, 8, 9]
    assert [s.batch for s in log.overlapping(8.2, 8.4)] == [7]


def test_sources_and_sinks_say_where_a_task_comes_from_and_goes() -> None:
    synthetic = SyntheticSourceImpl(SyntheticSource(kind="synthetic", count=10, shape=[4], seed=7))
    assert source_describes(synthetic, "syn-00000003") == "synthetic input 3 (seed 7)"
    assert source_describes(synthetic, "syn-00000099") == ""
    assert source_describes(IterableSource([]), "item-00000012") == "item 12 of a Python iterable"
    assert sink_describes(NullSinkImpl(), "k") == "discarded (null sink)"
    assert sink_describes(CallableSinkImpl(wd_stages.noop), "k") == "handed to wd_stages:noop"
    assert sink_describes(RecordingSink(), "k") == "handed to RecordingSink.write"


class _OneBadLoad(wd_stages.SleepySource):
    """Task t000005's input cannot be read; its batch's other tasks load and go on."""

    def load(self, items, out):  # type: ignore[no-untyped-def]
        errors = super().load(items, out)
        return [OSError("unreadable input") if t.key == "t000005" else e for t, e in zip(items, errors, strict=True)]


async def test_a_task_whose_load_failed_shows_only_the_phases_it_reached() -> None:
    # Its batch went on through compute and sink without it: those phases are not its story
    # (issue 29: they showed after its end).
    s = spec(["wd_stages:double"], batch_size=8)
    async with Engine(s, source=_OneBadLoad(16), sink=RecordingSink()) as eng:
        await eng.wait()
    d = _detail(eng, "t000005")
    assert d.state == "failed"
    first = d.attempts[0]
    assert [p.phase for p in first.phases] == ["fill"], first.phases
    for a in d.attempts[1:]:  # retried by the policy, alone in its batch: nothing past the fill
        assert {p.phase for p in a.phases} <= {"fill"}, a.phases
    neighbour = _detail(eng, "t000004").attempts[0]
    assert neighbour.batch == first.batch and [p.phase for p in neighbour.phases] == PHASES
