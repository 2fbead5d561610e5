"""Reaching a Ray cluster, and the cluster reaching the control plane: the rules, without Ray.

The decisions this module protects:
- Joining a cluster has a deadline (``[executor] connect_timeout_s``). Ray's own ``ray.init``
  retries an unreachable GCS for minutes, printing C++ warnings, so the address is first probed
  over TCP until the deadline (a refused port is tried again: a head node may be starting); only a
  port that answers is given to Ray, whose ``ray.init`` is then waited for until the same deadline
  (engine/scaleout/raylink.py). Whatever fails says, in one line, the address and what was tried
  (the GCS at ``host:port``, found for ``auto``, or a Ray client server for ``ray://``).
- Actors heartbeat over MQTT. A broker on this machine's loopback (the embedded one, the default)
  cannot be reached from another node, so a cluster that spans other hosts is refused before any
  actor starts, with the fix spelled out: by the address (a host that is not this machine) before
  joining, and by the nodes Ray lists (alive on another IP) after.
- Ray's own lines (its loggers, the actors' stdout and stderr, the driver's C++ warnings while it
  joins) are appended to ``<run dir>/ray.log``, never the terminal; the command says where they
  are when the run added any (``RayLog.grew``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warpdeck.engine.control.plane import ControlSettings

__all__ = ["LOG_NAME", "PLANE_FIX", "NodeInfo", "RayLog", "Target", "actors_fit", "is_local_host", "loopback_broker",
           "parse_target", "per_actor", "plane_refusal", "probe", "remote_nodes"]

_MAX_PORT = 65535
"""The highest TCP port."""
_NAMED = 4
"""Hosts named in a refusal, at most."""

LOG_NAME = "ray.log"
"""Ray's lines, in the run directory."""

PLANE_FIX = ("give --broker a broker every node reaches, with TLS and credentials, e.g. "
             "--broker mqtts://user:pass@head:8883 --ca-file ca.pem")
"""What to do when the actors could not reach the control plane."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where ``[executor] address`` points: ``how`` says what is tried there."""

    address: str
    how: str
    """``GCS`` (``host:port``, or what ``auto`` found) or ``Ray client server`` (``ray://``)."""
    host: str
    port: int

    def describe(self) -> str:
        return f"{self.how} at {self.host}:{self.port}"


def parse_target(address: str, found: str | None = None) -> Target:
    """The host and port to probe for ``address`` (``found``: what Ray resolved ``auto`` to).
    ``ValueError`` names a malformed address."""
    client = address.startswith("ray://")
    text = address.removeprefix("ray://") if client else (found or address)
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= _MAX_PORT:
        raise ValueError(f"[executor] address {address!r}: expected auto, host:port or ray://host:port")
    return Target(address, "Ray client server" if client else "GCS", host, int(port))


def probe(target: Target, timeout_s: float) -> None:
    """Return once ``target`` accepts a TCP connection; ``TimeoutError`` after ``timeout_s``,
    saying what was tried and the last answer."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"cannot join the Ray cluster at {target.address}: tried its {target.describe()} "
                               f"for {timeout_s:g} s ([executor] connect_timeout_s): {last.lower()}; is Ray running "
                               "there (ray start --head) and the port open?")
        try:
            with socket.create_connection((target.host, target.port), timeout=min(left, 2.0)):
                return
        except OSError as exc:  # refused (not yet listening), unreachable, unknown host: try again until the deadline
            last = exc.strerror or type(exc).__name__
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local_host(host: str, local_ips: Iterable[str]) -> bool:
    """Whether ``host`` is this machine: loopback, one of ``local_ips``, or a name that resolves
    to one of them."""
    mine = set(local_ips)
    if _loopback(host) or host in mine:
        return True
    with contextlib.suppress(OSError, UnicodeError):
        return all(_loopback(ip) or ip in mine for ip in {str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    return False


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of the cluster, as Ray lists it."""

    ip: str
    alive: bool
    cpus: float
    gpus: float
    resources: dict[str, float] = field(default_factory=dict)
    """Its other resources (custom ones, memory...), as Ray counts them."""
    node_id: str = ""


def loopback_broker(control: ControlSettings | None) -> str | None:
    """How to name the control plane's broker when it is on this machine's loopback (the embedded
    one, or a URL naming loopback), else None (none at all, or one other nodes may reach)."""
    if control is None:
        return None
    if control.broker is None:
        return "the embedded broker (--broker embedded, the default)"
    if _loopback(control.broker.host):
        return f"the broker at {control.broker.host}:{control.broker.port}"
    return None


def per_actor(cpus: float, gpus: float, resources: dict[str, float]) -> dict[str, float]:
    """What one actor reserves, by Ray's resource names (zero amounts left out)."""
    ask = {"CPU": cpus, "GPU": gpus, **resources}
    return {k: v for k, v in ask.items() if v > 0}


def actors_fit(nodes: Iterable[NodeInfo], ask: dict[str, float]) -> int | None:
    """How many actors each reserving ``ask`` the alive nodes hold together (an actor lives on one
    node); None when it asks for nothing (no bound)."""
    if not ask:
        return None
    held = 0
    for n in nodes:
        if n.alive:
            has = {"CPU": n.cpus, "GPU": n.gpus, **n.resources}
            held += min(int(has.get(k, 0.0) / v + 1e-9) for k, v in ask.items())
    return held


def remote_nodes(nodes: Iterable[NodeInfo], local_ips: Iterable[str]) -> list[str]:
    """The IPs of alive nodes that are not this machine."""
    mine = set(local_ips)
    return sorted({n.ip for n in nodes if n.alive and not (_loopback(n.ip) or n.ip in mine)})


def plane_refusal(address: str | None, broker: str, local_ips: Iterable[str],
                  nodes: Iterable[NodeInfo] | None = None) -> str | None:
    """Why actors on this cluster could not reach a control plane on this machine's loopback
    (``broker``: how it is named, e.g. ``the embedded broker``), or None. Before joining
    (``nodes`` None) the address alone decides; after, the alive nodes."""
    mine = list(local_ips)
    if nodes is None:
        if address is None or address == "auto":
            return None
        host = parse_target(address).host
        if is_local_host(host, mine):
            return None
        where = f"[executor] address {address!r} names another host ({host})"
    else:
        others = remote_nodes(nodes, mine)
        if not others:
            return None
        more = "…" if len(others) > _NAMED else ""
        where = f"the Ray cluster has nodes on other hosts ({', '.join(others[:_NAMED])}{more})"
    return (f"{where}, but the control plane is {broker} on this machine's loopback: actors there could never "
            f"heartbeat, so nothing was started; {PLANE_FIX}")


_ROUTINE = ("Token authentication is enabled", "(autoscaler")
"""What a local Ray writes on every run, which nobody needs pointing to."""


class RayLog:
    """Appends Ray's lines to ``path`` (opened at the first; thread safe). ``grew(path, size)``
    tells the command whether a run added any."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        text = text if text.endswith("\n") else text + "\n"
        with self._lock, contextlib.suppress(OSError):  # Ray's chatter never fails a run
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(text)
            self.lines += text.count("\n")

    @staticmethod
    def size(run_dir: Path) -> int:
        """The log's size now (0: none), to compare after a run."""
        try:
            return (run_dir / LOG_NAME).stat().st_size
        except OSError:
            return 0

    @staticmethod
    def grew(run_dir: Path, before: int) -> Path | None:
        """The log, when a run added to it since its size was ``before`` something other than what
        every local Ray says (its token-authentication notice, the autoscaler's status)."""
        path = run_dir / LOG_NAME
        if RayLog.size(run_dir) <= before:
            return None
        try:
            with path.open("rb") as f:
                f.seek(before)
                added = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return None
        said = [line for line in added if line.strip() and not any(b in line for b in _ROUTINE)]
        return path if said else None
