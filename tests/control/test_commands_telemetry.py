"""Telemetry out, signed commands in, through a real Mosquitto: the engine applies a signed command,
refuses and counts forged, expired, replayed and unsigned ones, and survives 10 000 fuzzed payloads
on every topic."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiomqtt
from wd_broker import Broker, Mosquitto
from wd_control import EngineThread, collect, slow_spec
from wd_wait import until

from warpdeck.engine.control.signing import Signer
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Event, Telemetry, decode
from warpdeck.engine.state.commands import Pause, Resume

SECRET = b"correct horse battery staple 42"


async def _publish(broker: Broker, topic: str, payloads: list[bytes], qos: int = 1) -> None:
    async with aiomqtt.Client(**broker.address.client_kwargs()) as c:
        for p in payloads:
            await c.publish(topic, p, qos=qos)


async def test_telemetry_describes_the_run_at_most_four_times_a_second(broker: Broker) -> None:
    topics = Topics("tele")
    with EngineThread(slow_spec("tele"), broker.address) as et:
        await until(lambda: et.engine is not None and et.engine.control is not None
                    and et.engine.control.connected.is_set(), 10, "plane connected")
        t0 = time.monotonic()
        msgs = await collect(broker.address, topics.telemetry, lambda got: len(got) >= 9, limit_s=10)
        took = time.monotonic() - t0
        tel = [decode(m.payload) for m in msgs]  # type: ignore[arg-type]
        assert all(isinstance(t, Telemetry) for t in tel)
        last = tel[-1]
        assert isinstance(last, Telemetry)
        assert last.pipeline == "tele" and last.counts.done > 0
        assert last.feeder.high > 0 and len(last.lanes) == 1
        assert any(w.id == et.engine.worker_id for w in last.workers)
        assert last.columns["done"], "a sample of done keys for the board"
        # 9 messages need at least 8 periods of 0.25 s.
        assert took >= 8 * 0.25 * 0.9, f"{len(msgs)} telemetry messages in {took:.2f} s: faster than 4 Hz"


async def test_a_signed_command_is_applied_and_forged_expired_replayed_unsigned_are_refused(
        mosquitto: Mosquitto) -> None:
    topics = Topics("cmds")
    signer = Signer(SECRET)
    with EngineThread(slow_spec("cmds"), mosquitto.address, secret=SECRET) as et:
        assert et.engine is not None and et.engine.control is not None
        plane = et.engine.control
        await until(plane.connected.is_set, 10, "plane connected")
        good = signer.payload(Pause())
        forged = Signer(b"not the secret, but long enough").payload(Resume())
        tampered = json.loads(signer.payload(Pause()))
        tampered["body"] = '{"kind":"cancel","all":true}'
        expired = signer.payload(Resume(), now=time.time() - 600)
        unsigned = b'{"kind": "resume"}'
        await _publish(mosquitto, topics.cmd, [good, forged, json.dumps(tampered).encode(), expired, unsigned, good])
        await until(lambda: sum(plane.refused.values()) >= 5, 10, "five refusals")
        assert dict(plane.refused) == {"bad_signature": 2, "expired": 1, "unsigned": 1, "replayed": 1}
        assert plane.applied == 1
        await until(lambda: et.engine.feeder.paused, 5, "the signed pause applied")
        await until(lambda: sum(et.snapshot().control.commands_refused.values()) == 5, 2,  # type: ignore[union-attr]
                    "the snapshot shows them")
        snap = et.snapshot()
        assert snap is not None and snap.control is not None and snap.control.connected
        assert snap.control.commands_refused == {"bad_signature": 2, "expired": 1, "unsigned": 1, "replayed": 1}
        # The refusals are in the snapshot's control counters, through telemetry.
        msgs = await collect(mosquitto.address, topics.telemetry, lambda got: len(got) >= 1)
        tel = decode(msgs[-1].payload)  # type: ignore[arg-type]
        assert isinstance(tel, Telemetry) and tel.control is not None
        assert tel.control.commands_refused["bad_signature"] == 2 and tel.control.commands_applied == 1
        # A fresh signature for resume works: nothing above broke the verifier.
        await _publish(mosquitto, topics.cmd, [signer.payload(Resume())])
        await until(lambda: not et.engine.feeder.paused, 5, "resumed")


async def test_without_a_secret_every_remote_command_is_refused(mosquitto: Mosquitto) -> None:
    topics = Topics("nosecret")
    with EngineThread(slow_spec("nosecret"), mosquitto.address, secret=None) as et:
        assert et.engine is not None and et.engine.control is not None
        plane = et.engine.control
        await until(plane.connected.is_set, 10, "plane connected")

        async def send_and_hear() -> list[aiomqtt.Message]:
            async with aiomqtt.Client(**mosquitto.address.client_kwargs()) as c:
                await c.subscribe(topics.events, qos=1)
                await c.publish(topics.cmd, Signer(SECRET).payload(Pause()), qos=1)
                async for m in c.messages:
                    ev = decode(m.payload)  # type: ignore[arg-type]
                    if isinstance(ev, Event) and ev.what == "command_refused":
                        return [m]
            return []

        assert await asyncio.wait_for(send_and_hear(), 10)
        assert plane.refused["no_secret"] == 1
        assert not et.engine.feeder.paused


def _fuzz(rng: random.Random, n: int) -> list[bytes]:
    """Garbage, near-misses and oversized payloads: what a broken or hostile client might send."""
    valid = [
        {"kind": "hb", "v": 1, "worker": "w1", "epoch": 5, "seq": 3, "progress": 1},
        {"kind": "birth", "v": 1, "worker": "w1", "epoch": 5},
        {"kind": "death", "v": 1, "worker": "w1", "epoch": 5},
        {"kind": "cmd", "v": 1, "ts": time.time(), "nonce": "ab" * 16, "body": '{"kind":"pause"}', "sig": "0" * 64},
    ]
    values: list[object] = [None, True, -1, 2**70, 1e308, float("nan"), "", "x" * 10_000, [], {}, [1, [2, [3]]],
                            "\u0000", "../..", -0.0]
    out: list[bytes] = []
    for i in range(n):
        k = i % 6
        if k == 0:
            out.append(rng.randbytes(rng.randrange(0, 300)))
        elif k == 1:
            base = json.dumps(rng.choice(valid)).encode()
            out.append(base[: rng.randrange(len(base))])
        elif k == 2:
            d = dict(rng.choice(valid))
            d[rng.choice([*d.keys(), "extra", "kind", "v"])] = rng.choice(values)
            out.append(json.dumps(d, allow_nan=True).encode())
        elif k == 3:
            out.append(json.dumps(rng.choice(values), allow_nan=True).encode())
        elif k == 4:
            out.append(b"[" * rng.randrange(1, 5000) + b"]" * rng.randrange(0, 10))
        elif i % 60 == 5:
            out.append(b'{"kind":"hb","pad":"' + b"A" * rng.randrange(70_000, 100_000) + b'"}')
        else:
            out.append(json.dumps({"kind": rng.choice(["hb", "cmd", "telemetry", "nope", 7]), "v": rng.choice([1, 2]),
                                   "worker": rng.choice(["w1", "", "a/b", "#"])}).encode())
    return out


async def test_ten_thousand_fuzzed_payloads_on_every_topic_crash_nothing(mosquitto: Mosquitto) -> None:
    topics = Topics("fuzz")
    rng = random.Random(1234)
    with EngineThread(slow_spec("fuzz"), mosquitto.address, secret=SECRET) as et:
        assert et.engine is not None and et.engine.control is not None
        plane = et.engine.control
        await until(plane.connected.is_set, 10, "plane connected")
        targets = [topics.worker("w1", "hb"), topics.worker("w1", "birth"), topics.worker("w1", "death"), topics.cmd,
                   f"{topics.base}/worker/x/unknown", f"{topics.base}/worker/-bad-/hb"]
        per_topic = 10_000 // len(targets) + 1
        for topic in targets:
            await _publish(mosquitto, topic, _fuzz(rng, per_topic), qos=0)
        done_before = et.snapshot().counts.done  # type: ignore[union-attr]
        await until(lambda: plane.dropped.total + sum(plane.refused.values()) >= 0.7 * per_topic * 5, 30,
                    "fuzz counted")
        assert plane.connected.is_set() and not plane.error, plane.error
        # The engine is still running and still obeys a good command.
        await until(lambda: et.snapshot().counts.done > done_before, 10,  # type: ignore[union-attr]
                    "engine progress")
        await _publish(mosquitto, topics.cmd, [Signer(SECRET).payload(Pause())])
        await until(lambda: et.engine.feeder.paused, 5, "a good command after the fuzz")
        counts = plane.dropped.counts()
        assert {"malformed", "invalid", "oversized"} <= counts.keys(), counts
