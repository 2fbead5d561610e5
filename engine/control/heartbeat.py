"""A worker speaks for itself: its own MQTT connection, a Last Will, a retained birth with a fresh
epoch on every (re)connection, heartbeats, and a goodbye.

The decisions this module protects:
- The heartbeat runs on a thread and event loop of its own, so a stage that holds the worker's
  loop (or the GIL for a while, in C) never looks like a dead worker; the ``progress`` counter in
  each heartbeat is what tells a busy worker from a stuck one.
- Every connection gets a new, larger epoch (microseconds of wall time, never less than the last
  plus one), so a worker that comes back, even as a new process, fences its older self.
- The Will and the graceful death are retained and carry the epoch: a monitor that starts later
  still learns the worker died, and a later birth (newer epoch) supersedes both.
- The broker may go away: the worker keeps computing and reconnects with backoff (a new epoch).
- A worker convicted while alive (frozen and thawed, or starved past the monitor's patience) learns
  it from the death the monitor publishes on its death topic for that epoch, and is born again
  under a new epoch: its old leases stay fenced, and it takes work again.
- Device statistics (NVML, where ``nvidia-ml-py`` is installed) are sampled at most twice a second
  off the heartbeat's path, so a slow driver call cannot delay a heartbeat.

The same component runs in the engine's process (its own worker), in a worker process
(``python -m warpdeck.engine.control.heartbeat``, used by the tests as a real process to kill and
freeze), and, later, in a Ray actor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiomqtt

from warpdeck.engine.control.broker import BrokerAddress, parse_broker
from warpdeck.engine.control.looping import LoopThread, cancel_and_wait, keep_connected
from warpdeck.engine.control.mqtt_internals import paho_socket
from warpdeck.engine.control.signing import load_secret
from warpdeck.engine.control.topics import Topics, check_name
from warpdeck.engine.control.wire import Birth, Death, DeviceStats, Heartbeat, WireError, decode, encode
from warpdeck.engine.control.worker_auth import sign_worker, verified

__all__ = ["Heartbeater", "NvmlSampler", "WorkerProbe", "main"]

_OUTBOX = 32
"""Heartbeats remembered in ``Heartbeater.outbox``: 16 s at 2 Hz, and fewer than the 256 sequence numbers, so a (epoch,
seq) pair in it is unambiguous."""
_DEATH = frozenset(("death",))



def _zero() -> int:
    return 0


def _none() -> tuple[int, ...]:
    return ()


@dataclass(slots=True)
class WorkerProbe:
    """What a heartbeat reports, read from the heartbeat's thread: each must be cheap and must
    not take the worker's locks (an exception keeps the last value)."""

    progress: Callable[[], int] = _zero
    lanes_busy: Callable[[], int] = _zero
    leased: Callable[[], tuple[int, ...]] = _none
    device_stats: Callable[[], DeviceStats | None] | None = None


@dataclass(slots=True)
class _Last:
    progress: int = 0
    lanes_busy: int = 0
    leased: tuple[int, ...] = ()
    device: DeviceStats | None = None


@dataclass(slots=True)
class WorkerInfo:
    """The birth's description of the worker."""

    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    device: str = ""
    lanes: int = 0
    version: str = ""


class Heartbeater:
    """Keeps one worker's presence on the broker. ``start()`` returns at once; ``stop()`` says
    goodbye (a graceful, retained death) and waits for the thread."""

    def __init__(
        self,
        address: BrokerAddress,
        topics: Topics,
        worker_id: str,
        *,
        probe: WorkerProbe | None = None,
        info: WorkerInfo | None = None,
        interval_s: float = 0.5,
        keepalive_s: int = 5,
        secret: bytes | None = None,
    ) -> None:
        self.address = address
        self.secret = secret
        """Signs every birth, heartbeat and death, and only a signed death convicts this worker."""
        self.topics = topics
        self.worker_id = check_name("worker id", worker_id)
        self.probe = probe or WorkerProbe()
        self.info = info or WorkerInfo()
        self.interval_s = interval_s
        self.keepalive_s = keepalive_s
        self.epoch = 0
        self.seq = 0
        self.sent = 0
        self.outbox: deque[tuple[int, int, float]] = deque(maxlen=_OUTBOX)
        """The newest heartbeats sent under the current connection: (epoch, seq, time.monotonic() just before the send).
        A monitor in this process compares them with what it hears to tell how far its own input runs behind (see
        engine/control/lag.py). Appended on the heartbeat's thread; read from any other only through ``sent_since``."""
        self.reconnects = 0
        self.rebirths = 0
        """Times this worker heard itself convicted while alive, and was born again."""
        self.last_error = ""
        self.connected = threading.Event()
        self._killed = False
        self._client: Any = None
        self._last = _Last()
        self._thread = LoopThread(f"warpdeck-hb-{self.worker_id}", self._run)
        self._stopping: asyncio.Event | None = None
        self._goodbye = "shutdown"

    # -- lifecycle (any thread) ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: str = "shutdown", timeout: float = 5.0) -> None:
        self._goodbye = reason
        self._thread.stop(timeout)

    def kill(self, timeout: float = 5.0) -> None:
        """Fault injection for tests: drop the connection with no goodbye, as a killed process
        would (the broker then sends the Will), and stay silent from then on."""
        self._killed = True
        self._thread.call_soon(self._abort)
        self._thread.stop(timeout)

    def _abort(self) -> None:
        client = self._client
        if client is not None:
            # paho's socket under aiomqtt: closing it without DISCONNECT is what SIGKILL does.
            sock = paho_socket(client)
            if sock is not None:
                sock.close()
        if self._stopping is not None:
            self._stopping.set()

    # -- the heartbeat thread -----------------------------------------------------------------
    def _next_epoch(self) -> int:
        self.epoch = max(self.epoch + 1, time.time_ns() // 1000)
        return self.epoch

    def _client_kwargs(self) -> dict[str, Any]:
        """A connection under a new epoch, with its signed Last Will."""
        epoch = self._next_epoch()
        will = aiomqtt.Will(
            self.topics.worker(self.worker_id, "death"),
            encode(sign_worker(self.secret, Death(worker=self.worker_id, epoch=epoch, reason="connection lost"))),
            qos=1,
            retain=True,
        )
        return {**self.address.client_kwargs(), "will": will, "keepalive": self.keepalive_s,
                "identifier": f"wd-{self.topics.pipeline}-{self.worker_id}"[:128], "clean_session": True,
                "timeout": max(2.0, 4 * self.interval_s)}

    def sent_since(self, since: float) -> tuple[tuple[int, int, float], ...]:
        """The outbox's heartbeats sent at ``since`` or later; safe from any thread. The deque is
        copied in one step first (``tuple()`` of a deque runs in C, holding the GIL): iterating it
        from another thread while this worker's thread appended raised "deque mutated during
        iteration" and ended the control plane (issue 29)."""
        return tuple(sent for sent in tuple(self.outbox) if sent[2] >= since)

    async def _run(self, stopping: asyncio.Event) -> None:
        self._stopping = stopping
        sampler = asyncio.create_task(self._sample_device(stopping)) if self.probe.device_stats else None

        async def session(client: aiomqtt.Client) -> None:
            self._client = client
            try:
                await self._speak(client, self.epoch, stopping)
            finally:
                # However the connection ended, what was sent on it and not yet heard never will
                # be: the outbox measures a live connection only.
                self.connected.clear()
                self.outbox.clear()

        def lost(exc: aiomqtt.MqttError) -> None:
            self.last_error = str(exc)
            self.reconnects += 1

        try:
            await keep_connected(stopping, self._client_kwargs, session, lost)
        finally:
            if sampler is not None:
                await cancel_and_wait([sampler])

    async def _speak(self, client: Any, epoch: int, stopping: asyncio.Event) -> None:
        wid, topics, info = self.worker_id, self.topics, self.info
        await client.publish(
            topics.worker(wid, "birth"),
            encode(
                sign_worker(
                    self.secret,
                    Birth(
                        worker=wid,
                        epoch=epoch,
                        host=info.host,
                        pid=info.pid,
                        device=info.device,
                        lanes=info.lanes,
                        version=info.version,
                        interval_s=self.interval_s,
                    ),
                )
            ),
            qos=1,
            retain=True,
        )
        self.connected.set()
        # A death for this epoch that we did not send: the monitor convicted us while we live.
        await client.subscribe(topics.worker(wid, "death"), qos=1)
        convicted = asyncio.ensure_future(self._convicted(client, epoch))
        stop = asyncio.ensure_future(stopping.wait())
        try:
            await self._beat(client, epoch, convicted, stop)
        finally:
            for t in (convicted, stop):
                t.cancel()
            await asyncio.gather(convicted, stop, return_exceptions=True)
        if convicted.done() and not convicted.cancelled():
            exc = convicted.exception()
            if exc is not None:
                raise exc  # the connection broke while we listened: _run reconnects
            if not stopping.is_set():
                self.rebirths += 1  # convicted: leave without a goodbye; _run connects under a new epoch
                return
        if self._killed:
            return
        await client.publish(
            topics.worker(wid, "death"),
            encode(sign_worker(self.secret, Death(worker=wid, epoch=epoch, graceful=True, reason=self._goodbye))),
            qos=1,
            retain=True,
        )

    async def _beat(self, client: Any, epoch: int, convicted: asyncio.Future[Any], stop: asyncio.Future[Any]) -> None:
        """Heartbeat every ``interval_s`` until ``stop`` or ``convicted`` completes."""
        wid = self.worker_id
        hb_topic = self.topics.worker(wid, "hb")
        next_at = time.monotonic()
        while not (stop.done() or convicted.done()):
            self._read_probe()
            last = self._last
            # Into the outbox before the send: a monitor in this process may hear it at once.
            self.outbox.append((epoch, self.seq, time.monotonic()))
            await client.publish(
                hb_topic,
                encode(
                    sign_worker(
                        self.secret,
                        Heartbeat(
                            worker=wid,
                            epoch=epoch,
                            seq=self.seq,
                            progress=last.progress,
                            lanes_busy=last.lanes_busy,
                            leased=last.leased[:4096],
                            device=last.device,
                            t=time.time(),
                        ),
                    )
                ),
                qos=0,
            )
            self.seq = (self.seq + 1) & 0xFF
            self.sent += 1
            # A fixed schedule, not sleep(interval) after the send: the send's time does not drift it.
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:  # we fell behind (a stopped process was resumed): start afresh
                next_at = now + self.interval_s
            await asyncio.wait((stop, convicted), timeout=next_at - now, return_when=asyncio.FIRST_COMPLETED)

    async def _convicted(self, client: Any, epoch: int) -> None:
        """Return when a death of ``epoch`` (or newer) that is not our own goodbye arrives."""
        async for message in client.messages:
            payload = message.payload
            if not isinstance(payload, bytes | bytearray) or not payload:
                continue
            try:
                death = decode(bytes(payload), _DEATH)
            except WireError:
                continue
            if isinstance(death, Death) and death.worker == self.worker_id and death.epoch >= epoch \
                    and not death.graceful and verified(self.secret, death):
                return

    def _read_probe(self) -> None:
        p, last = self.probe, self._last
        with contextlib.suppress(Exception):
            last.progress = int(p.progress())
        with contextlib.suppress(Exception):
            last.lanes_busy = int(p.lanes_busy())
        with contextlib.suppress(Exception):
            last.leased = tuple(p.leased())

    async def _sample_device(self, stopping: asyncio.Event) -> None:
        fn = self.probe.device_stats
        assert fn is not None
        while not stopping.is_set():
            with contextlib.suppress(Exception):
                self._last.device = await asyncio.to_thread(fn)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # at most 2 Hz; not wait_for, which can swallow a cancel (3.11)
                    await stopping.wait()


class NvmlSampler:
    """Utilisation, memory, temperature and power of one GPU through NVML (``nvidia-ml-py``); None
    where there is none. Called from a thread of the heartbeat's own (``asyncio.to_thread``), never
    from a lane's: an NVML call can take milliseconds."""

    def __init__(self, index: int = 0) -> None:
        self._handle: Any = None
        try:
            import pynvml  # noqa: PLC0415 - optional (warpdeck[cuda])

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no NVML, no driver or no such GPU: no device stats
            self._handle = None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def __call__(self) -> DeviceStats | None:
        if self._handle is None:
            return None
        nv = self._nvml
        util = nv.nvmlDeviceGetUtilizationRates(self._handle)
        try:
            # Version 2 counts the driver's reserved memory as neither used nor free, as nvidia-smi
            # does; version 1 (older drivers and bindings) counts it as used (~600 MB on an H200).
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle, version=nv.nvmlMemory_v2)
        except (AttributeError, TypeError, nv.NVMLError):
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
        temp = nv.nvmlDeviceGetTemperature(self._handle, nv.NVML_TEMPERATURE_GPU)
        try:
            power_w: float | None = nv.nvmlDeviceGetPowerUsage(self._handle) / 1000  # milliwatts
        except nv.NVMLError:  # a board without a power sensor
            power_w = None
        return DeviceStats(util_pct=float(util.gpu), mem_used_mb=mem.used / 2**20, mem_total_mb=mem.total / 2**20,
                           temp_c=float(temp), power_w=power_w)


# -- a worker process ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """A worker process that only heartbeats over a simulated workload: the tests kill it, freeze
    it and let it hang, and the heartbeat benchmark runs many of them."""
    ap = argparse.ArgumentParser(prog="python -m warpdeck.engine.control.heartbeat", description=main.__doc__)
    ap.add_argument("--broker", required=True, help="mqtt://host:port (or mqtts://)")
    ap.add_argument("--worker-id", required=True)
    ap.add_argument("--pipeline", default="demo")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between heartbeats")
    ap.add_argument(
        "--work",
        choices=("steady", "stuck", "idle"),
        default="steady",
        help="steady: a batch every 50 ms; stuck: a batch that never finishes; idle: nothing leased",
    )
    ap.add_argument("--ca-file", default=None)
    ap.add_argument("--secret-file", default=None, help="sign births, heartbeats and deaths with this secret")
    args = ap.parse_args(argv)
    try:
        address = parse_broker(args.broker, args.ca_file)
    except ValueError as exc:
        ap.error(str(exc))
    if address is None:
        ap.error("a worker process needs a broker URL, not 'embedded'")
    try:
        secret = load_secret(args.secret_file) if args.secret_file else None
    except ValueError as exc:
        ap.error(str(exc))
    state = {"progress": 0}
    busy = 0 if args.work == "idle" else 1
    probe = WorkerProbe(
        progress=lambda: state["progress"], lanes_busy=lambda: busy, leased=lambda: (state["progress"],) if busy else ()
    )
    hb = Heartbeater(
        address,
        Topics(args.pipeline),
        args.worker_id,
        probe=probe,
        info=WorkerInfo(device="simulated", lanes=1, version="sim"),
        interval_s=args.interval,
        secret=secret,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    hb.start()
    if hb.connected.wait(10):
        print(f"ready epoch={hb.epoch}", flush=True)
    else:
        print(f"not connected: {hb.last_error}", file=sys.stderr, flush=True)
    while not done.is_set():
        # The simulated stage: a batch every 50 ms, or one that never finishes.
        if done.wait(0.05):
            break
        if args.work == "steady":
            state["progress"] += 1
    hb.stop("terminated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
