"""The wire: every payload round-trips; anything else is refused with a reason, never another error."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpdeck.engine.control.drops import DropCounter
from warpdeck.engine.control.telemetry import snapshot_from
from warpdeck.engine.control.wire import (
    Birth,
    Death,
    DeviceStats,
    EngineState,
    Event,
    Heartbeat,
    Telemetry,
    WireError,
    decode,
    encode,
)
from warpdeck.engine.state.metrics import MetricsAccumulator
from warpdeck.engine.state.part_views import FeederState, WorkerState
from warpdeck.engine.state.snapshot import (
    ControlView,
    Counts,
    FeederView,
    HostProcess,
    LaneView,
    SlotView,
    StalledTask,
    WorkerView,
)

SAMPLES = [
    Birth(worker="gpu-3.cuda0", epoch=17, host="gpu-3", pid=42, device="NVIDIA H100", lanes=2, version="0.1"),
    Heartbeat(worker="w1", epoch=17, seq=255, progress=1234, lanes_busy=2, leased=(7, 8),
              device=DeviceStats(util_pct=97.5, mem_used_mb=1000, mem_total_mb=80_000, temp_c=61, power_w=412.5)),
    Death(worker="w1", epoch=17, graceful=True, reason="shutdown"),
    EngineState(state="online", pipeline="p", host="h", pid=1, started=1.5),
    Event(what="worker_lost", subject="w1", reason="will", t=2.0),
    Event(what="command_applied", subject="pause", reason="already paused", t=2.0, ref="n1", changed=False),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.kind)
def test_every_payload_round_trips(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


def test_an_events_changed_goes_on_the_wire_only_when_false() -> None:
    # A build from before the field refuses an event holding it (extra fields are invalid): every
    # answer that changed something reads to it as before.
    applied = Event(what="command_applied", subject="pause", reason="paused", t=1.0, ref="n1", affected=3)
    assert "changed" not in json.loads(encode(applied))
    unchanged = applied.model_copy(update={"changed": False, "reason": "already paused", "affected": 0})
    assert json.loads(encode(unchanged))["changed"] is False


@pytest.mark.parametrize(("payload", "reason"), [
    (b"\xff\xfe", "malformed"),
    (b"[1, 2]", "malformed"),
    (b'{"kind": "gossip"}', "unknown_kind"),
    (b'{"kind": ["hb"]}', "unknown_kind"),
    (b'{"kind": "hb", "v": 2, "worker": "w", "epoch": 1, "seq": 0, "progress": 0}', "version"),
    (b'{"kind": "hb", "worker": "w", "epoch": 1, "seq": 256, "progress": 0}', "invalid"),
    (b'{"kind": "hb", "worker": "a/b", "epoch": 1, "seq": 0, "progress": 0}', "invalid"),
    (b'{"kind": "hb", "worker": "w", "epoch": 1, "seq": 0, "progress": 0, "extra": 1}', "invalid"),
    (b'{"kind": "birth", "pad": "' + b"x" * 70_000 + b'"}', "oversized"),
    (b"[" * 100_000, "malformed"),
])
def test_bad_payloads_are_refused_with_their_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError) as info:
        decode(payload)
    assert info.value.reason == reason


def test_a_payload_on_the_wrong_topic_is_refused() -> None:
    with pytest.raises(WireError, match="wrong_kind"):
        decode(encode(SAMPLES[0]), frozenset(("hb",)))


def test_invalid_names_the_field() -> None:
    with pytest.raises(WireError, match=r"hb: seq: "):
        decode(b'{"kind": "hb", "worker": "w", "epoch": 1, "seq": -1, "progress": 0}')


def test_drop_counter_counts_by_reason() -> None:
    c = DropCounter()
    for p in (b"x", b"{}", b"x"):
        try:
            decode(p)
        except WireError as exc:
            c.drop(exc)
    assert c.counts() == {"malformed": 2, "unknown_kind": 1} and c.total == 3


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids, max_size=5),
    max_leaves=20)
_kinds = st.sampled_from(["hb", "birth", "death", "cmd", "telemetry", "event", "engine_state", "x"])


@settings(max_examples=3000, deadline=None)
@given(kind=_kinds, fields=st.dictionaries(
    st.sampled_from(["v", "worker", "epoch", "seq", "progress", "leased", "device", "ts", "nonce", "body", "sig",
                     "state", "pipeline", "what", "counts"]), _json, max_size=8))
def test_fuzzed_objects_never_raise_anything_but_a_wire_error(kind: str, fields: dict[str, object]) -> None:
    raw = json.dumps({"kind": kind, **fields}).encode()
    with contextlib.suppress(WireError):
        decode(raw)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=512))
def test_fuzzed_bytes_never_raise_anything_but_a_wire_error(raw: bytes) -> None:
    with contextlib.suppress(WireError):
        decode(raw)


# -- telemetry: states are typed, counts read-only ------------------------------------------------
def _telemetry() -> Telemetry:
    return Telemetry(
        seq=7, t=3.5, pipeline="p", status="running", backend="numpy",
        counts=Counts(queued=4, running={"fill": 1, "compute": 2}, done=9, failed=0, cancelled=0,
                      stalled={"memory": 1}, total=16, expected=16),
        figures=MetricsAccumulator(lanes=1).figures(3.5, 0.0, 9, 0, 1, 1),
        lanes=(LaneView(0, 2, "filling", False, 3, 4096, (SlotView(0, "computing", (5, 5, -1, -1)),), 2, 1,
                        (HostProcess(4312, 118, 0.62), HostProcess(4313, 9, 0.5)), (HostProcess(4400, 7, 0.25),)),),
        feeder=FeederView(FeederState.FILLING, 4, 2, 8, 16, False, False, 0),
        workers=(WorkerView("w1", WorkerState.LATE, "h", 1, "cpu", 1, 1, 1, 3, 9, 0),),
        stalled=(StalledTask("k3", "memory", 1.5, "running", "fill", ""),),
        control=ControlView(broker="mqtt://b:1883", connected=True, commands_applied=1,
                            commands_refused={"expired": 2}, dropped={"invalid": 1}, reconnects=0),
    )


def test_telemetry_round_trips_its_states_as_they_were() -> None:
    tel = _telemetry()
    back = decode(encode(tel))
    assert back == tel
    assert isinstance(back, Telemetry)
    assert back.feeder.state is FeederState.FILLING and back.workers[0].state is WorkerState.LATE


def test_counts_decoded_from_telemetry_cannot_be_changed() -> None:
    back = decode(encode(_telemetry()))
    assert isinstance(back, Telemetry) and back.control is not None
    snap = snapshot_from(back)  # what an attached control room draws
    by_name: list[Mapping[str, float]] = [
        back.counts.running, back.counts.stalled, back.control.commands_refused, back.control.dropped,
        back.figures.stall_s, snap.counts.running]
    for counts in by_name:
        with pytest.raises(TypeError):
            counts["fill"] = 1  # type: ignore[index]


@pytest.mark.parametrize("path", [
    ("status",), ("feeder", "state"), ("lanes", 0, "status"), ("lanes", 0, "slots", 0, "state"),
    ("workers", 0, "state"), ("stalled", 0, "reason"), ("stalled", 0, "state"), ("stalled", 0, "phase"),
], ids=lambda p: ".".join(map(str, p)))
def test_a_misspelt_state_in_telemetry_is_refused_naming_its_field(path: tuple[str | int, ...]) -> None:
    obj = json.loads(encode(_telemetry()))
    *head, last = path
    target = obj
    for p in head:
        target = target[p]
    target[last] = "Running"
    with pytest.raises(WireError) as info:
        decode(json.dumps(obj).encode(), frozenset(("telemetry",)))
    assert info.value.reason == "invalid"
    assert info.value.detail.startswith(f"telemetry: {'.'.join(map(str, path))}")


def test_a_workers_note_reaches_an_attached_control_room() -> None:
    """Why a worker waits (a Ray actor Ray cannot restart for want of room) travels with its row."""
    from dataclasses import replace

    tel = _telemetry()
    row = replace(tel.workers[0], state=WorkerState.DEAD, note="restarting: waiting for 1 GPU")
    back = decode(encode(tel.model_copy(update={"workers": (row,)})))
    assert isinstance(back, Telemetry)
    assert snapshot_from(back).workers[0].note == "restarting: waiting for 1 GPU"
