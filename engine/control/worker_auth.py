"""Signed worker messages: births, heartbeats and deaths carry an HMAC when a secret is set.

The decisions this module protects:
- With a secret, the monitor acts only on worker messages that verify. A forged death (the
  current epoch is public, in the retained birth) convicts nobody; a forged birth or heartbeat
  for an id nobody started makes no record. Without a secret worker messages are taken on trust,
  and the engine says so once at start (``UNAUTHENTICATED``).
- The signature covers the message's whole JSON (without ``sig``), under a domain tag of its own,
  so a command's signature can never pass as a worker's or the reverse.
- A heartbeat carries its sender's clock (``t``): one older than the last accepted one of the same
  worker and epoch is a replay, and one outside the skew window is refused, so a leaked heartbeat
  is never valid for long. A birth or a death names its epoch, which fences it: a replayed Last
  Will can only confirm the death of the connection it was signed for.
- An epoch further ahead of the monitor's clock than the skew allows is refused (``future_epoch``):
  such an epoch, once accepted, would fence every real re-birth of that worker.
- Refusals are counted by reason; they never raise.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import TypeVar

from warpdeck.engine.control.wire import Birth, Death, Heartbeat

__all__ = ["EPOCH_SKEW_US", "UNAUTHENTICATED", "WorkerAuth", "sign_worker", "verified"]

_DOMAIN = b"warpdeck-worker-v1\n"
SKEW_S = 30.0
"""How far a heartbeat's clock may be from the monitor's (seconds), and an epoch ahead of it (us)."""
EPOCH_SKEW_US = int(SKEW_S * 1_000_000)
UNAUTHENTICATED = ("worker messages are unauthenticated (no secret): anyone who can publish to the broker can "
                   "forge a worker's birth, heartbeat or death, and so convict a live worker or hide a dead one; "
                   "set a secret (--secret-file or $WARPDECK_SECRET) and the broker's ACLs (deploy/mosquitto/)")
"""Said once at start when no secret is set."""

M = TypeVar("M", Birth, Heartbeat, Death)


def _mac(secret: bytes, msg: Birth | Heartbeat | Death) -> str:
    body = msg.model_dump_json(exclude={"sig"}).encode()
    return hmac.new(secret, _DOMAIN + body, hashlib.sha256).hexdigest()


def sign_worker(secret: bytes | None, msg: M) -> M:
    """``msg`` signed with ``secret`` (as it is, without one)."""
    if secret is None:
        return msg
    return msg.model_copy(update={"sig": _mac(secret, msg)})


def verified(secret: bytes | None, msg: Birth | Heartbeat | Death) -> bool:
    """Whether ``msg`` carries a good signature (any message does, without a secret)."""
    return secret is None or (bool(msg.sig) and hmac.compare_digest(msg.sig, _mac(secret, msg)))


class WorkerAuth:
    """The monitor's side: which worker messages to act on."""

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self._wall = time.time
        self._last: dict[str, tuple[int, float]] = {}
        """Per worker, the epoch and sender time of the last heartbeat accepted."""
        self.refused: dict[str, int] = {}
        """Refusals by reason: unsigned, bad_signature, replayed, expired, future_epoch."""

    def accept(self, msg: Birth | Heartbeat | Death) -> str | None:
        """None to act on ``msg``; else the reason it is refused (counted)."""
        reason = self._check(msg)
        if reason is not None:
            self.refused[reason] = self.refused.get(reason, 0) + 1
        return reason

    def forget(self, worker: str) -> None:
        """The worker's record is gone: so is what its heartbeats said."""
        self._last.pop(worker, None)

    def _check(self, msg: Birth | Heartbeat | Death) -> str | None:
        now = self._wall()
        if not msg.epoch <= now * 1_000_000 + EPOCH_SKEW_US:
            return "future_epoch"
        if self.secret is None:
            return None
        if not msg.sig:
            return "unsigned"
        if not verified(self.secret, msg):
            return "bad_signature"
        if isinstance(msg, Heartbeat):
            if not abs(now - msg.t) <= SKEW_S:  # written so that a NaN fails it too
                return "expired"
            last = self._last.get(msg.worker)
            if last is not None and last[0] == msg.epoch and msg.t <= last[1]:
                return "replayed"
            if last is None or msg.epoch >= last[0]:
                self._last[msg.worker] = (msg.epoch, msg.t)
        return None
