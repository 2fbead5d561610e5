"""Telemetry that fits a slow link: a frame of a million-task run stays within its budget, shrinks
its samples when it would not, and still turns back into a snapshot exact in counts, figures,
lanes, feeder and workers; the compact forms round-trip; an older or compressed-but-foreign payload
is refused with its reason; a stall that holds a batch is one event with its task count."""

from __future__ import annotations

import json
import math
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wd_synthetic import SyntheticRun

from warpdeck.engine.control.compact import expand_keys, key_runs, pack_record, unpack_record
from warpdeck.engine.control.plane import ControlPlane, ControlSettings
from warpdeck.engine.control.telemetry import (
    FRAME_BUDGET,
    LEVELS,
    RECORDS_PER_FRAME,
    StallEvents,
    TelemetryFrames,
    snapshot_from,
    summarize,
)
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Telemetry, WireError, decode, encode, encode_telemetry
from warpdeck.engine.state.commands import Command, CommandResult
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.run_events import (
    BatchFinished,
    RunEvents,
    StallEvent,
    WorkerConvicted,
    WorkerGone,
    WorkerWaiting,
)

_TELEMETRY = frozenset(("telemetry",))
_BIG = SyntheticRun(1_000_000)  # 10 000 transitions/s: the target's load
_LENGTH = _BIG.n / (10_000 / 6)  # seconds the run lasts


def _frames(run: SyntheticRun, start: float, count: int, frames: TelemetryFrames | None = None) -> list[bytes]:
    plane = frames or TelemetryFrames()
    return [plane.frame(s, s.control) for s in (run.snapshot_at(start + i / 4) for i in range(count))]


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_a_frame_of_a_million_tasks_at_ten_thousand_transitions_a_second_is_small(where: float) -> None:
    bodies = _frames(_BIG, where * _LENGTH, 6)
    assert all(len(b) <= FRAME_BUDGET for b in bodies)
    # What it was before (plain JSON, 200 stalled, 200 failures, ...) took about 110 KB: far below.
    assert max(len(b) for b in bodies[1:]) < 16 * 1024 / 2
    # zlib earns its place: the JSON inside is several times larger.
    assert all(len(zlib.decompress(b)) > 4 * len(b) for b in bodies)


def test_samples_shrink_until_the_frame_fits_and_say_what_they_left_out() -> None:
    run = SyntheticRun(300_000, stalled_every=41, failed_every=43,
                       prefix="s3://bucket/unsorted/0c8f1e4b-9d7a-4b1e-a6f2-", digits=12)
    run.keys = [f"{k[::-1]}" for k in run.keys]  # reversed: no key follows another, no runs
    plane = TelemetryFrames(budget=8 * 1024)
    snap = run.snapshot_at(0.6 * run.n / (10_000 / 6))
    body = plane.frame(snap, snap.control)
    assert len(body) <= plane.budget and plane.level > 0
    tel = decode(body, _TELEMETRY)
    assert isinstance(tel, Telemetry)
    keys, stalled, failures = LEVELS[plane.level]
    assert len(tel.stalled) == stalled and len(tel.failures) == failures
    assert tel.stalled_left_out == sum(snap.counts.stalled.values()) - stalled
    assert tel.failures_left_out == snap.counts.failed - failures
    assert all(len(expand_keys(runs)) <= keys for runs in tel.columns.values())
    # The whole frame at the largest samples would not have fitted.
    assert len(encode_telemetry(summarize(snap, 0.0, level=0))) > plane.budget


def test_a_frame_turns_back_into_a_snapshot_exact_in_what_the_room_counts() -> None:
    snap = _BIG.snapshot_at(0.4 * _LENGTH)
    tel = decode(TelemetryFrames().frame(snap, snap.control), _TELEMETRY)
    assert isinstance(tel, Telemetry) and tel.v == 2
    back = snapshot_from(tel)
    assert back.counts == snap.counts and back.figures == snap.figures
    assert back.lanes == snap.lanes and back.workers == snap.workers and back.feeder == snap.feeder
    assert back.control == snap.control and (back.seq, back.t, back.status) == (snap.seq, snap.t, snap.status)
    assert math.isinf(back.figures.amdahl["p=inf"]) or back.figures.amdahl == snap.figures.amdahl
    # Each sampled key stands in the column it stands in at the engine, with its state and stall.
    here = {k: i for i, k in enumerate(snap.tasks.keys)}
    for r, key in enumerate(back.tasks.keys):
        i = here[key]
        assert int(back.tasks.state[r]) == int(snap.tasks.state[i]), key
        assert int(back.tasks.phase[r]) == int(snap.tasks.phase[i]), key
        assert int(back.tasks.stall[r]) == int(snap.tasks.stall[i]), key
    # The batch records, timed from the engine's start (as ``t`` is), to the microsecond.
    sent = snap.timeline[-RECORDS_PER_FRAME:]
    assert len(back.timeline) == len(sent)
    for got, want in zip(back.timeline, sent, strict=True):
        assert (got.batch, got.lane, got.tasks, got.key, got.ok) == (want.batch, want.lane, want.tasks, want.key,
                                                                     want.ok)
        assert got.end == pytest.approx(want.end - snap.t0, abs=1e-6)


def test_records_since_the_last_frame_only_and_the_newest_when_there_are_too_many() -> None:
    run = SyntheticRun(1_000_000, batch=1)  # 1 600 batches a second: 400 between two frames
    plane = TelemetryFrames()
    first, second = (decode(b, _TELEMETRY) for b in _frames(run, 100.0, 2, plane))
    assert isinstance(first, Telemetry) and isinstance(second, Telemetry)
    assert len(second.timeline) == RECORDS_PER_FRAME and second.records_left_out > 0
    assert {r[0] for r in first.timeline}.isdisjoint(r[0] for r in second.timeline)


def test_a_record_packs_to_an_array_and_back_to_the_microsecond() -> None:
    t0 = 81_234.5
    rec = BatchRecord(17, 1, 2, 256, "float32(64,)", t0 + 3.25, ((t0 + 3.3, t0 + 3.4), (0.0, 0.0),
                      (t0 + 3.5, t0 + 3.9), (0.0, 0.0), (0.0, 0.0)), False, 65_536, (0.01, 0.0, 0.2, 0.0, 0.0),
                      131_072)
    packed = pack_record(rec, t0)
    assert json.loads(json.dumps(packed))[9][2:4] == [None, None]  # a phase never reached
    back = unpack_record(packed)
    assert back.phases[1] == (0.0, 0.0) and back.duration(3) == pytest.approx(0.4, abs=1e-6)
    assert (back.batch, back.lane, back.slot, back.tasks, back.key, back.ok, back.nbytes, back.out_nbytes) == (
        17, 1, 2, 256, "float32(64,)", False, 65_536, 131_072)
    assert back.formed == pytest.approx(3.25, abs=1e-6) and back.end == pytest.approx(3.9, abs=1e-6)
    assert back.cpu == pytest.approx((0.01, 0.0, 0.2, 0.0, 0.0), abs=1e-6)


_part = st.sampled_from(["img-", "s3://b/x/", "shard", "a1b", "", "9", "k_"])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_part, st.integers(0, 10**6), st.integers(1, 8), st.sampled_from(["", ".png", "z"]),
                          st.integers(1, 5)), max_size=12))
def test_key_runs_round_trip(series: list[tuple[str, int, int, str, int]]) -> None:
    keys = [f"{head}{n + i:0{width}d}{tail}" for head, n, width, tail, length in series for i in range(length)]
    runs = key_runs(keys)
    assert expand_keys(runs) == keys
    assert len(runs) <= len(keys)


def test_a_numbered_column_is_a_key_and_a_count() -> None:
    keys = [f"img-{i:07d}" for i in range(999_990, 1_000_190)]
    assert key_runs(keys) == ("img-0999990", 199)
    assert expand_keys(("a", 3, "x9", 2)) == ["a", "x9", "x10", "x11"]  # a run after an unnumbered key: nothing


def test_a_compressed_bomb_is_refused_as_oversized() -> None:
    bomb = zlib.compress(b'{"kind":"telemetry","pad":"' + b"x" * (5 * 1024 * 1024) + b'"}', 9)
    assert len(bomb) < 16 * 1024
    with pytest.raises(WireError) as info:
        decode(bomb, _TELEMETRY)
    assert info.value.reason == "oversized"


@pytest.mark.parametrize(("payload", "reason"), [
    (zlib.compress(b'{"kind":"hb","worker":"w","epoch":1,"seq":0,"progress":0}'), "wrong_kind"),
    (zlib.compress(b'{"kind":"telemetry"}')[:-3], "malformed"),
    (b"x" + b"\x9c" * 40, "malformed"),
])
def test_a_compressed_payload_that_is_not_whole_telemetry_is_refused(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode(payload)
    assert info.value.reason == reason


def test_telemetry_of_another_version_is_refused_naming_both() -> None:
    snap = _BIG.snapshot_at(30.0)
    obj = json.loads(encode(summarize(snap, 0.0)))
    obj["v"] = 1
    with pytest.raises(WireError) as info:
        decode(zlib.compress(json.dumps(obj).encode()), _TELEMETRY)
    assert info.value.reason == "version" and "version 1" in str(info.value) and "speaks 2" in str(info.value)


async def _no_command(cmd: Command) -> CommandResult:
    return CommandResult(False, 0, "not here")


def test_a_batch_stall_is_one_event_with_its_task_count() -> None:
    events = RunEvents()
    plane = ControlPlane(ControlSettings(), Topics("stalls"), workers=[], latest=lambda: None,
                         command=_no_command, run_events=events)
    rec = BatchRecord(7, 1, 0, 256, "k", 0.0, ((0.0, 1.0),) * 5, True, 0)
    events.emit(StallEvent(10.0, "backpressure", 256, True, batch=7, lane=1, note="sink full"))
    events.emit(BatchFinished(rec, "w", 1))  # not a stall: not told by the plane
    events.emit(StallEvent(12.5, "backpressure", 256, False, batch=7, lane=1, lasted_s=2.5))
    began, ended = plane.stalls.drain()
    assert (began.what, began.count, began.batch, began.lane, began.reason) == ("stall_began", 256, 7, 1,
                                                                               "backpressure")
    assert "batch 7" in began.subject and "sink full" in began.subject
    assert (ended.what, ended.count, ended.lasted_s) == ("stall_ended", 256, 2.5)
    assert ended.t - began.t == pytest.approx(2.5)
    assert decode(encode(began)) == began  # the wire carries it whole
    plane.stop()
    events.emit(StallEvent(13.0, "memory", 8, True, batch=9, lane=0))  # the plane has stopped listening
    assert plane.stalls.drain() == []


def test_a_worker_waiting_to_be_restarted_or_gone_is_an_event_on_the_wire() -> None:
    stalls = StallEvents()
    stalls.on_run_event(WorkerWaiting(1.0, "ray-1", "restarting: waiting for 1 GPU"))
    stalls.on_run_event(WorkerConvicted(1.5, "ray-1", 7, "will"))  # a loss is the monitor's verdict
    stalls.on_run_event(WorkerGone(2.0, "ray-1", "max_restarts spent"))
    waiting, gone = stalls.drain()
    assert (waiting.what, waiting.subject, waiting.reason) == ("worker_waiting", "ray-1",
                                                               "restarting: waiting for 1 GPU")
    assert (gone.what, gone.subject, gone.reason) == ("worker_gone", "ray-1", "max_restarts spent")
    assert gone.t - waiting.t == pytest.approx(1.0)
    assert decode(encode(waiting)) == waiting and decode(encode(gone)) == gone


def test_stall_events_beyond_the_limit_are_counted_lost() -> None:
    stalls = StallEvents(limit=3)
    for i in range(5):
        stalls.on_run_event(StallEvent(float(i), "control", 10, True, note="paused"))
    told = stalls.drain()
    assert [e.t for e in told] == sorted(e.t for e in told) and len(told) == 3 and stalls.lost == 2
    assert told[0].subject == "tasks in the queue: paused" and told[0].batch == -1


@pytest.mark.parametrize(("columns", "why"), [
    ({"queued": [5, "img-01"]}, "a run must follow a key"),
    ({"done": ["img-0001", 999, "x", 1]}, "more than 1000 keys"),
])
def test_key_runs_that_stand_for_nothing_or_too_much_are_refused(columns: dict[str, list[object]], why: str) -> None:
    obj = json.loads(encode(summarize(_BIG.snapshot_at(30.0), 0.0)))
    obj["columns"] = columns
    with pytest.raises(WireError) as info:
        decode(json.dumps(obj).encode(), _TELEMETRY)
    assert info.value.reason == "invalid" and why in str(info.value)
