"""Dead, frozen and stuck workers, with real worker processes and real brokers (Mosquitto and the
embedded amqtt): the engine's monitor convicts each for the right reason, and a broker restart
convicts nobody. How fast (killed p99 <= 0.5 s, frozen p99 <= 3 s: DESIGN.md section 9) is measured
by benchmarks/heartbeats.py over many trials; a single wall-clock bound here would only be noise
on a busy machine."""

from __future__ import annotations

import signal
import time

from wd_broker import Broker
from wd_control import EngineThread, WorkerProcess, collect, slow_spec, wait_for, workers
from wd_wait import until

from warpdeck.engine.control.monitor_types import MonitorConfig
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Death, EngineState, decode


def _engine(broker: Broker, name: str, **monitor: float) -> EngineThread:
    return EngineThread(slow_spec(name), broker.address, monitor=MonitorConfig(**monitor) if monitor else None)


def test_a_killed_worker_is_convicted_by_its_will(broker: Broker) -> None:
    with _engine(broker, "kill") as et, workers(WorkerProcess(broker.url, "w-kill", "kill")) as (w,):
        wait_for(lambda: et.state_of("w-kill") == "online", 10, "worker online")
        t0 = time.monotonic()
        w.signal(signal.SIGKILL)
        wait_for(lambda: et.verdict("w-kill", "dead", t0), 5, "killed worker convicted", step=0.002)
        v = et.verdict("w-kill", "dead", t0)
        assert v.reason == "will"
        wait_for(lambda: et.state_of("w-kill") == "dead", 1, "the snapshot shows it dead")


def test_a_frozen_worker_is_convicted_for_its_silence(broker: Broker) -> None:
    # amqtt never sends the Will of a frozen client, and Mosquitto only after 1.5 keepalives:
    # this is the monitor's phi-accrual detector (and its backstop) at work.
    with _engine(broker, "freeze") as et, workers(WorkerProcess(broker.url, "w-frozen", "freeze"),
                                                   WorkerProcess(broker.url, "w-fine", "freeze")) as (w, _):
        wait_for(lambda: et.state_of("w-frozen") == "online" and et.state_of("w-fine") == "online", 10, "online")
        time.sleep(1.5)  # let the detector learn the rhythm
        t0 = time.monotonic()
        w.signal(signal.SIGSTOP)
        wait_for(lambda: et.verdict("w-frozen", "dead", t0), 6, "frozen worker convicted", step=0.01)
        v = et.verdict("w-frozen", "dead", t0)
        assert v.reason == "silent"
        wait_for(lambda: et.state_of("w-frozen") == "dead", 1, "the snapshot shows it dead")
        assert et.state_of("w-fine") == "online"
        assert et.worker("w-frozen").heartbeat_age_s >= 1.0


def test_a_stuck_worker_is_hung_while_its_heartbeats_continue(broker: Broker) -> None:
    with _engine(broker, "stuck", stuck_after_s=1.0) as et, \
            workers(WorkerProcess(broker.url, "w-stuck", "stuck", work="stuck"),
                    WorkerProcess(broker.url, "w-busy", "stuck", work="steady")):
        wait_for(lambda: et.state_of("w-busy") == "online", 10, "the busy worker heard")
        wait_for(lambda: et.state_of("w-stuck") == "hung", 6, "stuck worker hung")
        stuck = et.worker("w-stuck")
        assert stuck.heartbeat_age_s is not None and stuck.heartbeat_age_s < 1.0, "its heartbeats still flow"
        assert et.state_of("w-busy") == "online", "a worker making progress is never hung"
        time.sleep(1.0)
        assert et.state_of("w-stuck") == "hung", "hung is not dead: the process is alive"


def test_a_broker_restart_convicts_nobody_and_every_worker_is_reborn(broker: Broker) -> None:
    with _engine(broker, "restart") as et, workers(
            *(WorkerProcess(broker.url, f"w{i}", "restart") for i in range(3))) as procs:
        ids = [p.worker_id for p in procs]
        wait_for(lambda: all(et.state_of(i) == "online" for i in ids), 10, "all online")
        epochs = {i: et.worker(i).epoch for i in ids}
        broker.stop()
        done_at_stop = et.snapshot().counts.done
        seen: set[str] = set()
        t_down = time.monotonic()
        while time.monotonic() - t_down < 3.0:
            seen.update(et.state_of(i) or "" for i in ids)
            time.sleep(0.05)
        assert "stale" in seen, f"workers not marked stale while the broker was away: {seen}"
        assert et.snapshot().counts.done > done_at_stop, "the engine kept computing without its broker"
        assert not et.snapshot().control.connected
        broker.start()
        t_up = time.monotonic()
        reborn = 0.0
        while time.monotonic() - t_up < 8.0:
            states = {i: et.state_of(i) for i in ids}
            seen.update(s or "" for s in states.values())
            if not reborn and all(et.worker(i).epoch > epochs[i] and states[i] == "online" for i in ids):
                reborn = time.monotonic() - t_up
            time.sleep(0.05)
        assert "dead" not in seen, f"a worker was convicted across a broker restart: {seen}"
        assert reborn, "not every worker was re-born with a new epoch within 8 s"
        assert et.engine is not None and et.engine.control is not None
        assert et.engine.control.reconnects >= 1


async def test_the_engines_own_worker_heartbeats_and_says_goodbye(broker: Broker) -> None:
    topics = Topics("own")
    with _engine(broker, "own") as et:
        assert et.engine is not None
        wid = et.engine.worker_id
        await until(lambda: et.state_of(wid) == "online" and et.worker(wid).heartbeat_age_s is not None, 10,
                    "the engine's own worker heard over MQTT")
    # After the engine stopped: its retained state says offline and its worker said goodbye.
    msgs = await collect(broker.address, f"{topics.base}/#", lambda got: {str(m.topic) for m in got} >= {
        topics.engine_state, topics.worker(wid, "death")}, limit_s=10)
    by_topic = {str(m.topic): decode(m.payload) for m in msgs if m.retain}  # type: ignore[arg-type]
    state = by_topic[topics.engine_state]
    assert isinstance(state, EngineState) and state.state == "offline"
    death = by_topic[topics.worker(wid, "death")]
    assert isinstance(death, Death) and death.graceful
