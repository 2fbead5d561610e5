"""Batched socket reads (engine/control/socket_reads.py) against real brokers: every message arrives
whole and in order, across chunk boundaries and for payloads larger than a chunk, in far fewer
wake-ups and system reads than messages; and the control plane uses them."""

from __future__ import annotations

import asyncio
import random

import aiomqtt
from wd_broker import Broker
from wd_control import EngineThread, slow_spec, wait_for

from warpdeck.engine.control.socket_reads import BatchedReader, read_in_batches

N = 3000


async def _burst(broker: Broker, payloads: list[bytes], qos: int = 0,
                 ) -> tuple[list[tuple[str, bytes, bool]], BatchedReader]:
    got: list[tuple[str, bytes, bool]] = []
    done = asyncio.Event()

    def handler(topic: str, payload: bytes, retain: bool) -> None:
        got.append((topic, payload, retain))
        if topic == f"wd-test/m/{len(payloads) - 1}":
            done.set()

    async with aiomqtt.Client(**broker.address.client_kwargs(), identifier="wd-test-sub") as sub, \
            aiomqtt.Client(**broker.address.client_kwargs(), identifier="wd-test-pub") as pub:
        await pub.publish("wd-test/retained", b"kept", qos=1, retain=True)
        await pub.publish("wd-test/retained0", b"kept at qos 0", qos=0, retain=True)
        reader = read_in_batches(sub, handler, every_s=0.02)
        assert reader is not None, "the installed aiomqtt/paho must allow batched reads"
        # QoS 0 for the stream, as the plane subscribes to heartbeats (amqtt delivers at the
        # subscription's QoS, not the publication's).
        await sub.subscribe([("wd-test/m/#", qos), ("wd-test/retained", 1), ("wd-test/retained0", 1)])
        for i, p in enumerate(payloads):
            await pub.publish(f"wd-test/m/{i}", p, qos=1 if qos or i % 97 == 0 else 0)
        # A QoS 1 stream stalls at the broker's in-flight window (Mosquitto: 20) unless every
        # message is acknowledged: this wait would time out.
        await asyncio.wait_for(done.wait(), 60)
        await pub.publish("wd-test/retained", b"", qos=1, retain=True)
        await pub.publish("wd-test/retained0", b"", qos=1, retain=True)
        reader.close()
    return got, reader


async def test_every_message_arrives_whole_and_in_order(broker: Broker) -> None:
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.choice((0, 1, 60, 127, 128, 300, 16_383, 16_384, 70_000))) for _ in range(N)]
    payloads[N // 2] = rng.randbytes(600_000)  # several 64 KiB chunks
    got, reader = await _burst(broker, payloads)
    kept = sorted(g for g in got if g[0].startswith("wd-test/retained") and g[1])
    assert kept[0] == ("wd-test/retained", b"kept", True)
    assert kept[1][:2] == ("wd-test/retained0", b"kept at qos 0")
    if broker.name == "mosquitto":  # amqtt may still be storing it when we subscribe: then it comes live
        assert kept[1][2], "a retained QoS 0 message keeps its retain flag"

    got = [g for g in got if g[0].startswith("wd-test/m/")]
    assert [t for t, _, _ in got] == [f"wd-test/m/{i}" for i in range(N)]
    assert [p for _, p, _ in got] == payloads
    assert not any(r for _, _, r in got)
    assert reader.packets >= N + 2
    # The rest went through paho: QoS 1, the 70 kB payloads (more than a read), packets split by a read.
    assert reader.parsed >= N / 2, f"only {reader.parsed} of {N} messages parsed without paho"
    assert reader.wakeups < N / 3, f"{reader.wakeups} wake-ups for {N} messages: not batched"
    assert reader.reads < N / 3, f"{reader.reads} system reads for {N} messages"


async def test_small_messages_cost_a_fraction_of_a_read_each(broker: Broker) -> None:
    payloads = [b"x" * 200] * N
    _, reader = await _burst(broker, payloads)
    assert reader.reads <= N / 10, f"{reader.reads} reads for {N} heartbeat-sized messages"
    assert reader.parsed >= N * 0.9, f"only {reader.parsed} of {N} QoS 0 heartbeats parsed without paho"


async def test_qos1_messages_are_parsed_here_in_order_and_acknowledged(broker: Broker) -> None:
    """Births, deaths and commands come at QoS 1 (and a hostile flood mostly does): parsed without
    paho, in order with everything else, each acknowledged once its handler ran."""
    rng = random.Random(11)
    payloads = [rng.randbytes(rng.choice((0, 1, 90, 127, 128, 2_000))) for _ in range(N)]
    got, reader = await _burst(broker, payloads, qos=1)
    got = [g for g in got if g[0].startswith("wd-test/m/")]
    assert [t for t, _, _ in got] == [f"wd-test/m/{i}" for i in range(N)]
    assert [p for _, p, _ in got] == payloads
    assert reader.parsed >= N * 0.9, f"only {reader.parsed} of {N} QoS 1 messages parsed without paho"


async def test_without_the_internals_nothing_changes() -> None:
    class NotAClient:
        pass

    assert read_in_batches(NotAClient(), lambda *_: None) is None  # with a loop running, as the plane calls it


def test_the_control_plane_reads_in_batches(mosquitto: Broker) -> None:
    with EngineThread(slow_spec("batched"), mosquitto.address) as et:
        plane = et.engine.control
        assert plane is not None
        wait_for(lambda: plane.batched is not None and plane.batched.packets >= 4, 10, "heartbeats read in batches")
        wait_for(lambda: et.state_of(et.engine.worker_id) == "online", 10, "its own worker online")


def test_the_control_plane_can_read_through_aiomqtt(mosquitto: Broker) -> None:
    et = EngineThread(slow_spec("unbatched"), mosquitto.address)
    et.settings.read_every_s = None
    with et:
        plane = et.engine.control
        assert plane is not None
        wait_for(lambda: et.state_of(et.engine.worker_id) == "online", 10, "its own worker online")
        assert plane.batched is None
