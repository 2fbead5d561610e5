"""Every private name of aiomqtt and paho-mqtt that warpdeck relies on, in one place.

The decisions this module protects:
- aiomqtt hides paho's client and its socket, and the control plane needs both: the batched reader
  (``socket_reads.py``) replaces paho's reads and acknowledges QoS 1 messages itself, a heartbeater
  killed on purpose closes its socket as SIGKILL would, and ``looping.connection`` retrieves the
  exception of a lost connection that aiomqtt would leave unretrieved. Those names are listed here
  (``USED``) and reached only through the functions below, so a version of either library that
  moves one fails one canary test (``tests/control/test_mqtt_internals.py``) naming it, not a run.
- The versions they were written against are pinned exactly in ``pyproject.toml`` and named here.
  Where a name is missing at run time the batched reader is not installed (aiomqtt's own reads are
  used) and the other two uses do nothing, so a newer library degrades speed, never correctness.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any, Final

__all__ = [
    "AIOMQTT_WRITTEN_FOR",
    "PAHO_WRITTEN_FOR",
    "USED",
    "disconnected",
    "missing",
    "paho_client",
    "paho_socket",
    "versions",
]

AIOMQTT_WRITTEN_FOR: Final = "2.5.1"
PAHO_WRITTEN_FOR: Final = "2.2.0"

USED: Final[tuple[tuple[str, tuple[str, ...], str], ...]] = (
    ("aiomqtt.Client", ("_client",), "every use below reaches paho through it"),
    ("aiomqtt.Client", ("_disconnected",), "looping.connection, socket_reads"),
    ("paho.Client", ("_sock", "socket", "_sock_recv", "_protocol", "_in_packet", "_last_bytes_received",
                     "_packet_queue", "loop_read", "loop_write", "on_message", "on_socket_register_write"),
     "socket_reads"),
)
"""(which object, the names used on it, who uses them). ``aiomqtt.Client`` names are looked up on an instance (several
are set in ``__init__``); the paho names on that instance's paho client."""


def missing(aclient: Any | None = None) -> list[str]:
    """The names in ``USED`` that ``aclient`` (an ``aiomqtt.Client``; when None, a fresh, unconnected
    one, which needs a running loop) or its paho client lack, as
    ``"paho.Client._sock_recv (socket_reads)"``."""
    if aclient is None:
        import aiomqtt  # noqa: PLC0415 - only the canary asks without a client

        aclient = aiomqtt.Client("127.0.0.1")
    paho = getattr(aclient, "_client", None)
    gone: list[str] = []
    for owner, names, who in USED:
        target = aclient if owner == "aiomqtt.Client" else paho
        gone += [f"{owner}.{name} ({who})" for name in names if target is None or not hasattr(target, name)]
    return gone


def versions() -> dict[str, tuple[str, str]]:
    """Installed against written-for version, by distribution."""
    return {"aiomqtt": (importlib.metadata.version("aiomqtt"), AIOMQTT_WRITTEN_FOR),
            "paho-mqtt": (importlib.metadata.version("paho-mqtt"), PAHO_WRITTEN_FOR)}


def paho_client(aclient: Any) -> Any | None:
    """The paho client under ``aclient``, or None where aiomqtt no longer keeps it there."""
    return getattr(aclient, "_client", None)


def paho_socket(aclient: Any) -> Any | None:
    """The socket of ``aclient``'s connection (None when it has none, or paho is out of reach)."""
    paho = paho_client(aclient)
    socket = getattr(paho, "socket", None)
    return socket() if callable(socket) else None


def disconnected(aclient: Any) -> asyncio.Future[Any] | None:
    """aiomqtt's future that ends with the connection (its exception says why), or None."""
    fut = getattr(aclient, "_disconnected", None)
    return fut if isinstance(fut, asyncio.Future) else None
