"""The engine's side of the control plane, on a thread and event loop of its own.

It starts the embedded broker (unless given a real one), the engine's own worker heartbeat, and one
MQTT connection for the engine: retained ``online`` state with an ``offline`` Last Will; worker
births, heartbeats and deaths into the monitor; signed commands into the engine; telemetry (at most
4 Hz) and events out.

The decisions this module protects:
- The engine never waits on the broker: the plane reads the latest immutable snapshot and hands
  commands and verdicts to the engine's loop with ``call_soon_threadsafe``; a broker that is away
  only stops telemetry, and the plane reconnects with backoff.
- Every message is validated once, here, at the socket; a bad one is counted by reason and
  dropped. A command is verified (HMAC, expiry, replay) as it is read, before the engine sees it.
- Refusing is cheap: a refused command or dropped message costs no task and no publish of its
  own; each reason is told in at most one event a second, and every event waits in one bounded
  queue that drops the oldest (per-task events first) when full (engine/control/outbox.py).
- A worker convicted for silence is told so by a retained death for that epoch on its own death
  topic: if it is alive after all, it is born again under a new epoch (engine/control/heartbeat.py).
  Only a worker heard in this run is convicted, so nothing is retained for a ghost never born or a
  worker of an earlier run; the plane clears the death it retained (an empty retained message) once
  the worker is born again or forgotten, so a later engine never reads it as a loss.
- Whatever the plane keeps per worker goes when the monitor forgets the worker
  (engine/control/monitor.py bounds the records); the report names at most the last 1 000 workers
  lost and counts them all.
- While the plane is itself disconnected the monitor convicts nobody (it marks workers stale);
  nor while its input runs behind, which the engine's own workers' heartbeats measure
  (engine/control/lag.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
from pydantic_core import from_json

from warpdeck.engine.control.broker import BrokerAddress, EmbeddedBroker
from warpdeck.engine.control.heartbeat import Heartbeater, WorkerInfo, WorkerProbe
from warpdeck.engine.control.lag import InputLag
from warpdeck.engine.control.looping import FIRST_BACKOFF_S, LoopThread, connection, wait_backoff
from warpdeck.engine.control.monitor import MonitorConfig, Verdict, WorkerMonitor, WorkerStatus
from warpdeck.engine.control.outbox import EventQueue, Summaries
from warpdeck.engine.control.signing import CommandRefused, Verifier
from warpdeck.engine.control.socket_reads import BatchedReader, read_in_batches
from warpdeck.engine.control.telemetry import EventTracker, summarize
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import (
    MAX_BYTES,
    Birth,
    Death,
    DropCounter,
    EngineState,
    Event,
    Heartbeat,
    WireError,
    decode,
    encode,
)
from warpdeck.engine.control.worker_auth import WorkerAuth, sign_worker
from warpdeck.engine.run.commands import Command, CommandResult
from warpdeck.engine.state.snapshot import ControlView, EngineSnapshot

__all__ = ["ControlPlane", "ControlSettings"]


_log = logging.getLogger(__name__)
_WORKER_KINDS = {"birth": frozenset(("birth",)), "hb": frozenset(("hb",)), "death": frozenset(("death",))}
_MAX_NONCE = 64
#: Workers lost named in the report (the latest); all of them are counted.
_LOST_NAMES = 1000
#: Long-lived publishers draining the event queue, so at most this many QoS-1 events await their
#: acknowledgement at once (aiomqtt warns above 10 pending calls, telemetry's and deaths' included).
_EVENT_PUBLISHERS = 4


@dataclass(slots=True)
class ControlSettings:
    """How the engine joins the control plane. ``broker`` None: an embedded broker."""

    broker: BrokerAddress | None = None
    secret: bytes | None = field(default=None, repr=False)
    heartbeat_s: float = 0.5
    telemetry_hz: float = 4.0
    tick_s: float = 0.05
    views_hz: float = 2.0
    """How often the workers' rows (age, phi) are rebuilt; at once after any verdict. Each rebuild
    costs about 4 ms at 1 000 workers."""
    will_hold_s: float = 0.15
    """A Will waits this long before it convicts: a shutting-down broker sends every Will, then drops
    the monitor too, and a Will followed by our own disconnection convicts nobody."""
    monitor: MonitorConfig | None = None
    read_every_s: float | None = 0.01
    """Read the socket in batches this often (engine/control/socket_reads.py); None reads each
    message as it arrives, through aiomqtt."""
    input_lag_hold_s: float | None = 0.5
    """Hold silence verdicts while the monitor's input runs this far behind (engine/control/lag.py);
    None never holds, to show what the hold prevents."""


class ControlPlane:
    """One engine's MQTT presence. ``start()`` returns at once; the plane connects in the background."""

    def __init__(
        self,
        settings: ControlSettings,
        topics: Topics,
        *,
        workers: Sequence[tuple[str, WorkerInfo, WorkerProbe]],
        latest: Callable[[], EngineSnapshot | None],
        command: Callable[[Command], Awaitable[CommandResult]],
        on_verdict: Callable[[Verdict], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self._cmd_topic = topics.cmd  # compared with every message's topic: built once
        self._local = list(workers)
        #: The in-process workers' heartbeats, by worker id (each its own connection and Will).
        self.heartbeaters: dict[str, Heartbeater] = {}
        self._latest = latest
        self._command = command
        self._on_verdict = on_verdict
        cfg = settings.monitor or MonitorConfig(interval_s=settings.heartbeat_s)
        self.monitor = WorkerMonitor(cfg)
        #: How far behind the plane hears, measured with the in-process workers' heartbeats.
        hold = settings.input_lag_hold_s
        self.lag = InputLag(hold, resume_s=(hold or 0.5) / 2)
        self.verifier = Verifier(settings.secret)
        #: Which worker messages to act on: with a secret, only those that verify.
        self.worker_auth = WorkerAuth(settings.secret)
        self.dropped = DropCounter()
        self.refused: Counter[str] = Counter()
        #: Refusals and drops per reason, told at most once a second each.
        self.summaries = Summaries()
        #: Every event on its way out; when full the oldest goes (per-task events first), counted in
        #: ``events.dropped``: never in ``dropped``, which counts what others sent.
        self.events = EventQueue()
        self.applied = 0
        self.reconnects = 0
        self.connected = threading.Event()
        self.address: BrokerAddress | None = settings.broker
        self.error = ""
        #: The monitor's view of every worker, replaced whole after each tick (read from any thread).
        self.workers: tuple[WorkerStatus, ...] = ()
        self._heard: dict[str, Heartbeat] = {}
        self._client: Any = None
        #: The current connection's batched reader (None: aiomqtt's own path).
        self.batched: BatchedReader | None = None
        self._command_tasks: set[asyncio.Task[None]] = set()
        #: Silent convictions to tell their workers (a retained death on each one's death topic).
        self._pending_deaths: list[Verdict] = []
        #: Workers with a death we retained for them, by its epoch; and those to clear it for.
        self._retained: dict[str, int] = {}
        self._clears: dict[str, None] = {}
        #: Workers lost in this run, the latest last (at most _LOST_NAMES; the monitor counts all).
        self.lost: dict[str, None] = {}
        #: Wills held for ``will_hold_s``: worker id → (epoch, when heard).
        self._wills: dict[str, tuple[int, float]] = {}
        #: Every verdict, newest last (bounded), with the monitor's clock (``time.monotonic``).
        self.verdicts: deque[Verdict] = deque(maxlen=1000)
        self._engine_loop: asyncio.AbstractEventLoop | None = None
        self._broker: EmbeddedBroker | None = None
        self._thread = LoopThread("warpdeck-control", self._main)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = time.time()
        #: When the current connection's subscriptions took effect (monotonic; inf while there is none).
        self._listening_since = math.inf

    # -- lifecycle (engine thread) ------------------------------------------------------------
    def start(self) -> None:
        self._engine_loop = asyncio.get_running_loop()
        self._thread.start()

    def stop(self, timeout: float = 12.0) -> None:
        """Say goodbye (graceful worker death, engine offline) and stop the broker if it is ours.
        ``timeout`` covers the heartbeaters' and the broker's own stops (5 s each at most)."""
        self._thread.stop(timeout)

    def epoch_of(self, worker_id: str) -> int:
        """The epoch an in-process worker heartbeats under now (0 before its first connection)."""
        heart = self.heartbeaters.get(worker_id)
        return heart.epoch if heart is not None else 0

    def quarantine(self, worker_id: str, on: bool) -> None:
        """Mark ``worker_id`` quarantined (or release it) in the monitor (any thread)."""
        fn = self.monitor.quarantine if on else self.monitor.release
        loop = self._loop
        if loop is None:
            fn(worker_id)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, worker_id)

    def view(self) -> ControlView:
        """What the snapshot and telemetry show of the plane (any thread)."""
        counted = self.monitor.counters
        return ControlView(
            broker=self.address.url if self.address is not None else "",
            error=self.error,
            dropped=self.dropped.counts(),
            commands_refused=dict(self.refused),
            commands_applied=self.applied,
            connected=self.connected.is_set(),
            reconnects=self.reconnects,
            input_lag_s=self.lag.lag_s,
            lag_holds=self.lag.holds,
            workers_signed=self.settings.secret is not None,
            workers_lost=counted.workers_lost,
            workers_forgotten=counted.forgotten,
        )

    # -- the control thread -------------------------------------------------------------------
    async def _main(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping
        try:
            if self.address is None:
                self._broker = EmbeddedBroker()
                self.address = await asyncio.to_thread(self._broker.start)
            for wid, info, probe in self._local:
                heart = Heartbeater(
                    self.address, self.topics, wid, probe=probe, info=info, interval_s=self.settings.heartbeat_s,
                    secret=self.settings.secret,
                )
                self.heartbeaters[wid] = heart
                heart.start()
            ticker = asyncio.create_task(self._tick_loop(stopping))
            try:
                await self._connect_loop(stopping)
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
        except Exception as exc:  # noqa: BLE001 - the engine runs on without a control plane
            self.error = f"{type(exc).__name__}: {exc}"
            _log.warning("control plane stopped: %s", self.error)
        finally:
            await asyncio.gather(*(asyncio.to_thread(h.stop) for h in self.heartbeaters.values()))
            if self._broker is not None:
                await asyncio.to_thread(self._broker.stop)

    async def _connect_loop(self, stopping: asyncio.Event) -> None:
        assert self.address is not None
        offline = encode(
            EngineState(
                state="offline",
                pipeline=self.topics.pipeline,
                host=socket.gethostname(),
                pid=os.getpid(),
                started=self._started,
            )
        )
        backoff = FIRST_BACKOFF_S
        while not stopping.is_set():
            will = aiomqtt.Will(self.topics.engine_state, offline, qos=1, retain=True)
            try:
                async with connection(
                    **self.address.client_kwargs(),
                    will=will,
                    keepalive=5,
                    identifier=f"wd-{self.topics.pipeline}-engine"[:128],
                    clean_session=True,
                    queue_type=_direct_queue(self._dispatch),
                ) as client:
                    every = self.settings.read_every_s
                    self.batched = read_in_batches(client, self._on_raw, every) if every else None
                    try:
                        await self._serve(client, stopping)
                        await self._flush_events(client)
                        await client.publish(self.topics.engine_state, offline, qos=1, retain=True)
                    finally:
                        if self.batched is not None:
                            self.batched.close()
                    return
            except aiomqtt.MqttError as exc:
                self._lost_connection()
                self.error = str(exc)
                if stopping.is_set():
                    return
                self.reconnects += 1
                backoff = await wait_backoff(stopping, backoff)

    async def _serve(self, client: Any, stopping: asyncio.Event) -> None:
        await client.publish(
            self.topics.engine_state,
            encode(
                EngineState(
                    state="online",
                    pipeline=self.topics.pipeline,
                    host=socket.gethostname(),
                    pid=os.getpid(),
                    started=self._started,
                )
            ),
            qos=1,
            retain=True,
        )
        self._client = client
        self.monitor.on_connection(True, time.monotonic())
        # Heartbeats at QoS 0, as they are sent (amqtt would otherwise deliver them at the
        # subscription's QoS 1, each with an acknowledgement); births, deaths and commands at QoS 1.
        tp = self.topics
        await client.subscribe([(tp.every_worker("hb"), 0), (tp.every_worker("birth"), 1),
                                (tp.every_worker("death"), 1), (tp.cmd, 1)])
        # Heartbeats sent before this never came: our input is not behind for them.
        self._listening_since = time.monotonic()
        self.connected.set()
        self.error = ""
        stop = asyncio.create_task(stopping.wait(), name="wd-plane-stop")
        tasks = [asyncio.create_task(self._publish_loop(client, stopping), name="wd-plane-telemetry"),
                 asyncio.create_task(self._read_loop(client), name="wd-plane-read"),
                 *(asyncio.create_task(self._send_events(client), name=f"wd-plane-events-{i}")
                   for i in range(_EVENT_PUBLISHERS)), stop]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]  # an MqttError: reconnect
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    async def _read_loop(self, client: Any) -> None:
        # Messages never queue (see _direct_queue): this only waits for the connection to drop,
        # which the iterator raises as MqttError.
        async for message in client.messages:  # pragma: no cover - the queue is always empty
            self._dispatch(message)

    def _dispatch(self, message: aiomqtt.Message) -> None:
        """aiomqtt's path (without batched reads): each message as paho hands it over."""
        payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
        self._on_raw(str(message.topic), bytes(payload), bool(message.retain))

    def _on_raw(self, topic: str, payload: bytes, retain: bool) -> None:
        """Handle one message on the plane's loop, as it is read (no task, no queue)."""
        try:
            self._on_message(topic, payload, retain)
        except Exception as exc:  # noqa: BLE001 - one bad message never stops the plane
            self._drop("error", f"{type(exc).__name__}: {exc}")
            _log.warning("control plane: message on %s dropped: %r", topic, exc)

    def _on_message(self, topic: str, payload: bytes, retain: bool) -> None:
        if topic == self._cmd_topic:
            self._on_command(payload)
            return
        parsed = self.topics.parse_worker(topic)
        if parsed is None:  # amqtt also hands out retained messages of topics we did not ask for
            self._drop("wrong_topic", topic)
            return
        wid, which = parsed
        if not payload and (retain or which != "hb"):  # a retained birth or death cleared: nothing to learn
            return
        try:
            msg = decode(payload, _WORKER_KINDS[which])
        except WireError as exc:
            self._drop(exc)
            return
        self._on_worker(wid, msg, retained=retain)

    def _on_worker(self, wid: str, msg: object, *, retained: bool = False) -> None:
        now = time.monotonic()
        if getattr(msg, "worker", wid) != wid:
            self._drop("wrong_topic", f"worker {getattr(msg, 'worker', '')!r} on {wid!r}'s topic")
            return
        if not isinstance(msg, Heartbeat | Birth | Death):  # decode hands out no other kind here
            return
        refused = self.worker_auth.accept(msg)
        if refused is None:
            refused = self._to_monitor(wid, msg, now, retained)
        if refused is not None:  # never acted on, never a record
            self._drop(refused, f"{msg.kind} of {wid!r} (epoch {msg.epoch})")

    def _to_monitor(self, wid: str, msg: Heartbeat | Birth | Death, now: float, retained: bool) -> str | None:
        """Hand a verified worker message to the monitor; why it was refused, if it was."""
        refused: str | None = None
        if isinstance(msg, Heartbeat):
            refused = self.monitor.on_heartbeat(wid, msg.epoch, msg.seq, msg.progress, now, busy=msg.lanes_busy > 0)
            if refused is None:
                self._heard[wid] = msg
            if wid in self.heartbeaters:
                # Read, if not taken: just after we subscribe, a heartbeat may overtake its retained
                # birth (sent at QoS 1, behind the broker's in-flight window). Our own worker's birth
                # is surely on its way: no drop to report.
                self.lag.on_heard(wid, msg.epoch, msg.seq)
                refused = None
        elif isinstance(msg, Birth):
            self._wills.pop(wid, None)
            # Our own worker's birth of this run is this run's, however it reached us; an earlier
            # run's (an older epoch under the same id) is not.
            ours = wid in self.heartbeaters and msg.epoch >= self.epoch_of(wid) > 0
            refused = self.monitor.on_birth(wid, msg.epoch, now, interval_s=msg.interval_s,
                                            retained=retained and not ours,
                                            info=msg.model_dump(exclude={"kind", "v", "worker", "epoch"}))
            if refused is None and msg.epoch > self._retained.get(wid, msg.epoch):
                del self._retained[wid]  # born again: the death we retained for it is stale
                self._clears[wid] = None
            self._forget(self.monitor.take_forgotten())  # records it forgot to make room
        elif msg.graceful or retained:
            refused = self.monitor.on_death(wid, msg.epoch, now, graceful=msg.graceful)
        elif (known := self.monitor.epoch_of(wid)) is None or msg.epoch > known:
            refused = "unborn"  # a Will of an epoch never born here: not worth holding
        else:
            # A broker that shuts down sends every client's Will (Mosquitto does) just before it
            # drops us: hold a Will briefly and drop it if our own connection goes too.
            self._wills[wid] = (msg.epoch, now)
        return refused

    def _drop(self, err: WireError | str, detail: str = "") -> None:
        """Count a dropped message by reason; its reason's event waits for that reason's turn."""
        self.dropped.drop(err, detail)
        first = self.summaries.note("message_dropped", err.reason if isinstance(err, WireError) else err,
                                    self.dropped.last)
        if first is not None:
            self.events.put(first)

    def _on_command(self, payload: bytes) -> None:
        """Verify a command as it is read: a refusal costs no task and no publish of its own. A
        verified command waits on the engine's loop in a task of its own, in arrival order."""
        try:
            cmd = self.verifier.verify(payload)
        except CommandRefused as exc:
            self.refused[exc.reason] += 1
            first = self.summaries.note("command_refused", exc.reason, str(exc), lambda: _nonce_of(payload))
            if first is not None:
                self.events.put(first)
            return
        task = asyncio.create_task(self._apply(cmd, _nonce_of(payload)))
        self._command_tasks.add(task)
        task.add_done_callback(self._command_tasks.discard)

    async def _apply(self, cmd: Command, ref: str) -> None:
        assert self._engine_loop is not None
        fut: Future[CommandResult] = asyncio.run_coroutine_threadsafe(self._run_command(cmd), self._engine_loop)
        try:
            result = await asyncio.wrap_future(fut)
        except Exception as exc:  # noqa: BLE001 - reported, never raised into the plane
            self.events.put(Event(what="command_refused", subject=cmd.kind, reason=repr(exc)[:4096], t=time.time(),
                                  ref=ref))
            return
        self.applied += 1
        self.events.put(Event(what="command_applied" if result.ok else "command_refused", subject=cmd.kind,
                              reason=result.message[:4096], t=time.time(), ref=ref, affected=result.affected))

    async def _run_command(self, cmd: Command) -> CommandResult:
        return await self._command(cmd)

    async def _flush_events(self, client: Any, limit_s: float = 0.5) -> None:
        """On the way out: every untold summary first (the queue may hold thousands of per-task events),
        then what the queue holds, for at most ``limit_s``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit_s):  # not wait_for: it can swallow a cancellation (3.11)
                # Several at once, not one acknowledgement after another: a flood may still be read
                # between them, and the last summaries are the counts a listener adds up. As many as
                # the event publishers (aiomqtt warns past 10 publishes awaiting acknowledgement).
                room = asyncio.Semaphore(_EVENT_PUBLISHERS)

                async def publish(ev: Event) -> None:
                    async with room:
                        await client.publish(self.topics.events, encode(ev), qos=1)

                await asyncio.gather(*(publish(ev) for ev in self.summaries.due(force=True)))
                while len(self.events):
                    await client.publish(self.topics.events, encode(await self.events.get()), qos=1)

    async def _send_events(self, client: Any) -> None:
        """One of the long-lived publishers of the event queue (a publish that fails goes back)."""
        events, topic = self.events, self.topics.events
        while True:
            ev = await events.get()
            try:
                await client.publish(topic, encode(ev), qos=1)
            except aiomqtt.MqttError:
                events.put_back(ev)
                raise

    async def _publish_loop(self, client: Any, stopping: asyncio.Event) -> None:
        period = 1.0 / self.settings.telemetry_hz
        tracker = EventTracker()
        since, seq = 0.0, -1
        while not stopping.is_set():
            snap = self._latest()
            if snap is not None and snap.seq != seq:
                seq = snap.seq
                tel = summarize(snap, since, self.view())
                if tel.timeline:
                    since = max(r.end for r in tel.timeline)
                await client.publish(self.topics.telemetry, encode(tel), qos=0)
                for ev in tracker.events(snap):
                    self.events.put(ev)
            deaths, self._pending_deaths = self._pending_deaths, []
            for v in deaths:
                # A worker convicted for silence may be alive (thawed, or starved): this tells it,
                # and it is born again under a new epoch; a monitor that attaches later learns it too.
                why = f"convicted: silent for {v.silence_s or 0:.1f} s"
                death = sign_worker(self.settings.secret, Death(worker=v.worker_id, epoch=v.epoch, reason=why))
                await client.publish(self.topics.worker(v.worker_id, "death"), encode(death), qos=1, retain=True)
            clears, self._clears = self._clears, {}
            for wid in clears:  # after the deaths: a worker convicted and re-born at once is cleared too
                await client.publish(self.topics.worker(wid, "death"), b"", qos=1, retain=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):  # not wait_for: it can swallow a cancellation (3.11)
                    await stopping.wait()

    def _lost_connection(self) -> None:
        if self.connected.is_set():
            self.monitor.on_connection(False, time.monotonic())
        self.connected.clear()
        self._wills.clear()

    def _release_wills(self, now: float) -> None:
        hold = self.settings.will_hold_s
        for wid, (epoch, heard) in list(self._wills.items()):
            if now - heard >= hold:
                del self._wills[wid]
                if self.monitor.on_death(wid, epoch, now, graceful=False) is not None:  # forgotten meanwhile
                    self._drop("unborn", f"death of {wid!r} (epoch {epoch})")

    async def _tick_loop(self, stopping: asyncio.Event) -> None:
        views_every = 1.0 / self.settings.views_hz
        views_at = 0.0
        while not stopping.is_set():
            now = time.monotonic()
            if self.connected.is_set():
                self._release_wills(now)
            self._measure_lag(now)
            verdicts = self.monitor.tick(now)
            self._forget(self.monitor.take_forgotten())
            for ev in self.summaries.due():
                self.events.put(ev)
            for verdict in verdicts:
                self.verdicts.append(verdict)
                self.events.put(_verdict_event(verdict))
                if verdict.kind == "dead":
                    self._lost(verdict)
                if self._on_verdict is not None and self._engine_loop is not None:
                    with contextlib.suppress(RuntimeError):  # the engine's loop has ended
                        self._engine_loop.call_soon_threadsafe(self._on_verdict, verdict)
            # views() copies every worker: at most views_hz, and at once when something changed.
            if verdicts or now - views_at >= views_every:
                self.workers = tuple(self.monitor.views(now))
                views_at = now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.tick_s):  # not wait_for (see above)
                    await stopping.wait()

    def _lost(self, verdict: Verdict) -> None:
        wid = verdict.worker_id
        self.lost.pop(wid, None)
        self.lost[wid] = None
        if len(self.lost) > _LOST_NAMES:
            del self.lost[next(iter(self.lost))]
        if verdict.reason == "silent":
            self._pending_deaths.append(verdict)
            self._retained[wid] = verdict.epoch

    def _forget(self, workers: list[str]) -> None:
        """The monitor forgot these workers: so does everything here that remembers them."""
        for wid in workers:
            self._heard.pop(wid, None)
            self.worker_auth.forget(wid)
            if self._retained.pop(wid, None) is not None:
                self._clears[wid] = None

    def _measure_lag(self, now: float) -> None:
        # A heartbeater that is not connected sends nothing that could arrive: it measures nothing.
        # tuple() copies the deque the heartbeat's thread appends to in one step (it holds the GIL).
        # Heartbeats sent before the plane listened (at start, or while it reconnected) never come.
        since = self._listening_since
        outboxes = [(wid, tuple(sent for sent in h.outbox if sent[2] >= since))
                    for wid, h in self.heartbeaters.items() if h.connected.is_set()]
        change = self.lag.update(outboxes, now)
        if change is None:
            return
        self.monitor.on_input_lag(change.holding, now, since=now - change.lag_s)
        if change.holding:  # a defence at work, counted in the report (lag_holds): not a fault to tell
            _log.info("control plane: input %.2f s behind; that time is nobody's silence until it catches up",
                      change.lag_s)
        else:
            _log.info("control plane: input caught up (%.2f s behind)", change.lag_s)

    def workers_lost(self) -> list[str]:
        """The workers lost in this run, the latest 1 000 (any thread)."""
        for _ in range(3):
            with contextlib.suppress(RuntimeError):  # changed size while copied from another thread
                return list(self.lost)
        return []

    def heard(self) -> dict[str, Heartbeat]:
        """The newest heartbeat heard from each worker (lanes busy, leases, device stats); a copy."""
        for _ in range(3):
            with contextlib.suppress(RuntimeError):  # changed size while copied from another thread
                return dict(self._heard)
        return {}


def _direct_queue(handler: Callable[[aiomqtt.Message], None]) -> type[asyncio.Queue[aiomqtt.Message]]:
    """A queue type for ``aiomqtt.Client(queue_type=...)`` that hands each message straight to
    ``handler`` instead of storing it. aiomqtt's iterator spends a task and an ``asyncio.wait``
    per message; at 1 000 workers and 2 Hz that was most of the monitor's CPU."""

    class DirectQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            handler(item)

    return DirectQueue


def _nonce_of(payload: bytes | bytearray) -> str:
    """The nonce of a command payload, if it has a usable one (to tag the answer), else ""."""
    if len(payload) > MAX_BYTES["cmd"]:  # refused as oversized: never parsed whole
        return ""
    try:
        obj = from_json(payload)
    except ValueError:
        return ""
    nonce = obj.get("nonce") if isinstance(obj, dict) else None
    return nonce if isinstance(nonce, str) and len(nonce) <= _MAX_NONCE and nonce.isalnum() else ""


def _verdict_event(v: Verdict) -> Event:
    what = {"dead": "worker_lost", "hung": "worker_hung"}.get(v.kind, "worker_recovered")
    return Event(what=what, subject=v.worker_id, reason=v.reason[:4096], t=time.time())
