"""Bounded state (engine/control/worker_records.py, monitor.py, worker_intake.py): a worker record exists only
after a birth, the dead are forgotten, the records have a ceiling, and what is retained on the
broker speaks only of this run's workers, so a later engine counts no earlier run's as lost.

First the monitor's rules on a fake clock, then the same promises through a real Mosquitto."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import aiomqtt
from wd_broker import Mosquitto
from wd_control import EngineThread, slow_spec

from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import MonitorConfig, VerdictKind
from warpdeck.engine.control.plane import ControlPlane
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Birth, Death, Heartbeat, decode, encode
from warpdeck.engine.state.part_views import WorkerState

TICK = 0.05


def _states(m: WorkerMonitor, now: float) -> dict[str, WorkerState]:
    return {v.worker_id: v.state for v in m.views(now)}


def _run(m: WorkerMonitor, start: float, end: float) -> list[object]:
    """Ticks every 50 ms from ``start`` to ``end``; the verdicts."""
    out: list[object] = []
    for k in range(round((end - start) / TICK) + 1):
        out += m.tick(start + k * TICK)
    return out


# -- the monitor ------------------------------------------------------------------------------------
def test_a_heartbeat_or_death_of_a_worker_never_born_makes_no_record() -> None:
    m = WorkerMonitor()
    assert m.on_heartbeat("ghost", 7, 0, 0, 0.0, busy=False) == "unborn"
    assert m.on_death("ghost", 7, 0.1, graceful=False) == "unborn"
    assert m.on_death("ghost", 7, 0.2, graceful=True) == "unborn"
    assert _run(m, 0.0, 30.0) == []
    assert m.views(30.0) == []
    assert m.epoch_of("ghost") is None
    assert m.counters.unborn == 3


def test_a_death_of_an_epoch_never_born_fences_nothing() -> None:
    """A forged death with a far-future epoch (or any epoch not born) leaves the worker as it was,
    and its next real birth is taken."""
    m = WorkerMonitor()
    m.on_birth("w", 100, 0.0)
    m.on_heartbeat("w", 100, 0, 0, 0.4, busy=False)
    assert m.on_death("w", 2**62, 0.5, graceful=False) == "unborn"
    assert m.on_death("w", 101, 0.5, graceful=True) == "unborn"
    assert m.tick(0.5) == []
    assert (m.epoch_of("w"), _states(m, 0.5)) == (100, {"w": WorkerState.ONLINE})
    assert m.on_birth("w", 101, 0.6) is None
    assert m.epoch_of("w") == 101
    m.on_death("w", 101, 0.7, graceful=False)
    assert [(v.kind, v.epoch, v.reason) for v in m.tick(0.7)] == [(VerdictKind.DEAD, 101, "will")]


def test_a_dead_worker_is_forgotten_after_forget_after_s_and_a_live_one_never() -> None:
    m = WorkerMonitor(MonitorConfig(forget_after_s=10.0))
    m.on_birth("dead", 1, 0.0)
    m.on_birth("live", 1, 0.0)
    m.on_death("dead", 1, 1.0, graceful=True)
    t = 0.0
    while t < 60.0:
        t += 0.5
        m.on_heartbeat("live", 1, round(t * 2) % 256, 0, t, busy=False)
        m.tick(t)
        if t == 10.5:
            assert set(_states(m, t)) == {"dead", "live"}
            assert m.take_forgotten() == []
    assert m.take_forgotten() == ["dead"]
    assert set(_states(m, t)) == {"live"}
    assert (m.counters.forgotten, m.epoch_of("dead")) == (1, None)
    assert m.on_heartbeat("dead", 1, 0, 0, t, busy=False) == "unborn"


def test_a_worker_reborn_before_it_is_forgotten_is_kept() -> None:
    m = WorkerMonitor(MonitorConfig(forget_after_s=10.0))
    m.on_birth("w", 1, 0.0)
    m.on_death("w", 1, 1.0, graceful=False)
    m.on_birth("w", 2, 5.0)
    for k in range(1, 60):
        m.on_heartbeat("w", 2, k, 0, 5.0 + k * 0.5, busy=False)
        m.tick(5.0 + k * 0.5)
    assert m.take_forgotten() == []
    assert _states(m, 35.0) == {"w": WorkerState.ONLINE}


def test_the_ceiling_forgets_the_oldest_dead_first_then_refuses() -> None:
    m = WorkerMonitor(MonitorConfig(max_workers=3))
    for wid in ("a", "b", "c"):
        m.on_birth(wid, 1, 0.0)
    m.on_death("b", 1, 1.0, graceful=False)
    m.on_death("a", 1, 2.0, graceful=False)
    assert m.on_birth("d", 1, 3.0) is None
    assert m.take_forgotten() == ["b"]
    assert m.on_birth("e", 1, 3.0) is None
    assert m.take_forgotten() == ["a"]
    assert m.on_birth("f", 1, 3.0) == "too_many_workers"
    assert m.on_birth("c", 2, 3.0) is None  # a known worker's re-birth needs no room
    assert sorted(_states(m, 3.0)) == ["c", "d", "e"]
    counted = m.counters
    assert (counted.too_many_workers, counted.forgotten) == (1, 2)


def test_a_worker_known_only_from_a_retained_birth_is_stale_until_heard() -> None:
    m = WorkerMonitor()
    m.on_connection(True, 0.0)
    m.on_birth("old", 1, 0.0, {"host": "x"}, retained=True)
    assert _run(m, 0.0, 60.0) == []
    assert _states(m, 60.0) == {"old": WorkerState.STALE}
    m.on_heartbeat("old", 1, 0, 0, 60.0, busy=False)  # alive after all: one of this run's workers
    assert _states(m, 60.0) == {"old": WorkerState.ONLINE}
    assert [(v.kind, v.reason) for v in _run(m, 60.0, 70.0)] == [(VerdictKind.DEAD, "silent")]
    assert m.counters.workers_lost == 1


def test_what_an_earlier_run_left_is_no_loss_and_is_forgotten() -> None:
    """A retained birth with its retained death (an earlier run's worker): dead, never a verdict
    nor a loss; a retained birth alone: forgotten unheard. Both make room under the ceiling."""
    m = WorkerMonitor(MonitorConfig(forget_after_s=30.0, max_workers=2))
    m.on_connection(True, 0.0)
    m.on_birth("gone", 1, 0.0, retained=True)
    m.on_death("gone", 1, 0.0, graceful=True)
    m.on_birth("quiet", 1, 0.0, retained=True)
    assert _run(m, 0.0, 20.0) == []
    assert _states(m, 20.0) == {"gone": WorkerState.DEAD, "quiet": WorkerState.STALE}
    assert m.counters.workers_lost == 0
    assert m.on_birth("new", 1, 20.0) is None  # room made: the oldest idle record goes
    assert m.take_forgotten() == ["gone"]
    m.tick(30.0)
    assert m.take_forgotten() == ["quiet"]
    assert list(_states(m, 30.0)) == ["new"]


def test_a_worker_known_from_its_retained_birth_keeps_its_record_while_it_could_be_alive() -> None:
    """A worker started before the engine is heard a heartbeat after its retained birth: until
    then (grace and backstop) a flood of births cannot take its record, nor while the input lags."""
    cfg = MonitorConfig(max_workers=2)
    m = WorkerMonitor(cfg)
    m.on_connection(True, 0.0)
    m.on_birth("early", 1, 0.0, retained=True)
    m.on_birth("a", 1, 0.0)
    limit = cfg.grace_s + cfg.backstop_s
    assert m.on_birth("ghost", 1, limit - 0.1) == "too_many_workers"
    m.on_input_lag(True, limit)
    assert m.on_birth("ghost", 1, limit) == "too_many_workers"
    m.on_input_lag(False, limit + 1.0)
    assert m.on_birth("ghost", 1, limit + 1.0) is None
    assert m.take_forgotten() == ["early"]


def test_each_worker_is_lost_once_per_record() -> None:
    m = WorkerMonitor(MonitorConfig(forget_after_s=10.0))
    m.on_birth("w", 1, 0.0)
    m.on_death("w", 1, 0.1, graceful=False)
    m.on_birth("w", 2, 0.2)
    m.on_death("w", 2, 0.3, graceful=False)
    dead = [v for v in m.tick(0.3) if v.kind is VerdictKind.DEAD]
    assert ([v.epoch for v in dead], m.counters.workers_lost) == ([1, 2], 1)
    m.tick(20.0)
    assert m.take_forgotten() == ["w"]
    m.on_birth("w", 3, 20.0)  # forgotten and born again: a new worker
    m.on_death("w", 3, 20.1, graceful=False)
    m.tick(20.1)
    assert m.counters.workers_lost == 2


# -- through Mosquitto ------------------------------------------------------------------------------
def _epoch() -> int:
    return time.time_ns() // 1000


async def _until(cond: Callable[[], object], limit_s: float, what: str) -> None:
    """Wait for ``cond`` without blocking this loop (a subscriber may be reading on it)."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what} not met within {limit_s} s")
        await asyncio.sleep(0.02)


async def _publish(address: BrokerAddress, messages: list[tuple[str, bytes, bool]]) -> None:
    async with aiomqtt.Client(**address.client_kwargs()) as c:
        for topic, payload, retain in messages:
            await c.publish(topic, payload, qos=1, retain=retain)


async def _retained(address: BrokerAddress, pattern: str) -> dict[str, bytes]:
    """What the broker retains under ``pattern`` now: a marker retained last, on a topic of its own
    subscribed after ``pattern``, arrives after every retained message of ``pattern``."""
    marker = f"wd-test/marker/{time.monotonic_ns()}"
    got: dict[str, bytes] = {}
    async with aiomqtt.Client(**address.client_kwargs()) as c:
        await c.publish(marker, b"end", qos=1, retain=True)
        await c.subscribe([(pattern, 1), (marker, 1)])
        async with asyncio.timeout(10):
            async for msg in c.messages:
                if str(msg.topic) == marker:
                    break
                got[str(msg.topic)] = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
        await c.publish(marker, b"", qos=1, retain=True)
    return got


@contextlib.asynccontextmanager
async def _listening(address: BrokerAddress, pattern: str) -> AsyncIterator[list[tuple[str, bytes]]]:
    """Every message published under ``pattern`` while the block runs, as (topic, payload)."""
    seen: list[tuple[str, bytes]] = []
    async with aiomqtt.Client(**address.client_kwargs()) as c:
        await c.subscribe(pattern, qos=1)

        async def read() -> None:
            async for msg in c.messages:
                seen.append((str(msg.topic), bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""))

        task = asyncio.create_task(read())
        try:
            yield seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _plane(eng: EngineThread) -> ControlPlane:
    assert eng.engine is not None and eng.engine.control is not None
    return eng.engine.control


async def test_ghost_births_and_heartbeats_stay_under_the_ceiling(mosquitto: Mosquitto) -> None:
    """2 000 ghosts without a secret: heartbeats of ids never born make no record, and births
    past the ceiling are refused; everything is counted."""
    topics = Topics("bounded-a")
    with EngineThread(slow_spec(name="bounded-a"), mosquitto.address, monitor=MonitorConfig(max_workers=200)) as eng:
        plane = _plane(eng)
        await _until(plane.connected.is_set, 20, "the plane connected")
        flood = []
        for i in range(1000):
            flood.append((topics.worker(f"g{i}", "birth"), encode(Birth(worker=f"g{i}", epoch=_epoch())), False))
            flood.append((topics.worker(f"h{i}", "hb"),
                          encode(Heartbeat(worker=f"h{i}", epoch=_epoch(), seq=0, progress=0, t=time.time())), False))
        await _publish(mosquitto.address, flood)

        def ghost_records() -> int:
            return sum(1 for v in plane.workers if v.worker_id.startswith("g"))

        def accounted() -> bool:
            counted = plane.monitor.counters
            return counted.unborn >= 1000 and counted.too_many_workers + counted.forgotten + ghost_records() == 1000

        await _until(accounted, 30, "every ghost refused or recorded")
        dropped = plane.dropped.counts()
        assert dropped["unborn"] >= 1000
        assert dropped["too_many_workers"] == plane.monitor.counters.too_many_workers >= 1
        assert len(plane.workers) <= 200
        assert not any(wid.startswith("h") for wid in plane.heard())
        assert eng.engine is not None
        assert all(plane.monitor.epoch_of(wid) is not None for wid in eng.engine.worker_ids), "our own worker kept"


async def test_what_an_earlier_run_left_on_the_broker_is_no_loss(mosquitto: Mosquitto) -> None:
    """Births and deaths retained by an earlier run (or a forger): no verdict, no loss. A worker
    born while the engine listens and then silent is the yardstick: by its conviction, any of
    the earlier run's would have been convicted too."""
    topics = Topics("bounded-b")
    old = _epoch() - 3_600_000_000
    junk = []
    for i in range(30):
        junk.append((topics.worker(f"old{i}", "birth"), encode(Birth(worker=f"old{i}", epoch=old)), True))
        junk.append((topics.worker(f"old{i}", "death"), encode(Death(worker=f"old{i}", epoch=old,
                                                                     graceful=i % 2 == 0)), True))
        junk.append((topics.worker(f"stale{i}", "birth"), encode(Birth(worker=f"stale{i}", epoch=old)), True))
        junk.append((topics.worker(f"gone{i}", "death"), encode(Death(worker=f"gone{i}", epoch=old)), True))
    await _publish(mosquitto.address, junk)
    monitor = MonitorConfig(grace_s=0.5, backstop_s=1.0)
    with EngineThread(slow_spec(name="bounded-b"), mosquitto.address, monitor=monitor) as eng:
        plane = _plane(eng)
        await _until(lambda: plane.dropped.counts().get("unborn", 0) >= 30, 20, "the earlier run's deaths read")
        await _publish(mosquitto.address, [(topics.worker("probe", "birth"),
                                            encode(Birth(worker="probe", epoch=_epoch())), False)])
        await _until(lambda: "probe" in plane.workers_lost(), 20, "the probe convicted for its silence")
        states = {v.worker_id: v.state for v in plane.workers}
        earlier = [wid for wid in states if wid.startswith(("old", "stale", "gone"))]
        assert sorted(earlier) == sorted([f"old{i}" for i in range(30)] + [f"stale{i}" for i in range(30)])
        assert {states[f"old{i}"] for i in range(30)} == {WorkerState.DEAD}
        assert {states[f"stale{i}"] for i in range(30)} == {WorkerState.STALE}
        assert not any(v.worker_id.startswith(("old", "stale", "gone")) for v in list(plane.verdicts))
        assert not any(wid.startswith(("old", "stale", "gone")) for wid in plane.workers_lost())
        assert plane.dropped.counts()["unborn"] == 30


async def test_the_next_engine_on_the_broker_counts_none_of_the_last_ones_workers_lost(mosquitto: Mosquitto) -> None:
    """The first engine convicts ghosts (their births and the deaths it told them stay retained) and
    says goodbye for its own worker; the next one, on the same broker and pipeline, loses none of
    them, its own worker (the same id) included."""
    topics = Topics("bounded-e")
    ghosts = {f"ghost{i}" for i in range(20)}
    told = {topics.worker(g, "death") for g in ghosts}
    with EngineThread(slow_spec(name="bounded-e"), mosquitto.address, monitor=MonitorConfig(grace_s=0.2)) as first:
        plane = _plane(first)
        await _until(plane.connected.is_set, 20, "the plane connected")
        async with _listening(mosquitto.address, topics.every_worker("death")) as seen:
            await _publish(mosquitto.address, [(topics.worker(g, "birth"), encode(Birth(worker=g, epoch=_epoch())),
                                                True) for g in sorted(ghosts)])
            await _until(lambda: told <= {t for t, p in seen if p}, 20, "the ghosts convicted and told")
        assert first.engine is not None
        goodbyes = {topics.worker(wid, "death") for wid in first.engine.worker_ids}
    left = await _retained(mosquitto.address, topics.every_worker("death"))
    assert told | goodbyes <= set(left), "the first engine's deaths and its own worker's goodbye retained"
    with EngineThread(slow_spec(name="bounded-e"), mosquitto.address, monitor=MonitorConfig(grace_s=0.2)) as second:
        plane = _plane(second)
        await _until(plane.connected.is_set, 20, "the plane connected")
        await _publish(mosquitto.address, [(topics.worker("probe", "birth"),
                                            encode(Birth(worker="probe", epoch=_epoch())), False)])
        await _until(lambda: "probe" in plane.workers_lost(), 20, "the probe convicted for its silence")
        assert plane.workers_lost() == ["probe"]
        assert second.engine is not None
        assert {second.state_of(wid) for wid in second.engine.worker_ids} == {"online"}


async def test_a_reborn_workers_retained_death_is_cleared(mosquitto: Mosquitto) -> None:
    topics = Topics("bounded-c")
    death_topic = topics.worker("w1", "death")
    e1 = _epoch()
    with EngineThread(slow_spec(name="bounded-c"), mosquitto.address, monitor=MonitorConfig(grace_s=0.5)) as eng:
        plane = _plane(eng)
        await _until(plane.connected.is_set, 20, "the plane connected")
        async with _listening(mosquitto.address, death_topic) as seen:
            beats = [(topics.worker("w1", "hb"),
                      encode(Heartbeat(worker="w1", epoch=e1, seq=i, progress=0, t=time.time())), False)
                     for i in range(3)]
            await _publish(mosquitto.address, [(topics.worker("w1", "birth"), encode(Birth(worker="w1", epoch=e1)),
                                                True), *beats])
            await _until(lambda: any(p for _, p in seen), 20, "a retained death published for the silent worker")
            death = decode(next(p for _, p in seen if p), frozenset(("death",)))
            assert isinstance(death, Death) and death.epoch == e1 and not death.graceful
            assert death_topic in await _retained(mosquitto.address, death_topic)
            reborn = Birth(worker="w1", epoch=_epoch(), interval_s=30.0)  # not silent again for minutes
            await _publish(mosquitto.address, [(topics.worker("w1", "birth"), encode(reborn), True)])
            await _until(lambda: seen[-1][1] == b"", 20, "the death cleared once the worker is born again")
        assert death_topic not in await _retained(mosquitto.address, death_topic)
        assert plane.monitor.epoch_of("w1") == reborn.epoch


async def test_ghosts_convicted_for_silence_leave_no_retained_death_once_forgotten(mosquitto: Mosquitto) -> None:
    topics = Topics("bounded-d")
    ghosts = [f"ghost{i}" for i in range(20)]
    monitor = MonitorConfig(grace_s=0.2, forget_after_s=1.0)
    with EngineThread(slow_spec(name="bounded-d"), mosquitto.address, monitor=monitor) as eng:
        plane = _plane(eng)
        await _until(plane.connected.is_set, 20, "the plane connected")
        async with _listening(mosquitto.address, topics.every_worker("death")) as seen:
            await _publish(mosquitto.address, [(topics.worker(g, "birth"), encode(Birth(worker=g, epoch=_epoch())),
                                                True) for g in ghosts])

            def told(payload: Callable[[bytes], bool]) -> set[str]:
                return {t for t, p in seen if payload(p)}

            every = {topics.worker(g, "death") for g in ghosts}
            await _until(lambda: told(bool) >= every, 20, "each ghost told it is convicted")
            await _until(lambda: told(lambda p: not p) >= every, 20, "each ghost's death cleared once forgotten")
        assert plane.monitor.counters.forgotten >= len(ghosts)
        assert not set(await _retained(mosquitto.address, topics.every_worker("death"))) & every

        def shown() -> list[str]:
            snap = eng.snapshot()
            return ["?"] if snap is None else [w.id for w in snap.workers if w.id.startswith("ghost")]

        await _until(lambda: not shown(), 10, "forgotten ghosts gone from the snapshot")
