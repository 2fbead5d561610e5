"""Signed commands: the secret's sources, each way a command is refused, and the replay cache: pruned
by arrival time, bounded, and never stopped by a timestamp that is not a number."""

from __future__ import annotations

import contextlib
import json
import math
import secrets
from collections import Counter
from pathlib import Path

import pytest

from warpdeck.engine.control.signing import CommandRefused, Signer, Verifier, _mac, load_secret
from warpdeck.engine.control.wire import SignedCommand
from warpdeck.engine.state.commands import Cancel, Pause, Quarantine

SECRET = b"0123456789abcdef0123"


def test_a_signed_command_verifies_once() -> None:
    v = Verifier(SECRET)
    signed = Signer(SECRET).sign(Cancel(keys=("a", "b")), now=1000.0)
    assert v.verify(signed, now=1001.0) == Cancel(keys=("a", "b"))
    with pytest.raises(CommandRefused) as info:
        v.verify(signed, now=1002.0)
    assert info.value.reason == "replayed"


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda d: d.update(sig="f" * 64), "bad_signature"),
    (lambda d: d.update(body='{"kind":"cancel","all":true}'), "bad_signature"),
    (lambda d: d.update(ts=d["ts"] + 1), "bad_signature"),
    (lambda d: d.update(nonce="0" * 32), "bad_signature"),
    (lambda d: d.pop("sig"), "unsigned"),
    (lambda d: d.update(kind="pause"), "invalid"),
])
def test_tampered_or_unsigned_commands_are_refused(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    d = json.loads(Signer(SECRET).payload(Pause(), now=1000.0))
    mutate(d)
    with pytest.raises(CommandRefused) as info:
        Verifier(SECRET).verify(json.dumps(d).encode(), now=1000.0)
    assert info.value.reason == reason


def test_expired_in_either_direction() -> None:
    v = Verifier(SECRET, max_skew_s=30)
    for ts in (900.0, 1100.0):
        with pytest.raises(CommandRefused, match="expired"):
            v.verify(Signer(SECRET).sign(Pause(), now=ts), now=1000.0)


def test_a_signed_body_that_is_not_a_command_is_invalid() -> None:
    signer = Signer(SECRET)
    good = json.loads(signer.payload(Pause(), now=1000.0))
    body = '{"kind":"format_disk"}'
    good.update(body=body, sig=_mac(SECRET, good["ts"], good["nonce"], body))
    with pytest.raises(CommandRefused, match="invalid"):
        Verifier(SECRET).verify(json.dumps(good).encode(), now=1000.0)


def test_no_secret_refuses_everything() -> None:
    with pytest.raises(CommandRefused, match="no_secret"):
        Verifier(None).verify(Signer(SECRET).payload(Quarantine(worker="w1")))


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _signed_at(ts: float, nonce: str | None = None) -> bytes:
    """A correctly signed pause stamped ``ts``, written as Python writes JSON (NaN, Infinity)."""
    nonce = nonce or secrets.token_hex(16)
    body = '{"kind":"pause"}'
    return json.dumps({"v": 1, "kind": "cmd", "ts": ts, "nonce": nonce, "body": body,
                       "sig": _mac(SECRET, ts, nonce, body)}).encode()


def test_nonces_are_forgotten_only_once_they_expire() -> None:
    clock = Clock()
    v = Verifier(SECRET, max_skew_s=30, clock=clock)
    for i in range(1000):
        clock.t = float(i)
        v.verify(Signer(SECRET).sign(Pause(), now=1000.0 + i), now=1000.0 + i)
        assert len(v.nonces) <= 61  # a nonce lives for twice the window after it arrived


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_signed_command_stamped_with_a_non_finite_time_is_refused(ts: float) -> None:
    with pytest.raises(CommandRefused) as info:
        Verifier(SECRET).verify(_signed_at(ts), now=1000.0)
    assert info.value.reason == "invalid"  # the wire model refuses it before the signature is checked


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_non_finite_time_that_got_past_the_model_is_still_expired(ts: float) -> None:
    nonce, body = secrets.token_hex(16), '{"kind":"pause"}'
    msg = SignedCommand.model_construct(ts=ts, nonce=nonce, body=body, sig=_mac(SECRET, ts, nonce, body))
    with pytest.raises(CommandRefused) as info:
        Verifier(SECRET).verify(msg, now=1000.0)
    assert info.value.reason == "expired"


def test_the_replay_cache_still_prunes_after_a_nan_stamped_attempt() -> None:
    clock = Clock()
    v = Verifier(SECRET, max_skew_s=30, clock=clock)
    for attempt in (_signed_at(math.nan), _signed_at(math.inf)):
        with pytest.raises(CommandRefused):
            v.verify(attempt, now=1000.0)
    for i in range(200):
        clock.t = float(i)
        v.verify(_signed_at(1000.0 + i), now=1000.0 + i)
    assert len(v.nonces) <= 61


def test_a_replay_is_refused_for_as_long_as_its_signature_could_pass() -> None:
    clock = Clock()
    v = Verifier(SECRET, max_skew_s=30, clock=clock)
    ahead = _signed_at(1029.0)  # stamped 29 s ahead of the engine's clock: valid until 1059
    v.verify(ahead, now=1000.0)
    clock.t = 59.0  # 59 s after it arrived, still inside its window
    with pytest.raises(CommandRefused) as info:
        v.verify(ahead, now=1059.0)
    assert info.value.reason == "replayed"
    clock.t = 61.0  # past it: the nonce may go, since the signature has expired
    with pytest.raises(CommandRefused, match="expired"):
        v.verify(ahead, now=1061.0)
    assert len(v.nonces) == 0


def test_the_replay_cache_never_exceeds_its_bound_under_a_flood() -> None:
    clock = Clock()
    v = Verifier(SECRET, max_skew_s=30, max_nonces=100, clock=clock)
    refused: Counter[str] = Counter()
    for _ in range(250):
        try:
            v.verify(_signed_at(1000.0), now=1000.0)
        except CommandRefused as exc:
            refused[exc.reason] += 1
        assert len(v.nonces) <= 100
    assert refused == {"flood": 150}
    clock.t = 61.0  # the window has passed: the cache empties and commands are accepted again
    assert v.verify(_signed_at(1061.0), now=1061.0) == Pause()
    assert len(v.nonces) == 1


def test_a_flood_never_forgets_a_nonce_early() -> None:
    clock = Clock()
    v = Verifier(SECRET, max_skew_s=30, max_nonces=3, clock=clock)
    first = _signed_at(1000.0)
    v.verify(first, now=1000.0)
    for _ in range(10):
        with contextlib.suppress(CommandRefused):
            v.verify(_signed_at(1000.0), now=1000.0)
    with pytest.raises(CommandRefused, match="replayed"):
        v.verify(first, now=1000.0)


def test_the_secret_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"  " + SECRET + b"\n")
    assert load_secret(f) == SECRET
    assert load_secret(env={"WARPDECK_SECRET": SECRET.decode()}) == SECRET
    assert load_secret(env={}) is None
    f.write_bytes(b"short")
    with pytest.raises(ValueError, match="at least 16"):
        load_secret(f)
    with pytest.raises(ValueError, match="secret file"):
        load_secret(tmp_path / "missing")
