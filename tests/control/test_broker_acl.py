"""The example broker configuration (deploy/mosquitto/) in a real Mosquitto, over TLS: every account
publishes and reads only what warpdeck.acl grants it, and an engine and its workers run under it.

Mosquitto answers a refused MQTT 5 publish with "not authorized" on its PUBACK. It acknowledges a
refused MQTT 3.1.1 publish as if it had gone through, so there a subscriber proves the refusal: it
never receives the refused message, and does receive a permitted one that the same connection
published after it (the broker handles one connection's packets in order and queues what it
forwards to a subscriber in that order).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from wd_broker import Mosquitto, TlsFiles, make_tls, mosquitto_binary
from wd_control import EngineThread, WorkerProcess, slow_spec, wait_for
from wd_wait import until

from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.signing import Signer
from warpdeck.engine.control.topics import Topics, WorkerTopic
from warpdeck.engine.control.wire import Birth, Death, Event, Heartbeat, Telemetry, decode, encode
from warpdeck.engine.state.commands import Pause

DEPLOY = Path(__file__).parents[2] / "deploy" / "mosquitto"
ENGINE, OPERATOR, VIEWER = "warpdeck-engine", "warpdeck-operator", "warpdeck-viewer"
ACCOUNTS = (ENGINE, OPERATOR, VIEWER, "w1", "w2")
SECRET = b"the operators' command secret"
NOT_AUTHORIZED = 0x87


def _password(account: str) -> str:
    return f"{account}-password"


def _passwd_binary() -> str:
    beside_broker = str(Path(mosquitto_binary()).parent)
    found = shutil.which("mosquitto_passwd") or shutil.which("mosquitto_passwd", path=beside_broker)
    if found is None:
        msg = "mosquitto_passwd is not installed (it comes with mosquitto)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg}: CI must test the example ACL")
        pytest.skip(msg)
    return found


def example_conf(port: int, passwd: Path, tls: TlsFiles) -> str:
    """deploy/mosquitto/mosquitto.conf with its files replaced by the test's, its listener on a
    loopback port and persistence off; everything else exactly as shipped."""
    files = {"password_file": passwd, "acl_file": DEPLOY / "warpdeck.acl", "cafile": tls.ca, "certfile": tls.cert,
             "keyfile": tls.key}
    changed: dict[str, str | None] = {"listener": f"listener {port} 127.0.0.1", "persistence": "persistence false",
                                      "persistence_location": None, **{k: f"{k} {v}" for k, v in files.items()}}
    out: list[str] = []
    seen: set[str] = set()
    for line in (DEPLOY / "mosquitto.conf").read_text().splitlines():
        key = line.split(" ", 1)[0]
        seen.add(key)
        new = changed.get(key, line)
        if new is not None:
            out.append(new)
    assert seen >= {"allow_anonymous", *changed}, "the example no longer sets what this test replaces"
    out += ["log_type error", "log_type warning"]  # nobody reads the log pipe: keep it short
    if os.geteuid() == 0:
        out.append("user root")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class SecuredBroker:
    """Mosquitto running the example configuration, with one password per account."""

    mosquitto: Mosquitto

    def address(self, account: str | None, password: str | None = None) -> BrokerAddress:
        return replace(self.mosquitto.address, username=account,
                       password=password or (_password(account) if account else None))

    def url(self, account: str) -> str:
        return f"mqtts://{account}:{_password(account)}@127.0.0.1:{self.mosquitto.port}"

    @property
    def ca(self) -> Path:
        assert self.mosquitto.tls is not None
        return self.mosquitto.tls.ca


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    workdir = tmp_path_factory.mktemp("acl")
    tls = make_tls(workdir)
    passwd = workdir / "passwd"
    tool = _passwd_binary()
    for i, account in enumerate(ACCOUNTS):
        subprocess.run([tool, *(["-c"] if i == 0 else []), "-b", str(passwd), account, _password(account)],
                       check=True, capture_output=True)
    passwd.chmod(0o600)
    broker = Mosquitto(workdir, tls=tls)
    broker.conf.write_text(example_conf(broker.port, passwd, tls))
    broker.start()
    try:
        yield SecuredBroker(broker)
    finally:
        broker.stop()


def _client(secured: SecuredBroker, account: str, **kw: Any) -> contextlib.AbstractAsyncContextManager[aiomqtt.Client]:
    """An MQTT 3.1.1 client of ``account`` (the protocol warpdeck itself speaks)."""
    return aiomqtt.Client(**secured.address(account).client_kwargs(), protocol=aiomqtt.ProtocolVersion.V311, **kw)


async def _heard_until(sub: aiomqtt.Client, last: str, limit_s: float = 10) -> list[str]:
    """The topics ``sub`` receives, up to and including the first message on ``last``."""
    heard: list[str] = []
    async with asyncio.timeout(limit_s):
        async for m in sub.messages:
            heard.append(m.topic.value)
            if m.topic.value == last:
                return heard
    return heard


class PahoClient:
    """A paho client for what aiomqtt hides: the reason code of each MQTT 5 PUBACK, and a
    DISCONNECT that asks the broker to send the Will (as if the process had died)."""

    def __init__(self, address: BrokerAddress, client_id: str, *, will: tuple[str, bytes] | None = None) -> None:
        self._port = address.port
        self._client = c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
        c.username_pw_set(address.username, address.password)
        c.tls_set(ca_certs=str(address.ca_file))
        if will is not None:
            c.will_set(will[0], will[1], qos=1)
        self._changed = threading.Condition()
        self._connack: ReasonCode | None = None
        self._acks: dict[int, ReasonCode] = {}
        c.on_connect = self._on_connect
        c.on_publish = self._on_publish

    def __enter__(self) -> PahoClient:
        self._client.connect("127.0.0.1", self._port, keepalive=30)
        self._client.loop_start()
        with self._changed:
            assert self._changed.wait_for(lambda: self._connack is not None, 10), "no CONNACK"
        assert self._connack is not None and not self._connack.is_failure, self._connack
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def _on_connect(self, client: paho.Client, userdata: object, flags: object, rc: ReasonCode,
                    props: object) -> None:
        with self._changed:
            self._connack = rc
            self._changed.notify_all()

    def _on_publish(self, client: paho.Client, userdata: object, mid: int, rc: ReasonCode, props: object) -> None:
        with self._changed:
            self._acks[mid] = rc
            self._changed.notify_all()

    def publish(self, topic: str, payload: bytes) -> ReasonCode:
        """Publish at QoS 1; the PUBACK's reason code."""
        mid = self._client.publish(topic, payload, qos=1).mid
        with self._changed:
            assert self._changed.wait_for(lambda: mid in self._acks, 10), f"no PUBACK for {topic}"
            return self._acks[mid]

    def die(self) -> None:
        """Leave with "disconnect with Will message" (MQTT 5): the broker sends the Will."""
        self._client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, "Disconnect with will message"))
        self._client.loop_stop()


def _topic(tp: Topics, name: str) -> str:
    """``"worker/w2/hb"``, ``"cmd"``, ...: the real topic of that name in ``tp``, from topics.py."""
    if name.startswith("worker/"):
        _, wid, which = name.split("/")
        assert which in ("birth", "hb", "death")
        return tp.worker(wid, cast("WorkerTopic", which))
    return {"engine/state": tp.engine_state, "telemetry": tp.telemetry, "events": tp.events, "cmd": tp.cmd}[name]


GRANTS = [
    ("w1", "worker/w1/birth", True), ("w1", "worker/w1/hb", True), ("w1", "worker/w1/death", True),
    ("w1", "worker/w2/birth", False), ("w1", "worker/w2/hb", False), ("w1", "worker/w2/death", False),
    ("w1", "cmd", False), ("w1", "telemetry", False), ("w1", "events", False), ("w1", "engine/state", False),
    (ENGINE, "engine/state", True), (ENGINE, "telemetry", True), (ENGINE, "events", True),
    (ENGINE, "worker/w1/death", True), (ENGINE, "cmd", False),
    (OPERATOR, "cmd", True), (OPERATOR, "engine/state", False), (OPERATOR, "telemetry", False),
    (OPERATOR, "events", False), (OPERATOR, "worker/w1/death", False), (OPERATOR, f"worker/{OPERATOR}/birth", False),
    (VIEWER, "cmd", False), (VIEWER, "engine/state", False), (VIEWER, "telemetry", False), (VIEWER, "events", False),
    (VIEWER, "worker/w1/death", False), (VIEWER, f"worker/{VIEWER}/hb", False),
]


@pytest.mark.parametrize(("account", "topic", "allowed"), GRANTS,
                         ids=[f"{a}:{t}:{'ok' if ok else 'refused'}" for a, t, ok in GRANTS])
def test_each_account_publishes_only_where_the_acl_grants_it(secured: SecuredBroker, account: str, topic: str,
                                                             allowed: bool) -> None:
    tp = Topics("acl-grants")
    with PahoClient(secured.address(account), f"wd-acl-grants-{account}") as client:
        rc = client.publish(_topic(tp, topic), b"{}")  # the ACL never looks at a payload
    assert rc.is_failure != allowed, f"{account} publishing on {topic}: {rc}"
    if not allowed:
        assert rc.value == NOT_AUTHORIZED, rc


@pytest.mark.parametrize(("account", "password"), [(None, None), ("w1", "not-its-password"), ("intruder", "x")])
async def test_a_client_without_a_valid_account_is_refused(secured: SecuredBroker, account: str | None,
                                                           password: str | None) -> None:
    with pytest.raises(aiomqtt.MqttCodeError) as info:
        async with aiomqtt.Client(**secured.address(account, password).client_kwargs(),
                                  protocol=aiomqtt.ProtocolVersion.V311):
            pass
    assert str(info.value.rc) == "Not authorized", info.value


async def test_a_worker_cannot_publish_on_another_workers_topics(secured: SecuredBroker) -> None:
    tp = Topics("acl-forge")
    own = tp.worker("w1", "hb")
    async with _client(secured, ENGINE) as engine, _client(secured, "w1") as w1:
        await engine.subscribe(f"{tp.base}/worker/#", qos=1)
        await w1.publish(tp.worker("w2", "birth"), encode(Birth(worker="w2", epoch=1)), qos=1)
        await w1.publish(tp.worker("w2", "hb"), encode(Heartbeat(worker="w2", epoch=1, seq=0, progress=0)), qos=1)
        await w1.publish(tp.worker("w2", "death"), encode(Death(worker="w2", epoch=1)), qos=1)
        await w1.publish(own, encode(Heartbeat(worker="w1", epoch=1, seq=0, progress=0)), qos=1)
        assert await _heard_until(engine, own) == [own]


async def test_a_viewer_cannot_publish_commands(secured: SecuredBroker) -> None:
    tp = Topics("acl-viewer-cmd")
    signer = Signer(SECRET)  # a viewer that holds the secret too: the broker refuses it all the same
    from_operator = signer.payload(Pause())
    async with _client(secured, ENGINE) as engine, _client(secured, VIEWER) as viewer, \
            _client(secured, OPERATOR) as operator:
        await engine.subscribe(tp.cmd, qos=1)
        await viewer.publish(tp.cmd, signer.payload(Pause()), qos=1)
        await operator.publish(tp.cmd, from_operator, qos=1)
        async with asyncio.timeout(10):
            first = await anext(engine.messages)
    assert first.payload == from_operator


async def test_a_viewer_reads_what_the_engine_publishes_and_never_a_command(secured: SecuredBroker) -> None:
    tp = Topics("acl-viewer-read")
    async with _client(secured, VIEWER) as viewer, _client(secured, OPERATOR) as operator, \
            _client(secured, ENGINE) as engine:
        await viewer.subscribe(f"{tp.base}/#", qos=1)
        await operator.publish(tp.cmd, Signer(SECRET).payload(Pause()), qos=1)
        for topic in (tp.engine_state, tp.telemetry, tp.events):
            await engine.publish(topic, b"{}", qos=1)
        assert await _heard_until(viewer, tp.events) == [tp.engine_state, tp.telemetry, tp.events]


def _die_with_will(address: BrokerAddress, client_id: str, will: tuple[str, bytes]) -> None:
    with PahoClient(address, client_id, will=will) as client:
        client.die()


@pytest.mark.parametrize(("owner", "delivered"), [("w1", True), ("w2", False)], ids=["own-topic", "another-worker"])
async def test_a_will_is_delivered_only_on_the_workers_own_death_topic(secured: SecuredBroker, owner: str,
                                                                        delivered: bool) -> None:
    tp = Topics(f"acl-will-{owner}")
    will, own = tp.worker(owner, "death"), tp.worker("w1", "hb")
    client_id = f"wd-acl-will-{owner}"
    async with _client(secured, ENGINE) as engine:
        await engine.subscribe(f"{tp.base}/worker/#", qos=1)
        await asyncio.to_thread(_die_with_will, secured.address("w1"), client_id,
                                (will, encode(Death(worker=owner, epoch=1, reason="connection lost"))))
        # The same client id again: however the broker learnt that the first connection ended, it
        # sent (or refused) its Will before it accepts this one.
        async with _client(secured, "w1", identifier=client_id) as again:
            await again.publish(own, b"{}", qos=1)
        heard = await _heard_until(engine, own)
    assert heard == ([will, own] if delivered else [own])


@contextlib.contextmanager
def _worker_w1(secured: SecuredBroker, pipeline: str) -> Iterator[WorkerProcess]:
    """A real worker process, w1, under its own account; born when this returns."""
    w = WorkerProcess(secured.url("w1"), "w1", pipeline, extra_args=["--ca-file", str(secured.ca)])
    try:
        yield w.start()
    finally:
        w.close()


def test_a_worker_under_its_own_account_is_heard_and_convicted_by_its_will(secured: SecuredBroker) -> None:
    pipeline = "acl-worker"
    with EngineThread(slow_spec(pipeline), secured.address(ENGINE)) as et, _worker_w1(secured, pipeline) as w1:
        assert et.engine is not None
        wait_for(lambda: et.state_of("w1") == "online", 10, "w1 heard through the ACL")
        # The engine's in-process worker heartbeats under the engine's account.
        wait_for(lambda: et.state_of(et.engine.worker_id) == "online", 10, "the in-process worker heard")
        t0 = time.monotonic()
        w1.signal(signal.SIGKILL)
        wait_for(lambda: et.verdict("w1", "dead", t0), 5, "w1 convicted")
        assert et.verdict("w1", "dead", t0).reason == "will"


async def test_a_death_forged_by_another_workers_account_convicts_nobody(secured: SecuredBroker) -> None:
    tp = Topics("acl-forged-death")
    with EngineThread(slow_spec(tp.pipeline), secured.address(ENGINE)) as et, _worker_w1(secured, tp.pipeline) as w1:
        await until(lambda: et.state_of("w1") == "online", 10, "w1 heard")
        t0 = time.monotonic()
        async with _client(secured, "w2") as w2:
            # w1's current epoch is in its retained birth. A goodbye convicts at once (a Will
            # only after a short hold), and retained it would convict w1 in every later engine.
            forged = Death(worker="w1", epoch=w1.epoch, graceful=True, reason="forged")
            await w2.publish(tp.worker("w1", "death"), encode(forged), qos=1, retain=True)
            await w2.publish(tp.worker("w2", "birth"), encode(Birth(worker="w2", epoch=1)), qos=1)
        seen: list[dict[str, str]] = []

        def w2_heard() -> bool:
            snap = et.snapshot()
            states = {w.id: w.state for w in snap.workers} if snap is not None else {}
            seen.append(states)
            return "w2" in states

        # The engine reads one connection's messages in order: when it knows w2, it has read
        # whatever reached it of the forgery before, and the same view shows w1.
        await until(w2_heard, 10, "w2's own birth heard")
        assert seen[-1]["w1"] == "online"
        assert et.verdict("w1", "dead", t0) is None


async def test_the_engine_obeys_the_operator_account_and_a_viewer_hears_the_answer(secured: SecuredBroker) -> None:
    tp = Topics("acl-command")
    signed = Signer(SECRET).sign(Pause())
    with EngineThread(slow_spec(tp.pipeline), secured.address(ENGINE), secret=SECRET) as et:
        assert et.engine is not None and et.engine.control is not None
        await until(et.engine.control.connected.is_set, 10, "plane connected")
        answer: Event | None = None
        telemetry: Telemetry | None = None
        async with _client(secured, VIEWER) as viewer, _client(secured, OPERATOR) as operator:
            await viewer.subscribe([(tp.events, 1), (tp.telemetry, 0)])
            await operator.publish(tp.cmd, encode(signed), qos=1)
            async with asyncio.timeout(10):
                async for m in viewer.messages:
                    msg = decode(m.payload)  # type: ignore[arg-type]
                    if isinstance(msg, Telemetry):
                        telemetry = msg
                    elif isinstance(msg, Event) and msg.ref == signed.nonce:
                        answer = msg
                    if answer is not None and telemetry is not None:
                        break
        assert answer is not None and telemetry is not None, "the viewer heard no answer"
        assert answer.what == "command_applied", answer
        assert telemetry.pipeline == tp.pipeline
        assert et.engine.feeder.paused
