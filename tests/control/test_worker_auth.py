"""Signed worker messages: with a secret, only births, heartbeats and deaths that verify are acted
on. Forged ones (the current epoch is public, in the retained birth) convict nobody and make no
record; a real worker with the secret is heard, and its signed Last Will still convicts it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import aiomqtt
from wd_broker import Mosquitto
from wd_control import EngineThread, WorkerProcess, slow_spec, workers
from wd_wait import until

from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Birth, Death, Heartbeat, encode
from warpdeck.engine.control.worker_auth import WorkerAuth, sign_worker, verified

SECRET = b"s3cret-for-the-tests-0123456789"
OTHER = b"another-secret-0123456789abcdef"


def _now_epoch() -> int:
    return time.time_ns() // 1000


# -- the rules --------------------------------------------------------------------------------------
def test_only_messages_signed_with_the_secret_verify() -> None:
    auth = WorkerAuth(SECRET)
    e = _now_epoch()
    assert auth.accept(Death(worker="w", epoch=e)) == "unsigned"
    assert auth.accept(sign_worker(OTHER, Death(worker="w", epoch=e))) == "bad_signature"
    signed = sign_worker(SECRET, Death(worker="w", epoch=e, reason="connection lost"))
    assert auth.accept(signed) is None
    tampered = signed.model_copy(update={"epoch": e + 1})  # the signature covers every field
    assert auth.accept(tampered) == "bad_signature"
    assert verified(SECRET, signed) and not verified(SECRET, tampered) and verified(None, tampered)
    assert auth.refused == {"unsigned": 1, "bad_signature": 2}


def test_a_heartbeat_replayed_or_out_of_its_window_is_refused() -> None:
    auth = WorkerAuth(SECRET)
    e, now = _now_epoch(), time.time()

    def hb(t: float, seq: int = 0) -> Heartbeat:
        return sign_worker(SECRET, Heartbeat(worker="w", epoch=e, seq=seq, progress=1, t=t))

    first, second = hb(now - 1.0, 0), hb(now, 1)
    assert auth.accept(first) is None and auth.accept(second) is None
    assert auth.accept(first) == "replayed"  # an older heartbeat of the same epoch
    assert auth.accept(second) == "replayed"
    assert auth.accept(hb(now - 120)) == "expired" and auth.accept(hb(now + 120)) == "expired"


def test_an_epoch_ahead_of_the_clock_is_refused_signed_or_not() -> None:
    for secret in (None, SECRET):
        auth = WorkerAuth(secret)
        far = sign_worker(secret, Death(worker="w", epoch=2**62))
        assert auth.accept(far) == "future_epoch"
        assert auth.accept(sign_worker(secret, Birth(worker="w", epoch=_now_epoch()))) is None


def test_without_a_secret_worker_messages_are_taken_on_trust() -> None:
    auth = WorkerAuth(None)
    assert auth.accept(Death(worker="w", epoch=_now_epoch())) is None


# -- over a real broker -----------------------------------------------------------------------------
async def _publish(mosquitto: Mosquitto, messages: list[tuple[str, bytes, bool]]) -> None:
    async with aiomqtt.Client(**mosquitto.address.client_kwargs(), identifier="wd-test-forger") as c:
        for topic, payload, retain in messages:
            await c.publish(topic, payload, qos=1, retain=retain)


async def test_forged_worker_messages_convict_nobody_and_make_no_record(mosquitto: Mosquitto,
                                                                       tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    spec = slow_spec(name="auth")
    topics = Topics("auth")
    with EngineThread(spec, mosquitto.address, secret=SECRET) as eng, \
            workers(WorkerProcess(mosquitto.url, "gpu7", "auth", extra_args=["--secret-file", str(secret_file)])) \
            as (real,):
        await until(lambda: eng.state_of("gpu7") == "online", 20, "the signed worker heard")
        forged = [(topics.worker("gpu7", "death"), encode(Death(worker="gpu7", epoch=real.epoch)), False),
                  (topics.worker("gpu7", "death"), encode(Death(worker="gpu7", epoch=2**62)), False)]
        for i in range(50):
            ghost = f"ghost{i}"
            forged.append((topics.worker(ghost, "birth"), encode(Birth(worker=ghost, epoch=_now_epoch())), True))
            forged.append((topics.worker(ghost, "hb"),
                           encode(Heartbeat(worker=ghost, epoch=_now_epoch(), seq=0, progress=0, t=time.time())),
                           False))
        await _publish(mosquitto, forged)
        assert eng.engine is not None and eng.engine.control is not None
        plane = eng.engine.control
        await until(lambda: plane.dropped.counts().get("unsigned", 0) >= 101, 20, "the forgeries counted")
        assert plane.dropped.counts().get("future_epoch", 0) == 1
        snap = eng.snapshot()
        assert snap is not None and snap.control is not None and snap.control.workers_signed
        assert not any(w.id.startswith("ghost") for w in snap.workers)
        assert eng.state_of("gpu7") == "online"
        assert eng.verdict("gpu7", "dead", 0.0) is None
        # The real thing still works: its signed Will convicts it when it dies.
        t_kill = time.monotonic()
        real.signal(signal.SIGKILL)
        await until(lambda: eng.verdict("gpu7", "dead", t_kill) is not None, 20, "the signed Will heard")


async def test_a_worker_without_the_secret_is_not_heard(mosquitto: Mosquitto) -> None:
    with EngineThread(slow_spec(name="auth2"), mosquitto.address, secret=SECRET) as eng, \
            workers(WorkerProcess(mosquitto.url, "unsigned1", "auth2")):
        assert eng.engine is not None and eng.engine.control is not None
        plane = eng.engine.control
        await until(lambda: plane.dropped.counts().get("unsigned", 0) >= 3, 20, "its messages refused")
        assert eng.worker("unsigned1") is None
