"""Attach from elsewhere: a RemoteEngine on the same Mosquitto sees what the engine sees, commands
it with signed commands (answered by nonce), and records a stream that replays."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
from wd_broker import Mosquitto
from wd_control import EngineThread, slow_spec, wait_for

from warpdeck.engine.api import Pause, RemoteEngine, Resume, State, read_recording
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Event

SECRET = b"attach-secret-0123456789"


def test_an_attached_client_sees_the_same_counts_and_commands_the_engine(mosquitto: Mosquitto, tmp_path: Path) -> None:
    record = tmp_path / "run.jsonl"
    with EngineThread(slow_spec("remote"), mosquitto.address, secret=SECRET) as et:
        assert et.engine is not None
        remote = RemoteEngine(mosquitto.address, "remote", secret=SECRET, record=record)
        remote.start()
        try:
            wait_for(lambda: remote.latest is not None and remote.latest.counts.done > 0, 10, "telemetry")
            result = remote.send(Pause()).result(10)
            assert result.ok, result.message
            wait_for(lambda: not et.engine.lanes[0].inflight_ids(), 10, "in-flight batches finished")
            local = et.snapshot()
            wait_for(lambda: remote.latest.seq >= local.seq, 5, "a telemetry message after the pause settled")
            assert remote.latest.counts == et.snapshot().counts, "same counts on both sides"
            ids = {w.id for w in remote.latest.workers}
            assert et.engine.worker_id in ids
            assert remote.latest.control is not None and remote.latest.control.commands_applied == 1
            assert remote.engine_state == "online"
            # The board's columns are samples of the right states.
            done_keys = remote.latest.tasks.keys
            assert done_keys and set(done_keys) <= set(et.engine.table.keys)
            assert remote.send(Resume()).result(10).ok
        finally:
            remote.stop()
    snaps = list(read_recording(record))
    assert len(snaps) >= 2 and snaps[-1].pipeline == "remote"
    assert [s.seq for s in snaps] == sorted(s.seq for s in snaps)


def test_without_a_secret_an_attached_client_cannot_command(mosquitto: Mosquitto) -> None:
    with EngineThread(slow_spec("remote-ro"), mosquitto.address, secret=SECRET) as et:
        remote = RemoteEngine(mosquitto.address, "remote-ro")
        remote.start()
        try:
            wait_for(lambda: remote.latest is not None, 10, "telemetry")
            result = remote.send(Pause()).result(5)
            assert not result.ok and "secret" in result.message
            assert not et.engine.feeder.paused  # type: ignore[union-attr]
        finally:
            remote.stop()


def test_a_wrong_secret_is_answered_with_the_refusal(mosquitto: Mosquitto) -> None:
    with EngineThread(slow_spec("remote-bad"), mosquitto.address, secret=SECRET) as et:
        remote = RemoteEngine(mosquitto.address, "remote-bad", secret=b"a different secret, long enough")
        remote.start()
        try:
            wait_for(lambda: remote.latest is not None, 10, "telemetry")
            result = remote.send(Pause()).result(10)
            assert not result.ok and "bad_signature" in result.message
            assert not et.engine.feeder.paused  # type: ignore[union-attr]
        finally:
            remote.stop()


def test_an_attached_client_tells_a_task_s_detail_as_far_as_telemetry_knows_it(mosquitto: Mosquitto) -> None:
    with EngineThread(slow_spec("remote-detail"), mosquitto.address, secret=SECRET) as et:
        assert et.engine is not None
        remote = RemoteEngine(mosquitto.address, "remote-detail")
        assert remote.detail("syn-00000000") is None  # no telemetry yet: nothing to tell
        remote.start()
        try:
            wait_for(lambda: remote.latest is not None and remote.latest.counts.done > 0
                     and remote.latest.tasks.rows(State.DONE).size > 0, 10, "telemetry with a done task sampled")
            snap = remote.latest
            done_key = snap.tasks.key(int(snap.tasks.rows(State.DONE)[0]))
            d = remote.detail(done_key)
            assert d is not None and (d.state, d.attempt, d.admitted) == ("done", 1, True)
            far = remote.detail("syn-00999999")  # queued at the engine, far beyond any sample
            assert far is not None and (far.state, far.admitted) == ("unknown", False)
            assert "stays with the engine" in far.note
        finally:
            remote.stop()


def test_an_attached_client_measures_its_link_and_tells_its_silence(mosquitto: Mosquitto) -> None:
    remote = RemoteEngine(mosquitto.address, "remote-link")
    with EngineThread(slow_spec("remote-link"), mosquitto.address, secret=SECRET):
        remote.start()
        try:
            wait_for(lambda: remote.meter.frames >= 8, 10, "eight frames")
            link = remote.link
            assert 2.0 <= link.frames_s <= 4.5, link  # at most 4 Hz
            assert 0 < link.bytes_s < 4.5 * 16 * 1024, link
            assert link.lag_s is not None and abs(link.lag_s) < 1.0, link  # one machine: one clock
            assert link.lost == 0 and link.connected and not link.refused
            snap = remote.latest
            assert snap is not None and snap.link is not None and snap.link.frames_s > 0
        except BaseException:
            remote.stop()
            raise
    # The engine has gone: the room is handed its latest snapshot again, the silence growing.
    try:
        seq = remote.latest.seq  # type: ignore[union-attr]
        wait_for(lambda: (remote.latest.link.silent_s or 0) >= 1.5, 5, "the silence told")  # type: ignore[union-attr]
        assert remote.latest.seq == seq  # type: ignore[union-attr]
    finally:
        remote.stop()


def test_a_pause_is_told_as_one_stall_event_with_its_task_count(mosquitto: Mosquitto) -> None:
    with EngineThread(slow_spec("remote-stall"), mosquitto.address, secret=SECRET):
        remote = RemoteEngine(mosquitto.address, "remote-stall", secret=SECRET)
        remote.start()
        try:
            wait_for(lambda: remote.latest is not None and remote.latest.counts.queued > 0, 10, "telemetry")
            result = remote.send(Pause()).result(10)
            assert result.ok and result.affected > 1, result

            def stalls() -> list[Event]:
                return [e for e in list(remote.events) if e.what == "stall_began"]

            wait_for(lambda: any(e.reason == "control" for e in stalls()), 10, "the pause's stall event")
            paused = [e for e in stalls() if e.reason == "control"]
            assert len(paused) == 1, paused  # one event for every task the pause holds, not one each
            assert paused[0].count == result.affected and paused[0].batch == -1
            assert "paused" in paused[0].subject
        finally:
            remote.stop()


def test_telemetry_of_another_version_is_refused_and_the_link_says_so(mosquitto: Mosquitto) -> None:
    remote = RemoteEngine(mosquitto.address, "remote-old")
    remote.start()
    try:
        wait_for(remote.connected.is_set, 10, "connected")

        async def publish() -> None:
            async with aiomqtt.Client(**mosquitto.address.client_kwargs()) as c:
                await c.publish(Topics("remote-old").telemetry, b'{"kind": "telemetry", "v": 1}', qos=1)

        asyncio.run(publish())
        wait_for(lambda: remote.dropped.counts().get("version") == 1, 10, "the old frame refused")
        assert "telemetry schema version 1" in remote.link.refused and remote.latest is None
    finally:
        remote.stop()
