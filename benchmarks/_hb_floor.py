"""The floor under the monitor's CPU: a bare aiomqtt subscriber to the same worker topics.

It connects as the control plane does (aiomqtt; ``warpdeck/<pipeline>/worker/+/hb`` at QoS 0, births
and deaths at QoS 1) and reads the way ``engine/control/plane.py`` does: batched socket reads every 10 ms
(``engine/control/socket_reads.py``), each PUBLISH handed over in paho's callback. Here that only
counts: no validation, no monitor, no telemetry. So this is what the MQTT client costs per message
before the plane's own work; if the plane's read path changes, this should follow it. The plane's
older paths, for comparison: ``--per-message`` (a ``queue_type`` whose ``put_nowait`` receives each
message in paho's callback, one wake-up per message) and ``--iterator`` (``async for message in
client.messages``: a task and an ``asyncio.wait`` per message).

    python benchmarks/_hb_floor.py --port P --pipeline NAME [--per-message | --iterator]

Prints ``{"ready": true}`` once subscribed, ``{"msgs": N}`` when stdin closes (or on SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys

import aiomqtt

from warpdeck.engine.control.socket_reads import read_in_batches
from warpdeck.engine.control.topics import Topics


class CountingQueue(asyncio.Queue[aiomqtt.Message]):
    """Counts each message as paho hands it over, and keeps none."""

    count = 0

    def put_nowait(self, item: aiomqtt.Message) -> None:
        CountingQueue.count += 1


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(0, lambda: None if os.read(0, 4096) else stop.set())
    count = 0
    batched = 0
    queue = {} if args.iterator else {"queue_type": CountingQueue}
    async with aiomqtt.Client(args.host, args.port, identifier=f"wd-{args.pipeline}-floor",
                              max_queued_incoming_messages=100_000, **queue) as client:
        if not (args.iterator or args.per_message):

            def counted(_topic: str, _payload: bytes, _retain: bool) -> None:
                nonlocal batched
                batched += 1

            if read_in_batches(client, counted) is None:
                raise SystemExit("batched reads unavailable with the installed aiomqtt")
        t = Topics(args.pipeline)
        await client.subscribe([(t.every_worker("hb"), 0), (t.every_worker("birth"), 1), (t.every_worker("death"), 1)])
        print(json.dumps({"ready": True}), flush=True)

        async def read() -> None:
            nonlocal count
            async for _ in client.messages:  # with CountingQueue: only waits for a disconnection
                count += 1

        reader = asyncio.create_task(read())
        await stop.wait()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return count + batched + CountingQueue.count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--per-message", action="store_true",
                    help="one wake-up per message, taken in paho's callback (the plane before batched reads)")
    ap.add_argument("--iterator", action="store_true", help="iterate client.messages (the plane's oldest path)")
    print(json.dumps({"msgs": asyncio.run(serve(ap.parse_args()))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
