"""Where the control plane's broker is: parsed from ``--broker``, or an embedded amqtt broker.

The decisions this module protects:
- ``embedded`` (the default) starts amqtt in this process, on a free loopback port, on a thread
  and event loop of its own: one command runs everything, and the broker's work never delays the
  engine's loop (nor the other way round).
- ``mqtt://user:pass@host:port`` and ``mqtts://`` (with a CA file) name a real broker; every
  client of this process connects with the same ``BrokerAddress``.
- An embedded broker stopping is the end of the run, not a fault: amqtt's warnings that it stopped
  with messages undelivered (to clients that already left) or its broadcast loop still busy are
  dropped. They could otherwise reach the terminal after the run log was put away, since the
  broker's thread may outlive the wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomqtt

from warpdeck.engine.control.looping import LoopThread

__all__ = ["BrokerAddress", "EmbeddedBroker", "free_port", "parse_broker"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """How to reach a broker. ``password`` is kept out of ``repr`` and ``url``."""

    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: Path | None = None

    @property
    def url(self) -> str:
        """The address without its password, for logs and the control room."""
        user = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``aiomqtt.Client`` (besides identifier, will and keepalive)."""
        kw: dict[str, Any] = {
            "hostname": self.host,
            "port": self.port,
            "username": self.username,
            "password": self.password,
        }
        if self.tls:
            kw["tls_params"] = aiomqtt.TLSParameters(
                ca_certs=str(self.ca_file) if self.ca_file else None, cert_reqs=ssl.CERT_REQUIRED
            )
        return kw


def parse_broker(url: str, ca_file: Path | str | None = None) -> BrokerAddress | None:
    """``None`` for ``embedded``; else the address in ``url``. Raises ``ValueError`` that says
    what is wrong with it."""
    if url == "embedded":
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"--broker {url!r}: use 'embedded', mqtt://[user:pass@]host[:port] or mqtts://…")
    if not parts.hostname:
        raise ValueError(f"--broker {url!r}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"--broker {url!r}: a broker URL has no path, query or fragment")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"--broker {url!r}: the port is not a number from 1 to 65535") from None
    tls = parts.scheme == "mqtts"
    ca = Path(ca_file) if ca_file is not None else None
    if ca is not None and not ca.is_file():
        raise ValueError(f"--ca-file {ca}: no such file")
    return BrokerAddress(
        parts.hostname,
        port or (8883 if tls else 1883),
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
        tls,
        ca,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (a broker binds it next; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def _close_leftover_streams(loop: asyncio.AbstractEventLoop) -> None:
    """Close the connections amqtt's shutdown leaves open (one accepted while it shut down, or a
    client half-way through its handshake), while their loop still runs: otherwise they are
    collected later, after the loop closed, and warn about unclosed transports in whatever code
    happens to run then. Objects are told by ``type``, never ``isinstance``: that falls back to an
    object's own ``__class__``, which some libraries' objects answer with a warning (torch's
    deprecated ``torch.distributed.reduce_op``: a FutureWarning after every run with a torch stage)."""
    for obj in gc.get_objects():
        if issubclass(type(obj), asyncio.StreamWriter):
            transport = obj.transport
            if getattr(transport, "_loop", None) is loop and not transport.is_closing():
                transport.close()
    await asyncio.sleep(0)  # let the transports' close callbacks run


class _ShutdownNoise(logging.Filter):
    """Drops amqtt's warnings about what a deliberate shutdown leaves undelivered."""

    NOISE = ("messages not broadcasted", "Failed to cleanly shutdown broadcast loop")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(part in message for part in self.NOISE)


_SHUTDOWN_NOISE = _ShutdownNoise()


class EmbeddedBroker:
    """amqtt on a loopback port, on a thread of its own. ``start()`` returns once it listens."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port
        self._thread = LoopThread("warpdeck-broker", self._serve)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def address(self) -> BrokerAddress:
        assert self.port is not None, "start() the broker first"
        return BrokerAddress(self.host, self.port)

    def start(self, timeout: float = 10.0) -> BrokerAddress:
        for logger in ("amqtt", "transitions"):  # amqtt logs every connection at INFO
            logging.getLogger(logger).setLevel(logging.WARNING)
        logging.getLogger("amqtt.broker").addFilter(_SHUTDOWN_NOISE)  # a no-op when already there
        if self.port is None:
            self.port = free_port(self.host)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"embedded broker did not start within {timeout:g} s")
        if self._error is not None:
            raise RuntimeError(f"embedded broker on {self.host}:{self.port}: {self._error}") from self._error
        return self.address

    async def _serve(self, stopping: asyncio.Event) -> None:
        try:
            from amqtt.broker import Broker  # noqa: PLC0415 - heavy, and only an embedded broker needs it

            broker = Broker(
                {
                    "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}"}},
                    "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
                }
            )
            await broker.start()
        except Exception as exc:  # noqa: BLE001 - start() raises it, naming the broker
            self._error = exc
            return
        finally:
            self._ready.set()
        try:
            await stopping.wait()
        finally:
            loop = asyncio.get_running_loop()
            # Its clients first, as any broker that stops drops them: amqtt's own shutdown can wait
            # up to 5 s for its broadcast loop before it closes a connection, and until then its
            # clients (a restart test's engine among them) would not know it is gone.
            await _close_leftover_streams(loop)
            with contextlib.suppress(Exception):
                await broker.shutdown()
            await _close_leftover_streams(loop)

    def stop(self, timeout: float = 5.0) -> None:
        self._thread.stop(timeout)
