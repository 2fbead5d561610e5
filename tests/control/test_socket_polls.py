"""Batched reads while traffic flows and after it stops (engine/control/socket_reads.py): a steady
stream is polled on the reader's timer, a pass that finds nothing listens for the socket again, so a
message after a pause still arrives at once; nothing is lost or reordered across the switches."""

from __future__ import annotations

import asyncio
import time

import aiomqtt
from wd_broker import Broker

from warpdeck.engine.control.socket_reads import read_in_batches

EVERY_S = 0.01


async def _stream_then_pause(broker: Broker) -> tuple[list[str], float, int, int]:
    got: list[str] = []
    late = asyncio.Event()
    arrived = 0.0

    def handler(topic: str, _payload: bytes, _retain: bool) -> None:
        nonlocal arrived
        got.append(topic)
        if topic == "wd-test-poll/late":
            arrived = time.monotonic()
            late.set()

    async with aiomqtt.Client(**broker.address.client_kwargs(), identifier="wd-test-poll-sub") as sub, \
            aiomqtt.Client(**broker.address.client_kwargs(), identifier="wd-test-poll-pub") as pub:
        reader = read_in_batches(sub, handler, every_s=EVERY_S)
        assert reader is not None
        await sub.subscribe("wd-test-poll/#", qos=0)
        for i in range(300):  # about a second of a steady stream: one message every 3 ms
            await pub.publish(f"wd-test-poll/{i}", b"x" * 120, qos=0)
            await asyncio.sleep(0.003)
        streamed = reader.wakeups
        await asyncio.sleep(0.5)  # the stream stops: the reader goes back to listening
        paused = reader.wakeups
        sent = time.monotonic()
        await pub.publish("wd-test-poll/late", b"", qos=0)
        await asyncio.wait_for(late.wait(), 10)
        reader.close()
    return got, arrived - sent, streamed, paused


def test_a_message_after_a_pause_arrives_at_once(broker: Broker) -> None:
    got, delay, streamed, paused = asyncio.run(_stream_then_pause(broker))
    assert got == [*(f"wd-test-poll/{i}" for i in range(300)), "wd-test-poll/late"]
    assert streamed < 300, f"{streamed} wake-ups for 300 messages: not batched"
    # After the stream: polls for what the broker still had on its way, one that finds nothing, then
    # it listens. A reader left polling would wake about 50 times in those 0.5 s.
    assert paused - streamed <= 10, f"{paused - streamed} wake-ups in 0.5 s without traffic: still polling"
    assert delay < 1.0, f"a message after a pause took {delay:.3f} s"
