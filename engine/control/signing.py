"""Signed commands: HMAC-SHA256 over the timestamp, a nonce and the command's exact JSON text.

The decisions this module protects:
- The secret comes from a file or the environment (``WARPDECK_SECRET``), never from the command line
  (it would show in ``ps``) and never on the wire.
- A command is refused, with a reason that is counted, when it is unsigned, badly signed, outside
  the clock-skew window (``expired``; a timestamp that is not a finite number never is inside it), a
  replay of a nonce seen within that window, or not a command.
- Nonces are remembered by when they arrived (the monotonic clock), never by the timestamp the
  message carries: each for as long as its signature could still pass the window, and at most
  ``max_nonces`` of them. When that many commands arrived within the window, the next is refused
  (``flood``) rather than a remembered nonce forgotten early, which would let its command be replayed.
  Only holders of the secret can fill the cache: a nonce is remembered once its signature verified.
- Signatures are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import from_json

from warpdeck.engine.control.wire import SignedCommand, WireError, decode, encode
from warpdeck.engine.state.commands import COMMAND_ADAPTER, Command

__all__ = ["SECRET_ENV", "CommandRefused", "NonceCache", "Signer", "Verifier", "load_secret"]

SECRET_ENV = "WARPDECK_SECRET"
MIN_SECRET_BYTES = 16
"""Shortest secret accepted, in bytes: HMAC-SHA256 wants at least 128 bits of key."""
MAX_NONCES = 4096
"""Most commands accepted within one replay window (twice the clock-skew window): far more than operators send, and
about 1 MB of nonces."""


class CommandRefused(Exception):
    """A command that will not run; ``reason`` is one of unsigned, bad_signature, expired,
    replayed, invalid, flood (too many commands within the window), no_secret (this engine was
    started without a secret)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def load_secret(path: Path | str | None = None, *, env: dict[str, str] | None = None) -> bytes | None:
    """The shared command secret: the file's contents (whitespace trimmed) if ``path`` is given,
    else ``$WARPDECK_SECRET``, else None (commands over MQTT are then refused)."""
    if path is not None:
        p = Path(path)
        try:
            raw = p.read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"secret file {p}: {exc.strerror or exc}") from None
        where = f"secret file {p}"
    else:
        value = (os.environ if env is None else env).get(SECRET_ENV)
        if value is None:
            return None
        raw, where = value.strip().encode(), f"${SECRET_ENV}"
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"{where} holds {len(raw)} bytes; a command secret needs at least {MIN_SECRET_BYTES}")
    return raw


def _mac(secret: bytes, ts: float, nonce: str, body: str) -> str:
    return hmac.new(secret, f"{ts!r}\n{nonce}\n{body}".encode(), hashlib.sha256).hexdigest()


class Signer:
    """Signs commands for the wire (the control room's side)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def sign(self, cmd: Command, now: float | None = None) -> SignedCommand:
        ts = time.time() if now is None else now
        nonce = secrets.token_hex(16)
        body = COMMAND_ADAPTER.dump_json(cmd).decode()
        return SignedCommand(ts=ts, nonce=nonce, body=body, sig=_mac(self._secret, ts, nonce, body))

    def payload(self, cmd: Command, now: float | None = None) -> bytes:
        return encode(self.sign(cmd, now))


class NonceCache:
    """Nonces already used, each kept for ``keep_s`` after it arrived, at most ``limit`` at once.

    Arrival times come from ``clock`` (monotonic), so they only grow: the oldest nonce is always at the
    head, and pruning never stops at a message that named a time of its own choosing."""

    def __init__(self, keep_s: float, limit: int = MAX_NONCES, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s = keep_s
        self.limit = limit
        self._clock = clock
        self._seen: set[str] = set()
        self._order: deque[tuple[float, str]] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen

    @property
    def full(self) -> bool:
        """True when ``limit`` nonces arrived within ``keep_s``; ``prune`` first."""
        return len(self._order) >= self.limit

    def prune(self) -> None:
        """Forget the nonces that arrived more than ``keep_s`` ago."""
        order, oldest = self._order, self._clock() - self.keep_s
        while order and order[0][0] < oldest:
            self._seen.discard(order.popleft()[1])

    def add(self, nonce: str) -> None:
        """Remember ``nonce`` from now on (the caller checks ``full`` first)."""
        self._seen.add(nonce)
        self._order.append((self._clock(), nonce))


class Verifier:
    """Checks signed commands (the engine's side). Not thread-safe: one consumer.

    ``clock`` times arrivals for the replay cache (monotonic); ``now`` in ``verify`` is the wall clock
    that a command's timestamp is compared with."""

    def __init__(self, secret: bytes | None, max_skew_s: float = 30.0, *, max_nonces: int = MAX_NONCES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._secret = secret
        self.max_skew_s = max_skew_s
        # A command signed at ts passes the window until ts + skew, and arrives no earlier than
        # ts - skew: its nonce must outlive its arrival by twice the window.
        self.nonces = NonceCache(2 * max_skew_s, max_nonces, clock)

    def verify(self, payload: bytes | SignedCommand, now: float | None = None) -> Command:
        """The command, or ``CommandRefused`` with the reason."""
        t = time.time() if now is None else now
        nonces = self.nonces
        nonces.prune()
        if isinstance(payload, SignedCommand):
            msg = payload
        else:
            try:
                decoded = decode(payload, frozenset(("cmd",)))
            except WireError as exc:
                # A bare command without signature fields is "unsigned"; anything else is invalid. An
                # oversized one is not parsed again (a 100 MB payload took 0.5 s and 330 MB to read).
                unsigned = exc.reason != "oversized" and _looks_unsigned(payload)
                raise CommandRefused("unsigned" if unsigned else "invalid", exc.detail) from None
            assert isinstance(decoded, SignedCommand)
            msg = decoded
        if self._secret is None:
            raise CommandRefused("no_secret", "this engine has no command secret, so it accepts no remote commands")
        if not hmac.compare_digest(_mac(self._secret, msg.ts, msg.nonce, msg.body), msg.sig):
            raise CommandRefused("bad_signature", "the signature does not match")
        # Written so that a NaN (which compares false with everything) is refused, not let through.
        if not abs(t - msg.ts) <= self.max_skew_s:
            raise CommandRefused("expired", f"signed {t - msg.ts:+.1f} s from now (window ±{self.max_skew_s:g} s)")
        if msg.nonce in nonces:
            raise CommandRefused("replayed", f"nonce {msg.nonce[:8]}… already used")
        try:
            cmd = COMMAND_ADAPTER.validate_json(msg.body)
        except ValidationError as exc:
            raise CommandRefused("invalid", f"not a command: {exc.errors()[0]['msg']}") from None
        if nonces.full:
            raise CommandRefused("flood", f"{nonces.limit} commands accepted in the last {nonces.keep_s:g} s; "
                                          "this one is refused so that none of them can be replayed")
        nonces.add(msg.nonce)
        return cmd


def _looks_unsigned(payload: bytes) -> bool:
    try:
        obj = from_json(payload)  # pydantic's parser, as wire.decode's: cheap on a flood's junk
    except ValueError:
        return False
    return isinstance(obj, dict) and "sig" not in obj
