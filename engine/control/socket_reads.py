"""Read the monitor's MQTT socket in batches, not one wake-up per message.

At 1 000 workers x 2 Hz the plane receives 2 000 small messages a second, each in a TCP segment of
its own. Through aiomqtt every one of them wakes the event loop, and paho reads it with three
``recv`` calls (the fixed header byte, the length, the rest) and builds two message objects before
the plane sees it. The wake-ups and system calls cost more than the message: a bare aiomqtt
subscriber took 9 to 15 % of a core at that rate, more than the monitor's whole budget (10 %).

``read_in_batches`` changes three things on one connected ``aiomqtt.Client``:

1. paho's ``_sock_recv`` reads the socket in 64 KiB chunks into a buffer and serves paho's small
   reads from it, so a burst of messages costs one system call;
2. the socket's reader, once woken, drains every complete packet, then sleeps ``every_s`` (10 ms)
   and reads again, so the messages of those milliseconds are read in one pass; 10 ms is nothing
   next to the 0.5 s and 3 s conviction bounds. While every pass finds something the socket is
   polled on that timer, never registered again (a reader added and removed is two ``epoll_ctl``
   calls and a handle, which on the 2-core VM cost as much as the read); a pass that finds nothing
   listens for the socket again. A read shorter than the buffer took all there was (plain TCP; not
   TLS, whose reads end at a record), so a pass ends without another read to learn that;
3. each PUBLISH goes straight to ``handler(topic, payload, retain)``, with no aiomqtt ``Message``
   and no queue; the QoS 0 and QoS 1 PUBLISH packets wholly in the buffer (heartbeats, births,
   deaths, commands) are even parsed here, a run of them in one loop, at a packet boundary, without
   paho (its parse, message object and callback took 9 µs of the 13 µs a heartbeat cost, and
   about 40 µs of a QoS 1 message's 50 µs under a hostile flood). QoS 1 messages are acknowledged
   after their handlers ran, as paho does, but the PUBACKs of a run go out as one write, queued
   through paho's ``_packet_queue`` in order with its other packets: one PUBACK each cost two
   wake-up writes and a send, each a release of the GIL that the engine's loop then waited to
   take back. Everything else (QoS 2, acknowledgements, PINGRESP, a packet split between reads,
   MQTT 5) goes through paho as before, in order.

This reaches into aiomqtt's and paho's internals, listed in ``mqtt_internals.py`` with the exact
versions they were written for (pinned) and a canary test. Where one is missing ``read_in_batches``
changes nothing, says which in a warning and returns None, so messages still arrive through
aiomqtt's own path. Should one fail while the connection runs (anything but the connection's own
``OSError``), the reader logs it once and hands this connection back to aiomqtt's way of reading
(``fell_back``).

It also registers paho's writer itself: aiomqtt adds it with ``call_soon_threadsafe``, and a
connection that breaks before that callback runs has its socket closed under it (``add_writer`` on a
closed descriptor raised ``EBADF`` into the loop's handler, a traceback on stderr; on a reused
descriptor it would have watched another connection's socket). The writer is added only while the
socket is still paho's own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho

from warpdeck.engine.control.mqtt_internals import disconnected, missing

__all__ = ["BatchedReader", "read_in_batches"]

_log = logging.getLogger(__name__)
_CHUNK = 64 * 1024
_PUBLISH_QOS0 = 0x30
"""The first byte of a PUBLISH at QoS 0 without dup, less its retain bit; a topic's length field."""
_PUBLISH_QOS1 = 0x32
"""The same at QoS 1, less its retain and dup bits (a QoS 1 redelivery is handled as paho does: handed over again and
acknowledged); a packet id's length."""
_TOPIC_LEN = 2
_MID_LEN = 2
_PUBACK = bytes((paho.PUBACK, _MID_LEN))
"""A PUBACK's fixed header (MQTT 3.1.1): its packet id follows."""
_MAX_PACKETS = 20_000
"""Packets read in one pass at most, so a flood cannot hold the loop (the rest wait every_s)."""

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
        self._queue: Callable[[int, bytes, int, int], object] = self.paho._packet_queue
        self._buf = b""
        self._pos = 0
        self._dry = False
        self._got = False
        """This pass read bytes; its last read was shorter than a chunk (so the socket is empty)."""
        self._short = False
        self._trust_short = not hasattr(self.sock, "pending")
        """A short read says the socket is empty only on plain TCP: TLS returns a record at a time."""
        self._fast = self.paho._protocol in (paho.MQTTv31, paho.MQTTv311)
        """QoS 0 PUBLISH packets are parsed here (MQTT 3.1 and 3.1.1 only: 5 adds properties)."""
        self._timer: asyncio.TimerHandle | None = None
        self.fell_back: BaseException | None = None
        """Set when a paho internal failed at run time: this connection reads through aiomqtt's path."""
        self.wakeups = 0
        """Wake-ups, system reads and packets so far, and the packets parsed here without paho."""
        self.reads = 0
        self.packets = 0
        self.parsed = 0

    # -- paho's side ---------------------------------------------------------------------------------
    def _refill(self) -> bytes:
        """One read into the (empty) buffer; b"" when the peer closed, BlockingIOError when dry."""
        try:
            data = self._raw_recv(_CHUNK)
        except BlockingIOError:
            self._dry = True
            raise
        self.reads += 1
        if data:
            self._buf, self._pos = data, 0
            self._got = True
            self._short = self._trust_short and len(data) < _CHUNK
            # paho's keepalive watches this; packets parsed here never pass its own reads.
            self.paho._last_bytes_received = time.monotonic()
        return data

    def recv(self, n: int) -> bytes:
        """paho's ``_sock_recv``: serve ``n`` bytes at most from the buffer, refilling it with one
        read when it is empty. b"" means the peer closed; BlockingIOError that nothing is there."""
        if self._pos >= len(self._buf):
            if self.fell_back is not None:  # the buffer is served: paho reads for itself from now on
                self.paho._sock_recv = self._raw_recv
                return self._raw_recv(n)
            data = self._refill()
            if not data:
                return data
        end = self._pos + n
        out = self._buf[self._pos : end]
        self._pos = end
        return out

    def on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        self.packets += 1
        self.handler(message.topic, message.payload, bool(message.retain))

    # -- the loop's side -----------------------------------------------------------------------------
    def install(self) -> None:
        self._aio_on_message = self.paho.on_message
        self._aio_register_write = self.paho.on_socket_register_write
        self.paho._sock_recv = self.recv
        self.paho.on_message = self.on_message
        self.paho.on_socket_register_write = self._register_write
        self.loop.remove_reader(self.fd)
        self.loop.add_reader(self.fd, self._on_readable)

    def _connected(self) -> bool:
        return self.paho._sock is self.sock

    def _broken(self, exc: BaseException) -> None:
        """As aiomqtt's own reader and writer: an exception out of paho ends the connection."""
        ended = disconnected(self.aclient)
        if ended is not None and not ended.done():
            ended.set_exception(exc)

    def _register_write(self, _client: Any, _userdata: Any, sock: Any) -> None:
        # paho calls this from whichever thread publishes: add the writer on the loop, later.
        self.loop.call_soon_threadsafe(self._add_writer, sock)

    def _add_writer(self, sock: Any) -> None:
        # Between the call above and now the connection may have broken and paho closed the socket
        # (its unregister found no writer to remove): then there is nothing to write to.
        if self.paho._sock is not sock or sock.fileno() < 0:
            return
        self.loop.add_writer(sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        try:
            self.paho.loop_write()
        except Exception as exc:  # noqa: BLE001 - as aiomqtt's own writer: a broken connection
            self._broken(exc)

    def _on_readable(self) -> None:
        self.loop.remove_reader(self.fd)
        self._pass()

    def _poll(self) -> None:
        self._timer = None
        if self._connected():
            self._pass()

    def _pass(self) -> None:
        """One wake-up: drain, then poll again in ``every_s`` if this pass found anything, or
        listen for the socket if it found nothing (the traffic stopped)."""
        self.wakeups += 1
        self._got = False
        try:
            self.drain()
        except OSError as exc:  # the connection itself, not our reading of it
            self._broken(exc)
            return
        except Exception as exc:  # noqa: BLE001 - an internal we rely on failed: read as aiomqtt does
            self._fall_back(exc)
            return
        if not self._connected():
            return
        if self._got or self._pos < len(self._buf):  # (the rest of a pass cut at _MAX_PACKETS)
            self._timer = self.loop.call_later(self.every_s, self._poll)
        else:
            self.loop.add_reader(self.fd, self._on_readable)

    def _fall_back(self, exc: BaseException) -> None:
        """Hand this connection back to aiomqtt's way of reading, after whatever is buffered."""
        _log.warning("batched MQTT reads failed (%r); this connection reads through aiomqtt", exc)
        self.fell_back = exc
        self.close()
        self.paho.on_message = self._aio_on_message
        self.paho.on_socket_register_write = self._aio_register_write
        if self._pos >= len(self._buf):
            self.paho._sock_recv = self._raw_recv
        if self._connected():
            self.loop.add_reader(self.fd, self._read_plain)
            self._read_plain()

    def _read_plain(self) -> None:
        """aiomqtt's reader: one ``loop_read`` per wake-up (and until our buffer is served)."""
        try:
            while True:
                self.paho.loop_read()
                if self._pos < len(self._buf) and self._connected():
                    continue
                pending = getattr(self.paho._sock, "pending", None)  # TLS: decoded bytes not yet read
                if pending is not None and pending() > 0:
                    continue
                break
        except Exception as exc:  # noqa: BLE001 - as aiomqtt's own reader: a broken connection
            self._broken(exc)

    def drain(self) -> None:
        """Read every complete packet there is: until the buffer is empty and the socket dry."""
        client = self.paho
        loop_read = client.loop_read
        self._short = False
        for _ in range(_MAX_PACKETS):
            self._dry = False
            if self._fast and client._in_packet["command"] == 0:  # at a packet boundary
                took = self._take_publish()
                if took is True:
                    continue
                if took is None:
                    return  # dry
            if loop_read() != paho.MQTT_ERR_SUCCESS or not self._connected():
                return
            if self._dry and self._pos >= len(self._buf):
                return

    def _refill_for_parse(self) -> bool | None:
        """The buffer is served: True once a read refilled it; None when nothing is there; False
        when the connection closed or broke (paho's read meets that too, and says so)."""
        if self._short:
            return None  # the last read took all there was: the next pass reads the rest
        try:
            return bool(self._refill())  # b"": closed
        except BlockingIOError:
            return None
        except OSError:
            return False  # reset: paho's read closes the socket

    def _take_publish(self) -> bool | None:
        """Parse the QoS 0 and 1 PUBLISH packets at the head of the buffer, as many as are wholly there
        in a row, and hand each over: True. False: the head is anything else, or not all there
        (paho takes it). None: nothing to read."""
        if self._pos >= len(self._buf) and (empty := self._refill_for_parse()) is not True:
            return empty
        buf, pos = self._buf, self._pos
        n = len(buf)
        handler = self.handler
        acks = bytearray()
        first = pos
        try:
            pos = self._take_run(buf, pos, n, handler, acks)
        finally:
            if acks:  # for the handlers that ran, even if one raised
                self._queue(paho.PUBACK, bytes(acks), 0, 0)
        return pos > first

    def _take_run(self, buf: bytes, pos: int, n: int, handler: Handler, acks: bytearray) -> int:
        """The loop of ``_take_publish`` from ``pos``; returns where it stopped. Appends each QoS 1
        message's PUBACK to ``acks`` once its handler returned."""
        # One loop over the run of packets (not a call each): this is every heartbeat's path.
        while pos < n:
            b0 = buf[pos]
            qos1 = b0 & 0xF6 == _PUBLISH_QOS1  # PUBLISH, QoS 1 (retain and dup bits may be set)
            if not qos1 and b0 & 0xFE != _PUBLISH_QOS0:  # PUBLISH, QoS 0, not dup (retain may be set)
                break
            i, length, mult = pos + 1, 0, 1
            for _ in range(4):  # the remaining length: at most four bytes
                if i >= n:
                    length = -1  # cut short by the buffer's end
                    break
                byte = buf[i]
                i += 1
                length += (byte & 0x7F) * mult
                mult *= 128
                if not byte & 0x80:
                    break
            else:
                break  # malformed: paho refuses it
            end = i + length
            if length < _TOPIC_LEN or end > n:
                break
            tlen = buf[i] << 8 | buf[i + 1]
            body = i + _TOPIC_LEN + tlen
            mid_at = 0  # where a QoS 1 message's packet id is
            if qos1:
                if body + _MID_LEN > end:
                    break
                if buf[body] == 0 == buf[body + 1]:
                    break  # packet id 0 is not valid: paho refuses it
                mid_at = body
                body += _MID_LEN
            elif body > end:
                break
            try:
                topic = buf[i + 2 : i + 2 + tlen].decode()
            except UnicodeDecodeError:
                break
            # Taken before the handler runs: a handler that raises never sees its packet again.
            self._pos = pos = end
            self.packets += 1
            self.parsed += 1
            handler(topic, buf[body:end], bool(b0 & 1))
            if mid_at:  # after the handler, as paho does (a handler that raises leaves it unacknowledged)
                acks += _PUBACK + buf[mid_at : mid_at + _MID_LEN]
        return pos

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def read_in_batches(aclient: Any, handler: Handler, every_s: float = 0.01) -> BatchedReader | None:
    """Make a connected ``aiomqtt.Client`` read in batches and hand each PUBLISH to ``handler``
    (on the client's loop). Returns None, changing nothing, where the internals it needs differ."""
    gone = missing(aclient)
    if gone:
        _log.warning("batched MQTT reads unavailable (this library lacks %s); reading through aiomqtt",
                     ", ".join(gone))
        return None
    try:
        reader = BatchedReader(aclient, handler, every_s)
        if reader.sock is None or not callable(reader._raw_recv) or not hasattr(aclient, "_disconnected"):
            return None
        reader.install()
    except (AttributeError, TypeError, ValueError, OSError) as exc:
        _log.warning("batched MQTT reads unavailable (%r); reading through aiomqtt", exc)
        return None
    return reader
