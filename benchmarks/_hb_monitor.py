"""The monitor side of heartbeats.py: a real ``Engine`` with its control plane on a real broker.

The engine runs a long, mostly idle pipeline (a 100 ms stage per batch of 8) with
``control=ControlSettings(broker=...)``, so the monitoring path is the one a run uses: the plane's
own thread (``warpdeck-control``) reads every worker's birth, heartbeat and death off the socket,
validates it, feeds ``WorkerMonitor``, ticks it every 50 ms and publishes telemetry and events; the
engine's loop merges the monitor's views into every snapshot (10 Hz).

A reporter thread tells the benchmark, one JSON line at a time on stdout:

- ``{"ready": ..., "pid": ..., "threads": {name: native id}}`` once the plane is connected;
- ``{"v": [worker, epoch, kind, reason, at, phi, silence]}`` for each new verdict, ``at`` on the
  monitor's ``time.monotonic`` (CLOCK_MONOTONIC: the same clock in every process of the machine);
- ``{"workers": known, "online": online}`` once a second;
- ``{"back": [heard, last, since]}`` while it tracks a reconnection (the line ``{"track": true}`` on
  stdin; ``{"track": false}`` ends it), whenever the count changed: ``since`` is when the plane
  reconnected, ``heard`` how many workers' heartbeats the monitor has had since, ``last`` when the
  latest of those first heartbeats came (both on the monitor's clock);
- ``{"counters": ...}`` when stdin closes or SIGTERM arrives, just before the engine stops.

    python benchmarks/_hb_monitor.py --port P --pipeline NAME
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any

from warpdeck.engine.api import Engine, parse_spec
from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import Verdict
from warpdeck.engine.control.plane import ControlPlane, ControlSettings

POLL_S = 0.05


class Reconnection:
    """Which workers the monitor has heard since its next reconnection, and when: for that while the
    monitor's ``on_connection`` and ``on_heartbeat`` are wrapped (on this instance only), so they
    cost nothing more the rest of the time. The wrappers run on the control thread; the reporter
    reads three numbers."""

    def __init__(self, monitor: WorkerMonitor) -> None:
        self.monitor = monitor
        self.since = math.inf
        self.heard: set[str] = set()
        self.count = 0
        self.last = math.nan

    def start(self) -> None:
        self.since, self.heard, self.count, self.last = math.inf, set(), 0, math.nan
        mon = self.monitor
        on_connection, on_heartbeat = type(mon).on_connection, type(mon).on_heartbeat

        def connection(connected: bool, now: float) -> None:
            if connected and self.since == math.inf:
                self.since = now
            on_connection(mon, connected, now)

        def heartbeat(worker_id: str, epoch: int, seq: int, progress: int, now: float, busy: bool) -> None:
            if now >= self.since and worker_id not in self.heard:
                self.heard.add(worker_id)
                self.last = now
                self.count += 1
            on_heartbeat(mon, worker_id, epoch, seq, progress, now, busy)

        mon.on_connection = connection
        mon.on_heartbeat = heartbeat

    def stop(self) -> None:
        for name in ("on_connection", "on_heartbeat"):
            self.monitor.__dict__.pop(name, None)
        self.since = math.inf


def idle_stage(xp: Any, inp: Any, out: Any) -> None:
    """100 ms of simulated device time per batch (the GIL released): the engine is mostly idle."""
    time.sleep(0.1)
    out[...] = inp


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _threads() -> dict[str, int]:
    return {t.name: t.native_id for t in threading.enumerate() if t.native_id is not None}


def _report(plane: ControlPlane, stop: threading.Event, back: Reconnection) -> None:
    """New verdicts every 50 ms (found from the right, by identity: the deque is bounded), how
    many workers the monitor knows once a second, and a tracked reconnection as it goes."""
    last: Verdict | None = None
    next_count = 0.0
    told = -1
    while not stop.wait(POLL_S):
        if back.since != math.inf and back.count != told:
            told = back.count
            _say({"back": [told, back.last, back.since]})
        elif back.since == math.inf:
            told = -1
        for _ in range(3):
            with contextlib.suppress(RuntimeError):  # the deque changed while it was copied
                snap = list(plane.verdicts)
                break
        else:
            continue
        fresh: list[Verdict] = []
        for v in reversed(snap):
            if v is last:
                break
            fresh.append(v)
        for v in reversed(fresh):
            _say({"v": [v.worker_id, v.epoch, str(v.kind), v.reason, v.at, v.phi, v.silence_s]})
        if fresh:
            last = fresh[0]
        now = time.monotonic()
        if now >= next_count:
            next_count = now + 1.0
            ws = plane.workers
            _say({"workers": len(ws), "online": sum(1 for w in ws if str(w.state) == "online")})


async def serve(args: argparse.Namespace) -> None:
    spec = parse_spec({
        "name": args.pipeline,
        "backend": "numpy",
        "source": {"kind": "synthetic", "count": 100_000_000, "shape": [4], "dtype": "float32"},
        "sink": {"kind": "null"},
        "stages": [{"fn": "_hb_monitor:idle_stage"}],
        "batch_size": 8,
    })
    settings = ControlSettings(broker=BrokerAddress(args.host, args.port), heartbeat_s=args.interval)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    back: Reconnection | None = None  # once the engine runs
    pending = b""

    def on_stdin() -> None:
        nonlocal pending
        data = os.read(0, 4096)
        if not data:
            stopping.set()
            return
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            if not line.strip() or back is None:
                continue
            if json.loads(line)["track"]:
                back.start()
            else:
                back.stop()

    loop.add_reader(0, on_stdin)
    async with Engine(spec, control=settings) as eng:
        gc.freeze()  # as cli/headless.py does once its engine has started
        plane = eng.control
        assert plane is not None
        give_up = time.monotonic() + 30
        while not plane.connected.is_set():
            if time.monotonic() > give_up or stopping.is_set():
                _say({"error": plane.error or "the control plane did not connect"})
                return
            await asyncio.sleep(0.01)
        _say({"ready": True, "pid": os.getpid(), "threads": _threads(), "worker_id": eng.worker_id})
        done = threading.Event()
        back = Reconnection(plane.monitor)
        reporter = threading.Thread(target=_report, args=(plane, done, back), name="bench-reporter", daemon=True)
        reporter.start()
        await stopping.wait()
        back.stop()
        done.set()
        reporter.join()
        c = plane.monitor.counters
        _say({"counters": {"stale_epoch": c.stale_epoch, "missed_heartbeats": c.missed_heartbeats,
                           "duplicate_heartbeats": c.duplicate_heartbeats, "after_conviction": c.after_conviction,
                           "dropped": plane.dropped.counts(), "reconnects": plane.reconnects}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pipeline", required=True)
    ap.add_argument("--interval", type=float, default=0.5)
    asyncio.run(serve(ap.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
