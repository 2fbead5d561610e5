"""Batched reads while traffic flows and after it stops (engine/control/socket_reads.py): a steady
stream is polled on the reader's timer, a pass that finds nothing listens for the socket again, so a
message after a pause still arrives at once; nothing is lost or reordered across the switches."""

from __future__ import annotations

import asyncio

import aiomqtt
from wd_broker import Broker
from wd_wait import until

from warpdeck.engine.control.socket_reads import read_in_batches

EVERY_S = 0.01


async def test_a_message_after_a_pause_arrives_at_once(broker: Broker) -> None:
    got: list[str] = []
    late = asyncio.Event()
    read_by = 0  # the reader's wake-up that read the late message

    def handler(topic: str, _payload: bytes, _retain: bool) -> None:
        nonlocal read_by
        got.append(topic)
        if topic == "wd-test-poll/late":
            read_by = reader.wakeups
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
        # The stream stops: once all of it is read, the reader goes back to listening (no poll is
        # pending). It runs on this loop, so it is never seen in the middle of a pass.
        await until(lambda: len(got) >= 300 and reader._timer is None, 10, "the reader listening again")
        paused = reader.wakeups
        await pub.publish("wd-test-poll/late", b"", qos=0)
        await asyncio.wait_for(late.wait(), 10)
        reader.close()
    assert got == [*(f"wd-test-poll/{i}" for i in range(300)), "wd-test-poll/late"]
    assert streamed < 300, f"{streamed} wake-ups for 300 messages: not batched"
    # After the stream: polls for what the broker still had on its way, one that finds nothing, then
    # it listens. A reader left polling would never stop waking (about 100 times a second).
    assert paused - streamed <= 10, f"{paused - streamed} wake-ups after the stream: still polling"
    # Read at once: by the first wake-up after the pause, the socket's own (no poll was pending).
    assert read_by == paused + 1, f"the late message was read by wake-up {read_by - paused} after the pause"
