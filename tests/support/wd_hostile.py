"""A seeded hostile flood: the messages a client without the secret can send to an engine, each with
the outcome the engine must give it (a command refused, or a worker message dropped, for a reason).

Beyond junk (malformed, unknown or wrong kinds, other schema versions, out-of-range fields, oversized
and deeply nested payloads, unsigned and badly signed commands) the attacker uses what the broker
tells anyone (``Known``): the live worker's epoch from its retained birth (forged deaths, births and
heartbeats at that epoch), one of its signed heartbeats and one signed operator command seen on the
wire (replayed verbatim, tampered with, or stamped NaN), and adds far-future epochs, NaN and
infinities written as raw JSON text, ghost workers and ids with odd characters.

``make_flood`` gives the same flood for the same seed. Used by tests/control/test_hostile_flood.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Birth, Death, Heartbeat, SignedCommand, decode, encode
from warpdeck.engine.control.worker_auth import sign_worker
from warpdeck.engine.state.commands import COMMAND_ADAPTER, Cancel, Command, Drain, Pause, Quarantine

SECRET = b"hostile-flood-secret-0123456789"
"""The engine's secret (what the operator signs with), and one an attacker guessed."""
OTHER = b"a guessed secret, long enough 42"


Outcome = tuple[Literal["refused", "dropped"], str]


@dataclass(frozen=True, slots=True)
class Known:
    """What an attacker without the secret learns from the broker before it floods."""

    topics: Topics
    worker: str
    """The live worker's id and epoch, from its retained birth."""
    epoch: int
    heartbeat: bytes
    """One of the live worker's signed heartbeats and one signed operator command, as they went by."""
    command: bytes
    now: float


@dataclass(frozen=True, slots=True)
class Hostile:
    """One message of the flood, and what the engine must make of it: a command refused, or a worker
    message dropped, for this reason."""

    kind: str
    topic: str
    payload: bytes
    qos: int
    outcome: Outcome
    retain: bool = False


def _hex(rng: random.Random, n: int) -> str:
    return rng.randbytes(n // 2).hex()


def _raw(obj: dict[str, object], **raw: str) -> bytes:
    """``obj`` as JSON with each of ``raw``'s fields written as raw text (``NaN``, ``1e999``)."""
    text = json.dumps({**obj, **{k: f"@{k}@" for k in raw}})
    for k, v in raw.items():
        text = text.replace(f'"@{k}@"', v)
    return text.encode()


def signed(secret: bytes, cmd: Command, ts: float, rng: random.Random) -> bytes:
    """``cmd`` signed as docs/control-plane.md says, with a seeded nonce."""
    body, nonce = COMMAND_ADAPTER.dump_json(cmd).decode(), _hex(rng, 32)
    sig = hmac.new(secret, f"{ts!r}\n{nonce}\n{body}".encode(), hashlib.sha256).hexdigest()
    return encode(SignedCommand(ts=ts, nonce=nonce, body=body, sig=sig))


NONFINITE = ("NaN", "Infinity", "-Infinity", "1e999")
ODD_TOPIC_IDS = ("ghost 1", "gh\u00f6st", "gh\u200bost", "-lead", ".dot", "_under", "x" * 129, "\U0001f608",
                 "a$b", "a%2Fb", "a'b", 'a"b', "a\\b", "ghost;1", "ghost\u00a0")
"""Topic levels no id may be (Mosquitto itself refuses control characters in a topic)."""
ODD_BODY_IDS = (*ODD_TOPIC_IDS, "", "a/b", "+", "#", "ghost\n", "../../x", "ghost\x00")


# Commands, each refused for its reason (the payload).
def _evil(rng: random.Random, k: Known) -> Command:
    evil: list[Command] = [Pause(), Drain(), Cancel(all=True), Quarantine(worker=k.worker)]
    return rng.choice(evil)


def _fields(rng: random.Random, k: Known, **over: object) -> dict[str, object]:
    body = COMMAND_ADAPTER.dump_json(_evil(rng, k)).decode()
    return {"kind": "cmd", "v": 1, "ts": k.now, "nonce": _hex(rng, 32), "body": body, "sig": _hex(rng, 64), **over}


def _captured(k: Known, **over: object) -> dict[str, object]:
    return {**json.loads(k.command), **over}


def _tampered(rng: random.Random, k: Known) -> bytes:
    ts = json.loads(k.command)["ts"]
    return json.dumps(rng.choice([_captured(k, body=COMMAND_ADAPTER.dump_json(Cancel(all=True)).decode()),
                                  _captured(k, ts=ts + 1)])).encode()


CommandMaker = Callable[[random.Random, Known], bytes]
COMMANDS: dict[str, tuple[str, CommandMaker]] = {
    "cmd_unsigned": ("unsigned", lambda rng, k: COMMAND_ADAPTER.dump_json(_evil(rng, k))),
    "cmd_made_up_sig": ("bad_signature", lambda rng, k: json.dumps(_fields(rng, k)).encode()),
    "cmd_other_secret": ("bad_signature", lambda rng, k: signed(OTHER, _evil(rng, k), k.now, rng)),
    "cmd_tampered": ("bad_signature", _tampered),
    "cmd_replayed": ("replayed", lambda rng, k: k.command),
    # An old capture, or one from a clock far off: signed with the secret, so refused only for its time.
    "cmd_expired": ("expired", lambda rng, k: signed(SECRET, Pause(), k.now + rng.choice([-1, 1]) * rng.uniform(
        31, 86_400), rng)),
    "cmd_nonfinite_ts": ("invalid", lambda rng, k: _raw(rng.choice([_fields(rng, k), _captured(k)]),
                                                        ts=rng.choice(NONFINITE))),
    "cmd_garbage": ("invalid", lambda rng, k: b"\xff" + rng.randbytes(rng.randrange(200))),
    "cmd_not_object": ("invalid", lambda rng, k: rng.choice([b"[1, 2]", b'"pause"', b"null", b"42", b""])),
    "cmd_wrong_kind": ("invalid", lambda rng, k: encode(Heartbeat(worker=k.worker, epoch=k.epoch, seq=0, progress=0,
                                                                  sig=_hex(rng, 64)))),
    "cmd_version": ("invalid", lambda rng, k: json.dumps(_fields(rng, k, v=2)).encode()),
    "cmd_out_of_range": ("invalid", lambda rng, k: json.dumps(_fields(rng, k, **rng.choice([
        {"nonce": "short"}, {"nonce": "../../etc/passwd-0123"}, {"nonce": "a" * 65}, {"sig": "F" * 64},
        {"ts": "now"}, {"body": 7}]))).encode()),
    "cmd_oversized": ("invalid", lambda rng, k: json.dumps(_fields(rng, k, body="A" * 20_000)).encode()),
    "cmd_deep": ("invalid", lambda rng, k: rng.choice([b"[" * 3000 + b"]" * 3000,
                                                       b'{"a":' * 3000 + b"1" + b"}" * 3000])),
}


# Worker messages, each dropped for its reason (the id on the topic, which topic, the payload).
def _ghost(rng: random.Random) -> str:
    return f"ghost-{rng.randrange(500)}"


def _which(rng: random.Random) -> str:
    return rng.choice(["birth", "hb", "death"])


def _forged(which: str, wid: str, epoch: int, rng: random.Random, now: float) -> Birth | Heartbeat | Death:
    if which == "birth":
        return Birth(worker=wid, epoch=epoch, host="gpu-node-9", pid=rng.randrange(1, 99_999), lanes=1)
    if which == "hb":
        return Heartbeat(worker=wid, epoch=epoch, seq=rng.randrange(256), progress=rng.randrange(10**6), t=now)
    return Death(worker=wid, epoch=epoch, graceful=rng.random() < 0.5, reason="forged")


def _at_live(rng: random.Random, k: Known, which: str, secret: bytes | None = None, **over: object) -> bytes:
    return encode(sign_worker(secret, _forged(which, k.worker, k.epoch, rng, k.now).model_copy(update=over)))


def _live_hb(k: Known) -> Heartbeat:
    hb = decode(k.heartbeat)
    assert isinstance(hb, Heartbeat)
    return hb


def _ghostly(rng: random.Random, k: Known, secret: bytes | None = None) -> tuple[str, str, bytes]:
    wid, which = _ghost(rng), _which(rng)
    return wid, which, encode(sign_worker(secret, _forged(which, wid, int(k.now * 1e6), rng, k.now)))


def _future(rng: random.Random, k: Known) -> tuple[str, str, bytes]:
    wid, which = rng.choice([k.worker, _ghost(rng)]), _which(rng)
    epoch = rng.choice([2**62, 10**30, k.epoch + 10**12])  # 10**12 us: eleven days ahead
    return wid, which, encode(sign_worker(rng.choice([None, OTHER]), _forged(which, wid, epoch, rng, k.now)))


def _nonfinite(rng: random.Random, k: Known) -> tuple[str, str, bytes]:
    wid = rng.choice([k.worker, _ghost(rng)])
    hb = _forged("hb", wid, k.epoch, rng, k.now).model_dump(mode="json")
    birth = _forged("birth", wid, k.epoch, rng, k.now).model_dump(mode="json")
    device = {"util_pct": "@u@", "mem_used_mb": 1.0, "mem_total_mb": 2.0}
    which, payload = rng.choice([
        ("hb", _raw(hb, t=rng.choice(NONFINITE))),
        ("birth", _raw(birth, interval_s=rng.choice(NONFINITE))),
        ("hb", _raw({**hb, "device": device}).replace(b'"@u@"', rng.choice(NONFINITE).encode()))])
    return wid, which, payload


def _other_version(rng: random.Random, k: Known) -> tuple[str, str, bytes]:
    which = _which(rng)
    return _ghost(rng), which, json.dumps({"kind": which, "v": 2, "worker": "ghost-0", "epoch": 1}).encode()


WorkerMaker = Callable[[random.Random, Known], tuple[str, str, bytes]]
WORKERS: dict[str, tuple[str, WorkerMaker]] = {
    "death_at_live_epoch": ("unsigned", lambda rng, k: (k.worker, "death", _at_live(rng, k, "death"))),
    "death_other_secret": ("bad_signature", lambda rng, k: (k.worker, "death", _at_live(rng, k, "death", OTHER))),
    "death_stolen_sig": ("bad_signature", lambda rng, k: (k.worker, "death", _at_live(rng, k, "death",
                                                                                     sig=_live_hb(k).sig))),
    "birth_newer_epoch": ("unsigned", lambda rng, k: (k.worker, "birth", _at_live(
        rng, k, "birth", epoch=k.epoch + rng.randrange(1, 10**6)))),
    "hb_at_live_epoch": ("unsigned", lambda rng, k: (k.worker, "hb", _at_live(rng, k, "hb"))),
    "hb_tampered": ("bad_signature", lambda rng, k: (k.worker, "hb", encode(_live_hb(k).model_copy(
        update={"progress": _live_hb(k).progress + rng.randrange(1, 1000)})))),
    "hb_replayed": ("replayed", lambda rng, k: (k.worker, "hb", k.heartbeat)),
    "ghost": ("unsigned", _ghostly),
    "ghost_other_secret": ("bad_signature", lambda rng, k: _ghostly(rng, k, OTHER)),
    "future_epoch": ("future_epoch", _future),
    "nonfinite": ("invalid", _nonfinite),
    "odd_topic_id": ("wrong_topic", lambda rng, k: (rng.choice(ODD_TOPIC_IDS), "death", _at_live(rng, k, "death"))),
    "odd_body_id": ("invalid", lambda rng, k: (_ghost(rng), "death", json.dumps(
        {"kind": "death", "v": 1, "worker": rng.choice(ODD_BODY_IDS), "epoch": k.epoch}).encode())),
    # The live worker's death on another's topic: past an ACL that guards only the live worker's own.
    "live_body_on_ghost_topic": ("wrong_topic", lambda rng, k: (_ghost(rng), "death", _at_live(rng, k, "death"))),
    "malformed": ("malformed", lambda rng, k: (_ghost(rng), _which(rng), rng.choice(
        [b'{"kind": "hb", "worker": ', b"\xff\xfe", b"[1, 2]", b"null"]))),
    "unknown_kind": ("unknown_kind", lambda rng, k: (_ghost(rng), _which(rng), json.dumps(
        {"kind": rng.choice(["nope", "HB", 7, None]), "v": 1}).encode())),
    "wrong_kind": ("wrong_kind", lambda rng, k: (_ghost(rng), rng.choice(["birth", "death"]), _at_live(rng, k, "hb"))),
    "version": ("version", _other_version),
    "out_of_range": ("invalid", lambda rng, k: (_ghost(rng), "hb", json.dumps(
        {"kind": "hb", "v": 1, "worker": k.worker, "epoch": -1, "seq": 999, "progress": -5}).encode())),
    "oversized": ("oversized", lambda rng, k: (_ghost(rng), "hb", b'{"kind":"hb","pad":"' + b"A" * 70_000 + b'"}')),
    "deep": ("malformed", lambda rng, k: (_ghost(rng), _which(rng), b"[" * 3000 + b"]" * 3000)),
}
WEIGHTS = {**dict.fromkeys([*COMMANDS, *WORKERS], 4), "cmd_oversized": 1, "oversized": 1, "cmd_replayed": 6,
           "hb_replayed": 6, "death_at_live_epoch": 8, "future_epoch": 6}
"""How often each kind comes: mostly the cheap ones, a little of the large; more of what aims at the live worker and of
replays."""


def make_flood(rng: random.Random, n: int, k: Known) -> list[Hostile]:
    """``n`` hostile messages in ``WEIGHTS``' proportions, each with the outcome it must have.
    Heartbeats at QoS 0 as workers send them; commands, births and deaths at QoS 1, some of the
    births and deaths retained (so they also wait for any monitor that connects later)."""
    out: list[Hostile] = []
    for kind in rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()), k=n):
        if kind in COMMANDS:
            reason, make_cmd = COMMANDS[kind]
            out.append(Hostile(kind, k.topics.cmd, make_cmd(rng, k), 1, ("refused", reason)))
            continue
        reason, make = WORKERS[kind]
        wid, which, payload = make(rng, k)
        topic = f"{k.topics.base}/worker/{wid}/{which}"  # by hand: Topics.worker refuses odd ids
        out.append(Hostile(kind, topic, payload, 0 if which == "hb" else 1, ("dropped", reason),
                           retain=which != "hb" and rng.random() < 0.3))
    return out
