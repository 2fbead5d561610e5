"""Broker fixtures: every control-plane test that needs a broker gets a real one, started on a free
loopback port and stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from wd_broker import Amqtt, Broker, Mosquitto


@pytest.fixture(params=["mosquitto", "amqtt"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """Each test runs once against Mosquitto and once against the embedded amqtt broker."""
    b: Broker = Mosquitto(tmp_path) if request.param == "mosquitto" else Amqtt(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()
