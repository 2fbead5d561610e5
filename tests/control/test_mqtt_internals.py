"""The canary: every private aiomqtt and paho name the control plane relies on is there, in the
versions it was written for. When either library changes, this fails first, naming what moved;
and where a name is missing, the plane reads through aiomqtt's own path instead of failing."""

from __future__ import annotations

import logging

import aiomqtt
import pytest
from wd_broker import Broker

from warpdeck.engine.control import mqtt_internals
from warpdeck.engine.control.mqtt_internals import USED, missing, versions
from warpdeck.engine.control.socket_reads import read_in_batches


async def test_every_private_name_the_control_plane_uses_is_there() -> None:
    assert missing() == [], f"aiomqtt/paho internals gone: {missing()} (see engine/control/mqtt_internals.py)"


def test_the_installed_libraries_are_the_ones_the_code_was_written_for() -> None:
    for dist, (installed, written_for) in versions().items():
        assert installed == written_for, f"{dist} {installed} installed; written for {written_for}"


async def test_a_missing_name_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mqtt_internals, "USED", (*USED, ("paho.Client", ("_gone_in_paho_3",), "x.py")))
    assert missing() == ["paho.Client._gone_in_paho_3 (x.py)"]


async def test_without_a_name_the_plane_reads_through_aiomqtt_and_says_why(
        broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(mqtt_internals, "USED", (*USED, ("paho.Client", ("_gone_in_paho_3",), "x.py")))
    got: list[str] = []
    async with aiomqtt.Client(**broker.address.client_kwargs()) as client:
        with caplog.at_level(logging.WARNING):
            assert read_in_batches(client, lambda topic, *_: got.append(topic)) is None
        await client.subscribe("wd-test/canary")
        await client.publish("wd-test/canary", b"x")
        async for message in client.messages:  # aiomqtt's own path still delivers
            got.append(str(message.topic))
            break
    assert got == ["wd-test/canary"]
    assert "paho.Client._gone_in_paho_3 (x.py)" in caplog.text
