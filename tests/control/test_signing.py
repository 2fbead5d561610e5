"""Signed commands: the secret's sources, and each way a command is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warpdeck.engine.commands import Cancel, Pause, Quarantine
from warpdeck.engine.control.signing import CommandRefused, Signer, Verifier, load_secret

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
    from warpdeck.engine.control.signing import _mac

    body = '{"kind":"format_disk"}'
    good.update(body=body, sig=_mac(SECRET, good["ts"], good["nonce"], body))
    with pytest.raises(CommandRefused, match="invalid"):
        Verifier(SECRET).verify(json.dumps(good).encode(), now=1000.0)


def test_no_secret_refuses_everything() -> None:
    with pytest.raises(CommandRefused, match="no_secret"):
        Verifier(None).verify(Signer(SECRET).payload(Quarantine(worker="w1")))


def test_nonces_are_forgotten_only_once_they_expire() -> None:
    v = Verifier(SECRET, max_skew_s=30)
    for i in range(1000):
        v.verify(Signer(SECRET).sign(Pause(), now=1000.0 + i), now=1000.0 + i)
    assert len(v._seen) <= 31


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
