"""Read the monitor's MQTT socket in batches, not one wake-up per message.

At 1 000 workers x 2 Hz the plane receives 2 000 small messages a second, each in a TCP segment of
its own. Through aiomqtt every one of them wakes the event loop, and paho reads it with three
``recv`` calls (the fixed header byte, the length, the rest) and builds two message objects before
the plane sees it. The wake-ups and system calls cost more than the message: a bare aiomqtt
subscriber took 9 to 15 % of a core at that rate, more than the monitor's whole budget (10 %).

``read_in_batches`` changes three things on one connected ``aiomqtt.Client``:

1. paho's ``_sock_recv`` reads the socket in 256 KiB chunks into a buffer and serves paho's small
   reads from it, so a burst of messages costs one system call;
2. the socket's reader, once woken, drains every complete packet, then sleeps ``every_s`` (10 ms)
   before it listens again, so the messages of those milliseconds are read in one pass; 10 ms is
   nothing next to the 0.5 s and 3 s conviction bounds;
3. each PUBLISH goes from paho's callback straight to ``handler(topic, payload, retain)``, with no
   aiomqtt ``Message`` and no queue.

This reaches into aiomqtt's and paho's internals (``Client._client``, ``Client._disconnected``,
``paho.Client._sock_recv``, ``loop_read``); the dependency pins ``aiomqtt<3``, and where those names
are missing ``read_in_batches`` changes nothing and returns False, so messages still arrive through
aiomqtt's own path. The tests assert that it is in force with the installed versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho

__all__ = ["BatchedReader", "read_in_batches"]

_log = logging.getLogger(__name__)
_CHUNK = 256 * 1024
#: Packets read in one pass at most, so a flood cannot hold the loop (the rest wait every_s).
_MAX_PACKETS = 20_000

Handler = Callable[[str, bytes, bool], None]


class BatchedReader:
    """The state of one connection's batched reads (see the module's docstring)."""

    def __init__(self, aclient: Any, handler: Handler, every_s: float) -> None:
        self.aclient = aclient
        self.paho: Any = aclient._client
        self.handler = handler
        self.every_s = every_s
        self.loop = asyncio.get_running_loop()
        self.sock: Any = self.paho.socket()
        self.fd: int = self.sock.fileno()
        self._raw_recv: Callable[[int], bytes] = self.paho._sock_recv
        self._buf = b""
        self._pos = 0
        self._dry = False
        self._timer: asyncio.TimerHandle | None = None
        #: Wake-ups, system reads and packets so far (for benchmarks and tests).
        self.wakeups = 0
        self.reads = 0
        self.packets = 0

    # -- paho's side ---------------------------------------------------------------------------------
    def recv(self, n: int) -> bytes:
        """paho's ``_sock_recv``: serve ``n`` bytes at most from the buffer, refilling it with one
        read when it is empty. b"" means the peer closed; BlockingIOError that nothing is there."""
        if self._pos >= len(self._buf):
            try:
                data = self._raw_recv(_CHUNK)
            except BlockingIOError:
                self._dry = True
                raise
            self.reads += 1
            if not data:
                return data
            self._buf, self._pos = data, 0
        end = self._pos + n
        out = self._buf[self._pos : end]
        self._pos = end
        return out

    def on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        self.packets += 1
        self.handler(message.topic, message.payload, bool(message.retain))

    # -- the loop's side -----------------------------------------------------------------------------
    def install(self) -> None:
        self.paho._sock_recv = self.recv
        self.paho.on_message = self.on_message
        self.loop.remove_reader(self.fd)
        self.loop.add_reader(self.fd, self._on_readable)

    def _connected(self) -> bool:
        return self.paho._sock is self.sock

    def _on_readable(self) -> None:
        self.wakeups += 1
        self.loop.remove_reader(self.fd)
        try:
            self.drain()
        except Exception as exc:  # noqa: BLE001 - as aiomqtt's own reader: a broken connection
            disconnected = self.aclient._disconnected
            if not disconnected.done():
                disconnected.set_exception(exc)
            return
        if self._connected():
            self._timer = self.loop.call_later(self.every_s, self._listen)

    def _listen(self) -> None:
        self._timer = None
        if self._connected():
            self.loop.add_reader(self.fd, self._on_readable)

    def drain(self) -> None:
        """Read every complete packet there is: until the buffer is empty and the socket dry."""
        loop_read = self.paho.loop_read
        for _ in range(_MAX_PACKETS):
            self._dry = False
            if loop_read() != paho.MQTT_ERR_SUCCESS or not self._connected():
                return
            if self._dry and self._pos >= len(self._buf):
                return

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def read_in_batches(aclient: Any, handler: Handler, every_s: float = 0.01) -> BatchedReader | None:
    """Make a connected ``aiomqtt.Client`` read in batches and hand each PUBLISH to ``handler``
    (on the client's loop). Returns None, changing nothing, where the internals it needs differ."""
    try:
        reader = BatchedReader(aclient, handler, every_s)
        if reader.sock is None or not callable(reader._raw_recv) or not hasattr(aclient, "_disconnected"):
            return None
        reader.install()
    except (AttributeError, TypeError, ValueError, OSError) as exc:
        _log.warning("batched MQTT reads unavailable (%r); reading through aiomqtt", exc)
        return None
    return reader


def close_quietly(reader: BatchedReader | None) -> None:
    """Stop a reader's pending wake-up, if any (a closed connection needs nothing else)."""
    if reader is not None:
        with contextlib.suppress(Exception):
            reader.close()
