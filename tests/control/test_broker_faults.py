"""A broker that goes away mid-run is a fault the engine handles, so it leaves stderr clean: a headless
run through the command line, against a real Mosquitto stopped with SIGTERM and then SIGKILLed
(each time restarted on its port), prints no traceback and no "exception was never retrieved",
finishes every task and convicts nobody. Also: the batched read path hands a connection back to
aiomqtt's own when one of paho's internals fails at run time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiomqtt
import pytest
from wd_broker import Broker, Mosquitto
from wd_control import collect
from wd_gated import GATE_ENV

from warpdeck.engine.control.socket_reads import BatchedReader, read_in_batches
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import EngineState, decode

SUPPORT = Path(__file__).resolve().parents[1] / "support"
# Slow (80 ms a batch of 8) until the test opens the gate, then done at once: the run outlasts both
# faults and their waits however long they take on a loaded machine (on CI a fixed-length run once
# ended before the second restart was waited for).
COUNT = 2_000
SPEC = f"""
name = "broker-faults"
backend = "numpy"
batch_size = 8
[source]
kind = "synthetic"
count = {COUNT}
shape = [4]
dtype = "float64"
[sink]
kind = "null"
[[stages]]
fn = "wd_gated:slow_until_gate"
"""
DOWN_S = 1.0  # how long the broker stays away: the fault itself, not a wait for a condition


async def _wait_online(broker: Mosquitto, topic: str) -> None:
    def online(got: list[aiomqtt.Message]) -> bool:
        state = decode(got[-1].payload) if isinstance(got[-1].payload, bytes) else None
        return isinstance(state, EngineState) and state.state == "online"

    await collect(broker.address, topic, online, limit_s=15)


def _stop(broker: Mosquitto, sig: signal.Signals) -> None:
    assert broker.proc is not None
    broker.proc.send_signal(sig)
    broker.proc.wait(10)
    broker.stop()  # closes its pipe; the process is gone already


async def test_a_broker_terminated_then_killed_mid_run_leaves_stderr_clean(tmp_path: Path,
                                                                           mosquitto: Mosquitto) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    report = tmp_path / "report.json"
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "warpdeck.cli.main", "run", str(spec), "--headless", "--json", str(report),
        "--run-dir", str(tmp_path / "run"), "--broker", mosquitto.url,
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SUPPORT), "COLUMNS": "160", GATE_ENV: str(tmp_path / "gate")})
    state = Topics("broker-faults").engine_state
    try:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            await _wait_online(mosquitto, state)
            _stop(mosquitto, sig)
            await asyncio.sleep(DOWN_S)
            mosquitto.start()
        await _wait_online(mosquitto, state)
        assert run.returncode is None, "the run ended before both faults"
        (tmp_path / "gate").touch()
        _, raw = await asyncio.wait_for(run.communicate(), 120)
    finally:
        if run.returncode is None:
            run.kill()
            await run.communicate()
    err = raw.decode()
    assert run.returncode == 0, err
    assert "Traceback" not in err, err
    assert "never retrieved" not in err, err
    assert "Exception in callback" not in err, err
    rep = json.loads(report.read_text())
    assert rep["counts"]["done"] == COUNT
    assert rep["control"]["workers_lost"] == [], "a worker was convicted across the broker's restarts"


async def _read_with_a_failing_internal(broker: Broker) -> tuple[list[str], BatchedReader]:
    got: list[str] = []
    n = 400
    all_in, last_in = asyncio.Event(), asyncio.Event()

    def note(topic: str) -> None:
        got.append(topic)
        if len(got) >= n:
            all_in.set()
        if topic == "wd-test-fb/last":
            last_in.set()

    async with aiomqtt.Client(**broker.address.client_kwargs(), identifier="wd-test-fb-sub") as sub, \
            aiomqtt.Client(**broker.address.client_kwargs(), identifier="wd-test-fb-pub") as pub:
        reader = read_in_batches(sub, lambda topic, _p, _r: note(topic), every_s=0.01)
        assert reader is not None

        def broken() -> bool | None:  # as if paho had changed under us
            raise AttributeError("'Client' object has no attribute '_in_packet'")

        reader._take_publish = broken  # type: ignore[method-assign]
        sub._queue.put_nowait = lambda m: note(str(m.topic))  # type: ignore[method-assign]  # aiomqtt's path
        await sub.subscribe("wd-test-fb/#", qos=0)
        for i in range(n):
            await pub.publish(f"wd-test-fb/{i}", b"x" * 100, qos=1 if i % 3 == 0 else 0)
        await asyncio.wait_for(all_in.wait(), 20)
        # The connection still works both ways: a QoS 1 publish is acknowledged through the writer.
        await sub.publish("wd-test-fb/last", b"", qos=1)
        await asyncio.wait_for(last_in.wait(), 20)
    return got, reader


async def test_batched_reads_fall_back_to_aiomqtt_when_an_internal_fails(mosquitto: Mosquitto,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    got, reader = await _read_with_a_failing_internal(mosquitto)
    assert reader.fell_back is not None
    assert got[:400] == [f"wd-test-fb/{i}" for i in range(400)], "messages lost or reordered by the fallback"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "never retrieved" not in err, err
