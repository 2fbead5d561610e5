"""The broker-restart case of heartbeats.py: Mosquitto stopped under the engine and its workers, and
started again on the same port.

Each case stops the broker with a signal (SIGTERM: it shuts down, sending every client's Will first;
SIGKILL: it vanishes), keeps it down ``down_s`` seconds from the signal, and starts it again with the
same configuration (no persistence: no retained birth survives). Nobody is told: the simulated
workers, the engine's own worker and the control plane reconnect by themselves. Measured, from the
new broker's start:

  heartbeats back  when the monitor had a heartbeat from every worker (the simulated ones and the
                   engine's own) after its own reconnection (``_hb_monitor.py``'s tracked
                   reconnection, on the monitor's clock: CLOCK_MONOTONIC, as ours)
  telemetry back   when an outside subscriber had the engine's telemetry again; it connects as soon
                   as the broker listens (it retries every 10 ms from the stop), so it is there
                   before the plane, whose backoff is at least 50 ms
  false            dead verdicts for any worker from the signal until everything is back and the
                   monitor's grace and backstop have passed since it reconnected (then a worker it
                   had not heard again would have been convicted)

Bounds (DESIGN.md section 9, broker restart <= 30 s): 0 workers convicted, all re-born <= 5 s; the
engine's telemetry comes back with its connection, so it is held to the same 5 s.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from _common import verdict
from _hb_procs import Monitor, Mosquitto

from warpdeck.engine.control.topics import Topics

BACK_S = 5.0  # all re-born within this long of the restart
LIMIT_S = 30.0  # a case that is not back this long after the restart is a miss
SETTLE_S = 3.0  # watched for verdicts after everything is back ...
QUIET_S = 6.5  # ... and at least this long after the monitor reconnected (grace 3 s + backstop 2.5 s)
SIGNALS = (signal.SIGTERM, signal.SIGKILL)


class Restartable(Protocol):
    """What a case needs of heartbeats.py's Population."""

    n: int
    pipeline: str
    broker: Mosquitto
    monitor: Monitor

    def false_convictions(self, t0: float = ..., t1: float = ...) -> list[tuple[str, int, str, str, float]]: ...


@dataclass(frozen=True, slots=True)
class RestartCase:
    """One stop and restart of the broker. Times are seconds from the restart (the new broker's
    start); None: not back within LIMIT_S. ``monitor_s``: when the plane itself reconnected."""

    how: str
    down_s: float
    heartbeats_s: float | None
    telemetry_s: float | None
    monitor_s: float | None
    false: tuple[tuple[str, int, str, str, float], ...]
    watched_s: float

    @property
    def ok(self) -> bool:
        return not self.false and all(t is not None and t <= BACK_S for t in (self.heartbeats_s, self.telemetry_s))


class TelemetryWatch:
    """An outside subscriber to the engine's telemetry, on a thread of its own: it connects as soon as
    the broker accepts connections and notes when the first telemetry message arrives."""

    def __init__(self, port: int, topic: str) -> None:
        self.port = port
        self.topic = topic
        self.first: float | None = None
        self._got = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-telemetry-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"wd-bench-watch-{os.getpid()}",
                             clean_session=True, protocol=mqtt.MQTTv311)
        client.on_connect = lambda c, *_: c.subscribe(self.topic, 0)
        client.on_message = self._on_message
        while not self._stop.is_set():
            try:
                client.connect("127.0.0.1", self.port, keepalive=5)
                break
            except OSError:  # not listening yet
                self._stop.wait(0.01)
        else:
            return
        while not (self._stop.is_set() or self._got.is_set()):
            client.loop(timeout=0.05)
        client.disconnect()

    def _on_message(self, _c: mqtt.Client, _u: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.topic and self.first is None:
            self.first = time.monotonic()
            self._got.set()

    def wait(self, until: float) -> float | None:
        """When the first telemetry came (monotonic), waiting until ``until`` at most."""
        self._got.wait(max(0.0, until - time.monotonic()))
        return self.first

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def restart_case(pop: Restartable, how: signal.Signals, down_s: float) -> RestartCase:
    """Stop the broker with ``how``, keep it down ``down_s`` from the signal, start it again on its
    port, and wait for every worker's heartbeat and the engine's telemetry to come back."""
    mon, log, want = pop.monitor, pop.monitor.log, pop.n + 1  # the simulated workers and the engine's own

    def back() -> bool:
        b = log.back
        return b is not None and b[2] >= stopped and b[0] >= want

    mon.track(True)
    stopped = pop.broker.stop(how)
    watch = TelemetryWatch(pop.broker.port, Topics(pop.pipeline).telemetry)
    try:
        time.sleep(max(0.0, stopped + down_s - time.monotonic()))
        started = pop.broker.start()
        log.wait(back, started + LIMIT_S - time.monotonic())
        tel = watch.wait(started + LIMIT_S)
    finally:
        watch.close()
    b = log.back if back() else None
    since = log.back[2] if log.back is not None and log.back[2] >= stopped else math.nan
    end = max(b[1] if b is not None else time.monotonic(), tel or 0.0) + SETTLE_S
    if not math.isnan(since):
        end = max(end, since + QUIET_S)
    time.sleep(max(0.0, end - time.monotonic()))
    mon.track(False)
    return RestartCase(how=how.name, down_s=down_s, heartbeats_s=None if b is None else b[1] - started,
                       telemetry_s=None if tel is None else tel - started,
                       monitor_s=None if math.isnan(since) else since - started,
                       false=tuple(pop.false_convictions(stopped, end)), watched_s=end - stopped)


def run_restarts(pop: Restartable, downs: list[float]) -> list[RestartCase]:
    """Every signal with every down time, SIGTERM first; each case starts with everyone back."""
    return [restart_case(pop, how, down) for down in downs for how in SIGNALS]


def _s(t: float | None) -> str:
    return "not back" if t is None else f"{t:.2f} s"


def restart_rows(tag: str, cases: list[RestartCase]) -> list[list[Any]]:
    """One row per case: false convictions, heartbeats back and telemetry back (seconds from the
    restart; the plane's own reconnection beside them), each with its bound."""
    rows = []
    for c in cases:
        false = f"{len(c.false)} false" + (f" ({', '.join(sorted({v[3] for v in c.false}))})" if c.false else "")
        measured = f"{false}, heartbeats {_s(c.heartbeats_s)}, telemetry {_s(c.telemetry_s)} (plane {_s(c.monitor_s)})"
        rows.append([f"{tag}: broker {c.how}, down {c.down_s:g} s", measured, f"0, <= {BACK_S:g} s, <= {BACK_S:g} s",
                     verdict(c.ok)])
    return rows
