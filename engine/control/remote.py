"""An engine seen from another machine through its broker: telemetry in, as snapshots; signed
commands out, each answered by the engine's event for it.

The decisions this module protects:
- Everything from the broker is validated at the socket (``wire.decode``); a bad message is
  counted and dropped, as in the engine's own plane.
- The client runs on a thread and event loop of its own and hands snapshots to a callback, so a UI
  never waits on the network; it reconnects with backoff, and tells each connection made and each
  attempt that failed, with why in words (``on_connection``): before any telemetry there is no
  snapshot to carry it, and a room attached to an address where no broker listens waited for ever
  without a word (issue 29). A stop while it is still connecting ends the attempt: a broker that
  takes the call and never answers it cannot hold a room's quit.
- A command is matched to its answer by the nonce it was signed with; no answer within the timeout
  is reported as such, never guessed.
- ``--record FILE`` keeps every telemetry message as it came, inflated (one JSON object per line),
  which ``replay`` plays back. A file is taken for a recording only if its first line is a whole
  telemetry frame this build reads (``RecordingError`` says what it is instead, read from that
  line alone, so a large file that is not one is refused at once); later lines that are not (a
  recording cut off mid-line by its recorder's end) are skipped. Before (issue 29) a text file or
  random bytes came out of ``replay`` as a raw decode error after the whole file was read.
- The link is measured as frames arrive (engine/control/link_meter.py) and its view rides on each
  snapshot; while nothing arrives, the latest snapshot is handed over again once a second with the
  link's view brought up to date, so an attached room shows the silence growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import aiomqtt

from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.compact import unpack_record
from warpdeck.engine.control.drops import DropCounter
from warpdeck.engine.control.link_meter import LinkMeter
from warpdeck.engine.control.looping import LoopThread, cancel_and_wait, keep_connected
from warpdeck.engine.control.signing import Signer
from warpdeck.engine.control.telemetry import detail_from, snapshot_from
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import MAX_BYTES, EngineState, Event, Telemetry, WireError, decode, encode, plain
from warpdeck.engine.state.commands import Command, CommandResult
from warpdeck.engine.state.part_views import LinkView
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.snapshot import EngineSnapshot, TaskDetail

__all__ = ["RecordingError", "RemoteEngine", "read_recording"]


_TELEMETRY = frozenset(("telemetry",))
_EVENTS = frozenset(("event",))
_STATE = frozenset(("engine_state",))
_SILENCE_TICK_S = 1.0
"""While no frame arrives, the latest snapshot goes out again this often with the link's view."""


class RemoteEngine:
    """Attach to ``pipeline`` on the broker at ``address``. ``start()`` returns at once."""

    def __init__(self, address: BrokerAddress, pipeline: str, *, secret: bytes | None = None,
                 on_snapshot: Callable[[EngineSnapshot], None] | None = None,
                 on_connection: Callable[[str], None] | None = None,
                 record: Path | None = None, timeout_s: float = 5.0) -> None:
        self.address = address
        self.topics = Topics(pipeline)
        self._signer = Signer(secret) if secret else None
        self.on_snapshot = on_snapshot
        self.on_connection = on_connection
        """Told on the client's thread: "" when a connection is made; why, in words, when an attempt fails or the
        connection is lost (``connection refused``), once per attempt."""
        self._record_path = record
        self._record: IO[str] | None = None
        self.timeout_s = timeout_s
        self.dropped = DropCounter()
        self.connected = threading.Event()
        self.engine_state = "unknown"
        self.error = ""
        """Why the last attempt to connect failed or the connection was lost ("" while connected)."""
        self.events: deque[Event] = deque(maxlen=1000)
        self.latest: EngineSnapshot | None = None
        self._timeline: deque[BatchRecord] = deque(maxlen=2048)
        self.meter = LinkMeter()
        """The link as frames arrive: bytes and frames a second, lag, frames lost (``link``)."""
        self._answers: dict[str, asyncio.Future[Event]] = {}
        self._client: Any = None
        self._thread = LoopThread("warpdeck-attach", self._main)

    @property
    def can_command(self) -> bool:
        return self._signer is not None

    @property
    def link(self) -> LinkView:
        """The link as of now (any thread)."""
        return self.meter.view(time.monotonic(), self.connected.is_set())

    # -- lifecycle (any thread) ---------------------------------------------------------------
    def start(self) -> None:
        if self._record_path is not None:
            self._record_path.parent.mkdir(parents=True, exist_ok=True)
            self._record = self._record_path.open("a", encoding="utf-8")
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._thread.stop(timeout)
        if self._record is not None:
            self._record.close()
            self._record = None

    def detail(self, key: str) -> TaskDetail | None:
        """One task as the latest telemetry tells it (``telemetry.detail_from``), None before any
        telemetry arrived. The full detail (history, traceback, any task of the table) needs the
        engine itself: telemetry samples the table, and the wire has no query that returns data."""
        snap = self.latest
        return detail_from(snap, key) if snap is not None else None

    def send(self, cmd: Command) -> Future[CommandResult]:
        """Sign and publish ``cmd``; the future holds the engine's answer (thread-safe)."""
        if self._signer is None:
            done: Future[CommandResult] = Future()
            done.set_result(CommandResult(False, 0, "no command secret: attach with --secret-file or $WARPDECK_SECRET"))
            return done
        loop = self._thread.loop
        if loop is None:
            early: Future[CommandResult] = Future()
            early.set_result(CommandResult(False, 0, "not connected yet"))
            return early
        return asyncio.run_coroutine_threadsafe(self._send(cmd), loop)

    # -- the client thread ----------------------------------------------------------------------
    async def _main(self, stopping: asyncio.Event) -> None:
        def lost(exc: aiomqtt.MqttError) -> None:
            self.error = _connect_error_words(exc)
            self._tell_connection(self.error)

        async def session(client: aiomqtt.Client) -> None:
            try:
                await client.subscribe([(self.topics.telemetry, 0), (self.topics.events, 1),
                                        (self.topics.engine_state, 1)])
                self._client = client
                self.connected.set()
                self.error = ""
                self._tell_connection("")
                reader = asyncio.create_task(self._read(client))
                stop = asyncio.create_task(stopping.wait())
                await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
                await cancel_and_wait((reader, stop))  # raises the reader's MqttError: reconnect
            finally:
                self._client = None
                self.connected.clear()

        ticker = asyncio.create_task(self._tell_silence(stopping), name="wd-attach-silence")
        client = asyncio.create_task(keep_connected(stopping, lambda: {
            **self.address.client_kwargs(), "keepalive": 5, "max_queued_incoming_messages": 10_000},
            session, lost), name="wd-attach-client")
        stop = asyncio.create_task(stopping.wait(), name="wd-attach-stop")
        try:
            await asyncio.wait({client, stop}, return_when=asyncio.FIRST_COMPLETED)
            if self.connected.is_set():
                await client  # the session sees the stop and disconnects
            else:  # still connecting: a broker that took the call may never answer it
                await cancel_and_wait([client])
        finally:
            await cancel_and_wait([ticker, stop, client])

    def _tell_connection(self, why: str) -> None:
        if self.on_connection is not None:
            self.on_connection(why)

    async def _tell_silence(self, stopping: asyncio.Event) -> None:
        """While no frame arrives (or the broker is away), hand the latest snapshot over again with
        the link's view of now."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SILENCE_TICK_S):
                    await stopping.wait()
            snap, link = self.latest, self.link
            if snap is not None and (not link.connected or (link.silent_s or 0.0) >= _SILENCE_TICK_S):
                self._deliver(dataclasses.replace(snap, link=link))

    def _deliver(self, snap: EngineSnapshot) -> None:
        self.latest = snap
        if self.on_snapshot is not None:
            self.on_snapshot(snap)

    async def _read(self, client: Any) -> None:
        async for message in client.messages:
            topic = str(message.topic)
            payload = message.payload if isinstance(message.payload, bytes | bytearray) else b""
            try:
                if topic == self.topics.telemetry:
                    self._on_telemetry(payload)
                elif topic == self.topics.events:
                    ev = decode(payload, _EVENTS)
                    assert isinstance(ev, Event)
                    self.events.append(ev)
                    answer = self._answers.pop(ev.ref, None) if ev.ref else None
                    if answer is not None and not answer.done():
                        answer.set_result(ev)
                elif topic == self.topics.engine_state and payload:
                    st = decode(payload, _STATE)
                    assert isinstance(st, EngineState)
                    self.engine_state = st.state
                else:  # amqtt also hands out retained messages of topics nobody asked for
                    self.dropped.drop("wrong_topic", topic)
            except WireError as exc:
                self.dropped.drop(exc)

    def _on_telemetry(self, payload: bytes | bytearray) -> None:
        mono, wall = time.monotonic(), time.time()
        try:
            raw = plain(payload)
            tel = decode(raw, _TELEMETRY)
        except WireError as exc:
            self.meter.on_refused(str(exc))
            raise
        assert isinstance(tel, Telemetry)
        self.meter.on_frame(len(payload), tel.sent, tel.frame, mono, wall)
        if self._record is not None:
            self._record.write(raw.decode() + "\n")
            self._record.flush()
        self._timeline.extend(unpack_record(p) for p in tel.timeline)
        self._deliver(snapshot_from(tel, tuple(self._timeline), self.meter.view(mono, self.connected.is_set())))

    async def _send(self, cmd: Command) -> CommandResult:
        client = self._client
        if client is None or self._signer is None:
            return CommandResult(False, 0, f"not connected to {self.address.url}")
        signed = self._signer.sign(cmd)
        answer: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        self._answers[signed.nonce] = answer
        try:
            await client.publish(self.topics.cmd, encode(signed), qos=1)
            async with asyncio.timeout(self.timeout_s):  # not wait_for: it can swallow a cancellation (3.11)
                ev = await answer
        except TimeoutError:
            return CommandResult(False, 0, f"no answer from the engine within {self.timeout_s:g} s")
        except aiomqtt.MqttError as exc:
            return CommandResult(False, 0, f"not sent: {exc}")
        finally:
            self._answers.pop(signed.nonce, None)
        return CommandResult(ev.what == "command_applied", ev.affected, ev.reason, changed=ev.changed)


def _connect_error_words(exc: aiomqtt.MqttError) -> str:
    """Why a connection failed, in words a person reads after an address: ``connection refused``,
    ``name or service not known``, ``operation timed out`` (aiomqtt's text less its ``[Errno 111]``)."""
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", str(exc)).strip() or type(exc).__name__
    return text[:1].lower() + text[1:]


class RecordingError(ValueError):
    """A file ``replay`` cannot play: its first line is not a whole telemetry frame this build reads."""

    def __init__(self, path: Path, why: str, *, other_version: bool = False) -> None:
        what = "not a recording this build reads" if other_version else "not a warpdeck recording"
        super().__init__(f"{what}: {path}: {why}")
        self.path = path
        self.why = why
        """What the file is instead, in words (``it is empty``, ``no telemetry on line 1 (…)``)."""
        self.other_version = other_version
        """A recording of another telemetry version (a newer or older warpdeck's)."""


_LINE_LIMIT = MAX_BYTES["telemetry"] + 1
"""The longest line a recording's frame can take (an inflated frame's limit, and its newline)."""


def read_recording(path: Path, refused: list[WireError] | None = None) -> Generator[EngineSnapshot]:
    """The snapshots of a ``--record`` file, in order. The first line must be telemetry this build
    reads, else ``RecordingError`` (raised by the first ``next``, having read that line alone); later
    lines that are not are skipped, and added to ``refused`` when given."""
    timeline: deque[BatchRecord] = deque(maxlen=2048)
    with path.open("rb") as f:
        first = _first_frame(path, f.readline(_LINE_LIMIT))
        for tel in itertools.chain((first,), _later_frames(f, refused)):
            timeline.extend(unpack_record(p) for p in tel.timeline)
            yield snapshot_from(tel, tuple(timeline))


def _later_frames(lines: Iterable[bytes], refused: list[WireError] | None) -> Iterator[Telemetry]:
    for line in lines:
        try:
            tel = decode(line.strip(), _TELEMETRY)
        except WireError as exc:
            if refused is not None:
                refused.append(exc)
            continue
        assert isinstance(tel, Telemetry)
        yield tel


def _first_frame(path: Path, line: bytes) -> Telemetry:
    """A recording's first line as telemetry, or ``RecordingError`` saying what the file is instead."""
    if not line:
        raise RecordingError(path, "it is empty")
    try:
        tel = decode(line.strip(), _TELEMETRY)
    except WireError as exc:
        if len(line) >= _LINE_LIMIT:
            why = f"its first line is longer than any telemetry frame ({MAX_BYTES['telemetry']:,} bytes)"
        elif not line.endswith(b"\n") and line.lstrip().startswith(b"{") and exc.reason == "malformed":
            why = f"its first frame is cut off after {len(line):,} bytes"
        else:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                why = f"it is not text (byte {line[bad.start]:#04x} at offset {bad.start:,} is not UTF-8)"
            else:
                if exc.reason == "version":
                    raise RecordingError(path, exc.detail, other_version=True) from None
                why = f"no telemetry on line 1 ({exc.detail if exc.reason == 'malformed' else exc})"
        raise RecordingError(path, why) from None
    assert isinstance(tel, Telemetry)
    return tel
