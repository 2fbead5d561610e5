"""The engine's side of the control plane, on a thread and event loop of its own.

It starts the embedded broker (unless given a real one), the engine's own worker heartbeat, and one
MQTT connection for the engine: retained ``online`` state with an ``offline`` Last Will; worker
births, heartbeats and deaths into the monitor; signed commands into the engine; telemetry (at most
4 Hz) and events out.

The decisions this module protects:
- The engine never waits on the broker: the plane reads the latest immutable snapshot and hands
  commands and verdicts to the engine's loop with ``call_soon_threadsafe``; a broker that is away
  only stops telemetry, and the plane reconnects with backoff.
- Every message is validated once, here, at the socket, as it is read (no task, no queue); a bad
  one is counted by reason and dropped, and nothing it raises stops the plane. Commands go on to
  engine/control/command_intake.py (verified before the engine sees them), worker messages to
  engine/control/worker_intake.py (which holds Wills and retains deaths for the convicted).
- Refusing is cheap: a refused command or dropped message costs no task and no publish of its
  own; each reason is told in at most one event a second, and every event waits in one bounded
  queue that drops the oldest (per-task events first) when full (engine/control/outbox.py).
- While the plane is itself disconnected the monitor convicts nobody (it marks workers stale), and
  the Wills it holds convict nobody either; nor while its input runs behind, which the engine's own
  workers' heartbeats measure (engine/control/lag.py).
- It reconnects as every control-plane client does (``keep_connected``, engine/control/looping.py),
  with an ``offline`` Last Will; on the way out it flushes its events and says ``offline`` itself.
- Telemetry fits a slow link (compressed frames within a budget: engine/control/telemetry.py), and
  stalls are told per batch from the run's event stream, not per task from snapshots.
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
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiomqtt

from warpdeck.engine.control.broker import BrokerAddress, EmbeddedBroker
from warpdeck.engine.control.command_intake import CommandIntake
from warpdeck.engine.control.drops import DropCounter
from warpdeck.engine.control.heartbeat import Heartbeater, WorkerInfo, WorkerProbe
from warpdeck.engine.control.lag import InputLag
from warpdeck.engine.control.looping import LoopThread, cancel_and_wait, keep_connected
from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import MonitorConfig, Verdict, WorkerStatus
from warpdeck.engine.control.outbox import EVENT_PUBLISHERS, EventQueue, Summaries, flush_events, send_events
from warpdeck.engine.control.signing import Verifier
from warpdeck.engine.control.socket_reads import BatchedReader, read_in_batches
from warpdeck.engine.control.telemetry import EventTracker, StallEvents, TelemetryFrames
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import EngineState, Event, Heartbeat, WireError, decode, encode
from warpdeck.engine.control.worker_auth import WorkerAuth
from warpdeck.engine.control.worker_intake import WorkerIntake
from warpdeck.engine.state.commands import Command, CommandResult
from warpdeck.engine.state.run_events import RunEvents
from warpdeck.engine.state.snapshot import ControlView, EngineSnapshot

__all__ = ["ControlPlane", "ControlSettings"]


_log = logging.getLogger(__name__)
_WORKER_KINDS = {"birth": frozenset(("birth",)), "hb": frozenset(("hb",)), "death": frozenset(("death",))}


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
        run_events: RunEvents | None = None,
    ) -> None:
        self.settings = settings
        self.topics = topics
        self._cmd_topic = topics.cmd  # compared with every message's topic: built once
        self._local = list(workers)
        self.heartbeaters: dict[str, Heartbeater] = {}
        """The in-process workers' heartbeats, by worker id (each its own connection and Will)."""
        self._latest = latest
        self._on_verdict = on_verdict
        cfg = settings.monitor or MonitorConfig(interval_s=settings.heartbeat_s)
        self.monitor = WorkerMonitor(cfg)
        hold = settings.input_lag_hold_s
        self.lag = InputLag(hold, resume_s=(hold or 0.5) / 2)
        """How far behind the plane hears, measured with the in-process workers' heartbeats."""
        self.verifier = Verifier(settings.secret)
        self.worker_auth = WorkerAuth(settings.secret)
        """Which worker messages to act on: with a secret, only those that verify."""
        self.dropped = DropCounter()
        self.summaries = Summaries()
        """Refusals and drops per reason, told at most once a second each."""
        self.events = EventQueue()
        """Every event on its way out; when full the oldest goes (per-task events first), counted in ``events.dropped``:
        never in ``dropped``, which counts what others sent."""
        self.stalls = StallEvents()
        """The run's stall events (one per batch), told as events; telemetry frames and failures."""
        self._unheard = run_events.subscribe(self.stalls.on_run_event) if run_events is not None else None
        self.frames, self._failures = TelemetryFrames(), EventTracker()
        self._commands = CommandIntake(self.verifier, command, self.summaries, self.events)
        self.refused = self._commands.refused
        """Commands refused, by reason (the command intake's count)."""
        self._intake = WorkerIntake(self.monitor, self.lag, self.worker_auth, self.heartbeaters, self._drop,
                                    topics=topics, secret=settings.secret, will_hold_s=settings.will_hold_s)
        # Every worker message comes this way: the intake's method, looked up once.
        self._on_worker = self._intake.on_worker
        self.reconnects = 0
        self.connected = threading.Event()
        self.address: BrokerAddress | None = settings.broker
        self.error = ""
        self.stopped = False
        """Stopped on an error for the rest of the run (``view().stopped``; the room says so at once)."""
        self.workers: tuple[WorkerStatus, ...] = ()
        """The monitor's view of every worker, replaced whole after each tick (read from any thread)."""
        self._client: Any = None
        self.batched: BatchedReader | None = None
        """The current connection's batched reader (None: aiomqtt's own path)."""
        self.verdicts: deque[Verdict] = deque(maxlen=1000)
        """Every verdict, newest last (bounded), with the monitor's clock (``time.monotonic``)."""
        self._engine_loop: asyncio.AbstractEventLoop | None = None
        self._broker: EmbeddedBroker | None = None
        self._thread = LoopThread("warpdeck-control", self._main)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = time.time()
        self._listening_since = math.inf
        """When the current connection's subscriptions took effect (monotonic; inf while there is none)."""

    # -- lifecycle (engine thread) ------------------------------------------------------------
    def start(self) -> None:
        self._engine_loop = self._commands.engine_loop = asyncio.get_running_loop()
        self._thread.start()

    def stop(self, timeout: float = 12.0) -> None:
        """Say goodbye (graceful worker death, engine offline) and stop the broker if it is ours.
        ``timeout`` covers the heartbeaters' and the broker's own stops (5 s each at most)."""
        if self._unheard is not None:
            self._unheard()
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
            commands_applied=self._commands.applied,
            connected=self.connected.is_set(),
            reconnects=self.reconnects,
            input_lag_s=self.lag.lag_s,
            lag_holds=self.lag.holds,
            workers_signed=self.settings.secret is not None,
            workers_lost=counted.workers_lost,
            workers_forgotten=counted.forgotten,
            stopped=self.stopped,
        )

    @property
    def applied(self) -> int:
        """Verified commands the engine ran, whatever they answered."""
        return self._commands.applied

    def workers_lost(self) -> list[str]:
        """The workers lost in this run, the latest 1 000 (any thread)."""
        return self._intake.workers_lost()

    def heard(self) -> dict[str, Heartbeat]:
        """The newest heartbeat heard from each worker (lanes busy, leases, device stats); a copy."""
        return self._intake.heard()

    # -- the control thread -------------------------------------------------------------------
    async def _main(self, stopping: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
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
            # The tick (the monitor, the lag, the views) and the connection live and die together: a
            # tick that raised used to end alone, unseen, while the connection went on (issue 29).
            ticker = asyncio.create_task(self._tick_loop(stopping), name="wd-plane-tick")
            connect = asyncio.create_task(self._connect_loop(stopping), name="wd-plane-connect")
            try:
                await asyncio.wait([ticker, connect], return_when=asyncio.FIRST_COMPLETED)
                if ticker.done() and not ticker.cancelled() and ticker.exception() is not None:
                    ticker.result()  # the tick's error is the plane's: raised, the connection ends below
                await asyncio.shield(connect)  # a tick ended by the stop: the connection says goodbye
            finally:
                await cancel_and_wait([ticker, connect])
        except Exception as exc:  # noqa: BLE001 - the engine runs on without a control plane
            self.error = f"{type(exc).__name__}: {exc}"
            self.stopped = True
            # With its traceback: one line was all the log kept when the plane died mid-run (issue 29).
            _log.error("control plane stopped: %s", self.error, exc_info=exc)
        finally:
            await asyncio.gather(*(asyncio.to_thread(h.stop) for h in self.heartbeaters.values()))
            if self._broker is not None:
                await asyncio.to_thread(self._broker.stop)

    async def _connect_loop(self, stopping: asyncio.Event) -> None:
        assert self.address is not None
        address, topics = self.address, self.topics
        offline = encode(self._state("offline"))

        def client_kwargs() -> dict[str, Any]:
            return {**address.client_kwargs(), "will": aiomqtt.Will(topics.engine_state, offline, qos=1, retain=True),
                    "keepalive": 5, "identifier": f"wd-{topics.pipeline}-engine"[:128], "clean_session": True,
                    "queue_type": _direct_queue(self._dispatch)}

        async def session(client: aiomqtt.Client) -> None:
            every = self.settings.read_every_s
            self.batched = read_in_batches(client, self._on_raw, every) if every else None
            try:
                await self._serve(client, stopping)
                await flush_events(client, topics.events, self.summaries, self.events)
                await client.publish(topics.engine_state, offline, qos=1, retain=True)
            finally:
                if self.batched is not None:
                    self.batched.close()

        def lost(exc: aiomqtt.MqttError) -> None:
            self._lost_connection(exc)
            self.reconnects += 1

        await keep_connected(stopping, client_kwargs, session, lost, on_last=self._lost_connection)

    def _state(self, state: Literal["online", "offline"]) -> EngineState:
        return EngineState(state=state, pipeline=self.topics.pipeline, host=socket.gethostname(), pid=os.getpid(),
                           started=self._started)

    async def _serve(self, client: Any, stopping: asyncio.Event) -> None:
        await client.publish(self.topics.engine_state, encode(self._state("online")), qos=1, retain=True)
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
                 *(asyncio.create_task(send_events(client, tp.events, self.events), name=f"wd-plane-events-{i}")
                   for i in range(EVENT_PUBLISHERS)), stop]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stop and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]  # an MqttError: reconnect
        finally:
            await cancel_and_wait(tasks)

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
            self._commands.on_command(payload)
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

    def _drop(self, err: WireError | str, detail: str = "") -> None:
        """Count a dropped message by reason; its reason's event waits for that reason's turn."""
        self.dropped.drop(err, detail)
        first = self.summaries.note("message_dropped", err.reason if isinstance(err, WireError) else err,
                                    self.dropped.last)
        if first is not None:
            self.events.put(first)

    async def _publish_loop(self, client: Any, stopping: asyncio.Event) -> None:
        period = 1.0 / self.settings.telemetry_hz
        seq = -1
        while not stopping.is_set():
            snap = self._latest()
            if snap is not None and snap.seq != seq:
                seq = snap.seq
                await client.publish(self.topics.telemetry, self.frames.frame(snap, self.view()), qos=0)
                for ev in self._failures.events(snap):
                    self.events.put(ev)
            await self._intake.tell(client)  # retained deaths for the convicted, and their clearing
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):  # not wait_for: it can swallow a cancellation (3.11)
                    await stopping.wait()

    def _lost_connection(self, exc: aiomqtt.MqttError) -> None:
        """Connecting failed or the connection went (also as the plane stops): the monitor learns
        so, and the Wills held convict nobody."""
        if self.connected.is_set():
            self.monitor.on_connection(False, time.monotonic())
        self.connected.clear()
        self._intake.drop_wills()
        self.error = str(exc)

    async def _tick_loop(self, stopping: asyncio.Event) -> None:
        views_every = 1.0 / self.settings.views_hz
        views_at = 0.0
        while not stopping.is_set():
            now = time.monotonic()
            if self.connected.is_set():
                self._intake.release_wills(now)
            self._measure_lag(now)
            verdicts = self.monitor.tick(now)
            self._intake.forget()
            for ev in (*self.summaries.due(), *self.stalls.drain()):
                self.events.put(ev)
            for verdict in verdicts:
                self.verdicts.append(verdict)
                self.events.put(_verdict_event(verdict))
                if verdict.kind == "dead":
                    self._intake.on_dead(verdict)
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

    def _measure_lag(self, now: float) -> None:
        # A heartbeater that is not connected sends nothing that could arrive: it measures nothing.
        # Heartbeats sent before the plane listened (at start, or while it reconnected) never come.
        since = self._listening_since
        outboxes = [(wid, h.sent_since(since)) for wid, h in self.heartbeaters.items() if h.connected.is_set()]
        change = self.lag.update(outboxes, now)
        if change is None:
            return
        self.monitor.on_input_lag(change.holding, now, since=now - change.lag_s)
        if change.holding:  # a defence at work, counted in the report (lag_holds): not a fault to tell
            _log.info("control plane: input %.2f s behind; that time is nobody's silence until it catches up",
                      change.lag_s)
        else:
            _log.info("control plane: input caught up (%.2f s behind)", change.lag_s)


def _direct_queue(handler: Callable[[aiomqtt.Message], None]) -> type[asyncio.Queue[aiomqtt.Message]]:
    """A queue type for ``aiomqtt.Client(queue_type=...)`` that hands each message straight to
    ``handler`` instead of storing it. aiomqtt's iterator spends a task and an ``asyncio.wait``
    per message; at 1 000 workers and 2 Hz that was most of the monitor's CPU."""

    class DirectQueue(asyncio.Queue[aiomqtt.Message]):
        def put_nowait(self, item: aiomqtt.Message) -> None:
            handler(item)

    return DirectQueue


def _verdict_event(v: Verdict) -> Event:
    what = {"dead": "worker_lost", "hung": "worker_hung"}.get(v.kind, "worker_recovered")
    return Event(what=what, subject=v.worker_id, reason=v.reason[:4096], t=time.time())
