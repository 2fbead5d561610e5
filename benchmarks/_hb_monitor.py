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
- ``{"counters": ...}`` when stdin closes or SIGTERM arrives, just before the engine stops.

    python benchmarks/_hb_monitor.py --port P --pipeline NAME
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from warpdeck.engine.api import Engine, parse_spec
from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.monitor import Verdict
from warpdeck.engine.control.plane import ControlPlane, ControlSettings

POLL_S = 0.05


def idle_stage(xp: Any, inp: Any, out: Any) -> None:
    """100 ms of simulated device time per batch (the GIL released): the engine is mostly idle."""
    time.sleep(0.1)
    out[...] = inp


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _threads() -> dict[str, int]:
    return {t.name: t.native_id for t in threading.enumerate() if t.native_id is not None}


def _report(plane: ControlPlane, stop: threading.Event) -> None:
    """New verdicts every 50 ms (found from the right, by identity: the deque is bounded), and how
    many workers the monitor knows once a second."""
    last: Verdict | None = None
    next_count = 0.0
    while not stop.wait(POLL_S):
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
    loop.add_reader(0, lambda: None if os.read(0, 4096) else stopping.set())
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
        reporter = threading.Thread(target=_report, args=(plane, done), name="bench-reporter", daemon=True)
        reporter.start()
        await stopping.wait()
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
