"""Simulated workers for heartbeats.py: hundreds of MQTT connections in one process, one event loop.

Each simulated worker speaks exactly as ``warpdeck.engine.control.heartbeat.Heartbeater`` does: its
own connection (client id ``wd-<pipeline>-<id>``, keepalive 5 s, clean session) whose Last Will is
its non-graceful ``Death`` (QoS 1, retained) under the connection's epoch; a retained ``Birth``
(QoS 1) with that epoch on every (re)connection; then a ``Heartbeat`` (QoS 0) every ``interval`` s
with ``seq`` wrapping at 256 and a moving progress counter (a steady worker: a batch every 50 ms,
one lane busy, its batch leased). Payloads are built from the wire models and encoded per message.

The decision this module protects: the load must be cheap enough that 1 000 workers fit beside the
monitor on a 2-core machine, so each process drives raw paho clients from one asyncio loop (paho's
external-loop callbacks: ``add_reader`` / ``add_writer``), and one scheduler walks the workers in
phase order instead of one task per worker. Heartbeat phases are spread uniformly over the interval
across all processes (global worker ``g`` of ``N`` beats at ``g / N * interval``).

    python benchmarks/_hb_sim.py --port P --pipeline NAME --total N --first F --step S [--count C]

Prints one JSON line ``{"ready": ...}`` once every worker is connected and its birth acknowledged,
and one ``{"stats": ...}`` line when stdin closes or SIGTERM arrives (without saying goodbye: the
benchmark is over, and nobody judges the Wills any more).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import sys
import time
from typing import Any

import paho.mqtt.client as mqtt

from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Birth, Death, Heartbeat, encode

KEEPALIVE_S = 5
REPORT_S = 5.0  # a {"w": [...]} line this often: the heartbeats' lateness in that window
MIN_SLEEP_S = 0.001  # heartbeats due within 1 ms of each other leave in one wake-up
PROGRESS_S = 0.05  # a simulated batch every 50 ms, as the worker process's "steady" work


def say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


class SimWorker:
    """One simulated worker: a paho client on the shared loop."""

    __slots__ = ("born", "client", "disconnects", "epoch", "loop", "phase", "pid", "seq", "topics", "wid")

    def __init__(self, loop: asyncio.AbstractEventLoop, topics: Topics, wid: str, phase: float) -> None:
        self.loop = loop
        self.topics = topics
        self.wid = wid
        self.phase = phase
        self.epoch = 0
        self.seq = 0
        self.pid = 0
        self.disconnects = 0
        self.born: asyncio.Future[None] = loop.create_future()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"wd-{topics.pipeline}-{wid}"[:128],
                        clean_session=True, protocol=mqtt.MQTTv311)
        c.on_socket_open = self._sock_open
        c.on_socket_close = self._sock_close
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_publish = self._on_publish
        self.client = c

    # paho's external-loop hooks: our asyncio loop watches the socket for reading. Without a
    # write hook paho writes at once from publish(), which is cheapest; a packet queued from inside
    # a callback (the birth) is flushed after the read, and by the misc loop.
    def _sock_open(self, _c: mqtt.Client, _u: Any, sock: Any) -> None:
        self.loop.add_reader(sock, self._readable)

    def _sock_close(self, _c: mqtt.Client, _u: Any, sock: Any) -> None:
        self.loop.remove_reader(sock)

    def _readable(self) -> None:
        c = self.client
        c.loop_read()
        if c.want_write():
            c.loop_write()

    def connect(self, host: str, port: int) -> None:
        """Connect with a fresh epoch (as Heartbeater: never less than the last plus one)."""
        self.epoch = max(self.epoch + 1, time.time_ns() // 1000)
        death = Death(worker=self.wid, epoch=self.epoch, reason="connection lost")
        self.client.will_set(self.topics.worker(self.wid, "death"), encode(death), qos=1, retain=True)
        self.client.connect(host, port, keepalive=KEEPALIVE_S)

    def _on_connect(self, c: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any = None) -> None:
        if rc.is_failure:
            return
        birth = Birth(worker=self.wid, epoch=self.epoch, host=socket.gethostname(), pid=self.pid,
                      device="simulated", lanes=1, version="sim", interval_s=0.5)
        c.publish(self.topics.worker(self.wid, "birth"), encode(birth), qos=1, retain=True)

    def _on_publish(self, _c: mqtt.Client, _u: Any, _mid: int, _rc: Any, _p: Any = None) -> None:
        # Only the birth is QoS 1 (a QoS 0 heartbeat is "published" once written): ready once it is acked.
        if not self.born.done():
            self.born.set_result(None)

    def _on_disconnect(self, _c: mqtt.Client, _u: Any, _f: Any, _rc: Any, _p: Any = None) -> None:
        self.disconnects += 1

    def beat(self, progress: int) -> None:
        hb = Heartbeat(worker=self.wid, epoch=self.epoch, seq=self.seq, progress=progress, lanes_busy=1,
                       leased=(progress,))
        self.client.publish(self.topics.worker(self.wid, "hb"), encode(hb), qos=0)
        self.seq = (self.seq + 1) & 0xFF


async def connect_all(workers: list[SimWorker], host: str, port: int) -> float:
    """Connect every worker, 50 at a time; seconds until every birth was acknowledged."""
    t0 = time.monotonic()
    for i, w in enumerate(workers):
        w.connect(host, port)
        if i % 50 == 49:  # let CONNACKs and births through before the next chunk
            await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*(w.born for w in workers)), 60)
    return time.monotonic() - t0


async def misc(workers: list[SimWorker], host: str, port: int) -> None:
    """Keepalive pings and timeouts once a second, as paho's own loop would; a lost connection
    comes back with a new epoch."""
    while True:
        await asyncio.sleep(1.0)
        for w in workers:
            if w.client.want_write():
                w.client.loop_write()
            if w.client.loop_misc() == mqtt.MQTT_ERR_NO_CONN:
                with contextlib.suppress(OSError):
                    w.connect(host, port)


async def beat(workers: list[SimWorker], interval: float, stop: asyncio.Event) -> list[float]:
    """Heartbeats on a fixed schedule until ``stop``: worker w beats at start + phase + k * interval.
    One wake-up sends every heartbeat that is due, not one timer per worker. Returns how late each
    heartbeat left; a ``{"w": [now, max late, sent, disconnects]}`` line goes out every REPORT_S."""
    order = sorted(workers, key=lambda w: w.phase)
    late: list[float] = []
    window: list[float] = []
    start = time.monotonic()
    report_at = start + REPORT_S
    cycle, i = 0, 0
    while not stop.is_set():
        now = time.monotonic()
        base = start + cycle * interval
        while i < len(order) and base + order[i].phase <= now:
            w = order[i]
            window.append(now - base - w.phase)
            w.beat(int((now - start) / PROGRESS_S))
            i += 1
        if now >= report_at:
            say({"w": [now, max(window, default=0.0), len(window), sum(x.disconnects for x in workers)]})
            late.extend(window)
            window.clear()
            report_at += REPORT_S
        if i == len(order):
            cycle, i = cycle + 1, 0
            if start + (cycle + 1) * interval < now:  # a whole cycle behind (we were stopped): skip it
                cycle = int((now - start) / interval) + 1
            continue
        await asyncio.sleep(min(max(start + cycle * interval + order[i].phase - now, MIN_SLEEP_S), 0.05))
    late.extend(window)
    return late


async def run(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    topics = Topics(args.pipeline)
    gids = list(range(args.first, args.total, args.step))[: args.count]
    workers = [SimWorker(loop, topics, f"{args.prefix}-{g:05d}", g / args.total * args.interval) for g in gids]
    for g, w in zip(gids, workers, strict=True):
        w.pid = 100_000 + g
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if stat.S_ISFIFO(os.fstat(0).st_mode):  # the benchmark holds our stdin: its end is ours too
        loop.add_reader(0, lambda: None if os.read(0, 4096) else stop.set())
    say({"ready": len(workers), "connect_s": await connect_all(workers, args.host, args.port)})
    pinger = asyncio.create_task(misc(workers, args.host, args.port))
    late = sorted(await beat(workers, args.interval, stop))
    pinger.cancel()
    return {
        "workers": len(workers),
        "sent": len(late),
        "late_p50_s": late[len(late) // 2] if late else 0.0,
        "late_p99_s": late[int(len(late) * 0.99)] if late else 0.0,
        "late_max_s": late[-1] if late else 0.0,
        "disconnects": sum(w.disconnects for w in workers),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--prefix", default="sim")
    ap.add_argument("--total", type=int, required=True, help="simulated workers over all processes")
    ap.add_argument("--first", type=int, default=0, help="this process's first global worker index")
    ap.add_argument("--step", type=int, default=1, help="global index step (the number of processes)")
    ap.add_argument("--count", type=int, default=None, help="at most this many workers")
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args()
    stats = asyncio.run(run(args))
    say({"stats": stats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
