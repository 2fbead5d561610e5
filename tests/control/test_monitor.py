"""The worker monitor's verdicts (engine/control/monitor.py), on a fake clock.

Controlling time is the point here: every event and every ``tick`` is given its ``now``, and the
helper below interleaves heartbeats with ticks at 20 Hz, the rate the MQTT side calls it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import MonitorConfig, Verdict, VerdictKind, WorkerStatus
from warpdeck.engine.state.part_views import WorkerState

TICK = 0.05


class Sim:
    """A monitor, a fake clock, and the verdicts so far."""

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.m = WorkerMonitor(config)
        self.t = 0.0
        self.verdicts: list[Verdict] = []
        self.seq: dict[str, int] = {}
        self.max_phi: dict[str, float] = {}

    def birth(self, wid: str, epoch: int = 1, interval_s: float | None = None, **info: object) -> None:
        self.m.on_birth(wid, epoch, self.t, info, interval_s=interval_s)
        self.seq[wid] = 0

    def beat(self, wid: str, epoch: int = 1, progress: int = 0, busy: bool = False) -> None:
        seq = self.seq.get(wid, 0)
        self.m.on_heartbeat(wid, epoch, seq % 256, progress, self.t, busy)
        self.seq[wid] = seq + 1

    def run(self, until: float, beats: Iterable[tuple[float, str]] = (), epoch: int = 1) -> None:
        """Heartbeats at the given times, ticks every 50 ms, up to ``until``."""
        pending = sorted(beats)
        i = 0
        next_tick = math.floor(self.t / TICK + 1) * TICK
        while True:
            if i < len(pending) and pending[i][0] <= min(next_tick, until):
                self.t = pending[i][0]
                self.beat(pending[i][1], epoch)
                i += 1
            elif next_tick <= until:
                self.t = next_tick
                self.verdicts += self.m.tick(self.t)
                for v in self.m.views(self.t):
                    self.max_phi[v.worker_id] = max(self.max_phi.get(v.worker_id, 0.0), v.phi)
                next_tick += TICK
            else:
                break
        self.t = until

    def view(self, wid: str) -> WorkerStatus:
        (v,) = [v for v in self.m.views(self.t) if v.worker_id == wid]
        return v

    def dead(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.kind is VerdictKind.DEAD]


def steady(
    wid: str, start: float, end: float, interval: float = 0.5, jitter: float = 0.0, seed: int = 0, pause_every: int = 0
) -> list[tuple[float, str]]:
    """Heartbeat times: ``interval`` ± ``jitter`` (a fraction), a 1 s pause added every ``pause_every``."""
    rng = random.Random(seed)
    out, t, n = [], start, 0
    while t < end:
        out.append((t, wid))
        n += 1
        t += interval * (1 + rng.uniform(-jitter, jitter))
        if pause_every and n % pause_every == 0:
            t += 1.0
    return out


# -- silence ----------------------------------------------------------------------------------------
def test_steady_heartbeats_never_convict() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(120.0, steady("w", 0.0, 120.0))
    assert sim.verdicts == []
    assert sim.view("w").state is WorkerState.ONLINE
    assert sim.max_phi["w"] < 0.01


@pytest.mark.parametrize("seed", range(5))
def test_jitter_and_one_second_pauses_never_convict(seed: int) -> None:
    """±30 % jitter and a 1 s pause every 20 heartbeats: the gap after a pause is 1.35-1.65 s."""
    sim = Sim()
    sim.birth("w")
    sim.run(300.0, steady("w", 0.0, 300.0, jitter=0.3, seed=seed, pause_every=20))
    assert sim.verdicts == []
    assert sim.max_phi["w"] < sim.m.config.phi_threshold


def test_frozen_worker_is_convicted_by_phi_within_three_seconds() -> None:
    sim = Sim()
    sim.birth("w")
    beats = steady("w", 0.0, 10.0)
    sim.run(20.0, beats)
    (v,) = sim.verdicts
    last = beats[-1][0]
    assert (v.kind, v.reason, v.epoch) == (VerdictKind.DEAD, "silent", 1)
    assert v.phi >= 8.0
    assert v.silence_s is not None
    assert v.silence_s < sim.m.config.backstop_s  # phi got there first
    assert 1.5 < v.at - last <= 3.0
    assert sim.view("w").state is WorkerState.DEAD


def test_backstop_convicts_a_worker_whose_window_learned_erratic_intervals() -> None:
    """Intervals alternating 0.1 s and 1.5 s give a 0.7 s deviation: phi would wait ~5 s."""
    sim = Sim()
    sim.birth("w")
    times, t = [], 0.0
    for i in range(40):
        times.append((t, "w"))
        t += 0.1 if i % 2 else 1.5
    sim.run(40.0, times)
    (v,) = sim.verdicts
    assert v.reason == "silent"
    assert v.phi < 8.0
    assert v.silence_s is not None
    assert 2.5 <= v.silence_s < 2.5 + TICK + 1e-9


def test_a_birth_never_followed_by_heartbeats_is_convicted() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(5.0)
    (v,) = sim.verdicts
    assert v.reason == "silent"
    assert v.at <= 2.5 + TICK


def test_late_before_dead() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(10.0, steady("w", 0.0, 10.0))
    last = 9.5
    sim.run(last + 1.7)  # phi between late (3) and the threshold (8)
    assert sim.verdicts == []
    assert sim.view("w").state is WorkerState.LATE


def test_a_slower_promised_interval_is_honoured() -> None:
    sim = Sim()
    sim.birth("w", interval_s=2.0)
    sim.run(60.0, steady("w", 0.0, 60.0, interval=2.0, jitter=0.2))
    assert sim.verdicts == []


# -- deaths and epochs ------------------------------------------------------------------------------
@pytest.mark.parametrize(("graceful", "reason"), [(False, "will"), (True, "graceful")])
def test_death_convicts_at_once(graceful: bool, reason: str) -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(3.0, steady("w", 0.0, 3.0))
    sim.m.on_death("w", 1, sim.t, graceful)
    (v,) = sim.m.tick(sim.t)
    assert (v.kind, v.reason, v.at, v.epoch) == (VerdictKind.DEAD, reason, sim.t, 1)
    assert sim.view("w").state is WorkerState.DEAD
    assert sim.view("w").convicted_at == sim.t


def test_each_epoch_is_convicted_once() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(10.0, steady("w", 0.0, 5.0))
    sim.m.on_death("w", 1, sim.t, False)
    sim.beat("w")  # a frozen process that woke up
    sim.run(20.0)
    assert len(sim.verdicts) == 1
    assert sim.m.counters.after_conviction == 1
    assert sim.view("w").state is WorkerState.DEAD


def test_older_epoch_messages_are_ignored_and_counted() -> None:
    sim = Sim()
    sim.birth("w", epoch=5)
    sim.run(2.0, steady("w", 0.0, 2.0), epoch=5)
    sim.m.on_birth("w", 4, sim.t)
    sim.m.on_heartbeat("w", 4, 0, 0, sim.t, False)
    sim.m.on_death("w", 3, sim.t, False)
    assert sim.m.tick(sim.t) == []
    assert sim.m.counters.stale_epoch == 3
    assert sim.view("w").epoch == 5
    assert sim.view("w").state is WorkerState.ONLINE


def test_rebirth_with_a_new_epoch_brings_a_dead_worker_back() -> None:
    sim = Sim()
    sim.birth("w", epoch=1)
    sim.run(10.0, steady("w", 0.0, 5.0))
    assert [v.reason for v in sim.verdicts] == ["silent"]
    sim.birth("w", epoch=2, host="gpu-1")
    sim.run(20.0, steady("w", 10.0, 20.0), epoch=2)
    assert [(v.kind, v.reason, v.epoch) for v in sim.verdicts[1:]] == [(VerdictKind.RECOVERED, "rebirth", 2)]
    view = sim.view("w")
    assert (view.state, view.epoch, view.convicted_at, view.info) == (WorkerState.ONLINE, 2, None, {"host": "gpu-1"})
    sim.run(30.0)  # the new epoch can be convicted in turn
    assert [(v.kind, v.epoch) for v in sim.verdicts[2:]] == [(VerdictKind.DEAD, 2)]


def test_a_redelivered_birth_of_the_same_epoch_is_no_sign_of_life() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(5.0, steady("w", 0.0, 5.0))
    for t in (5.5, 6.0, 6.5, 7.0):
        sim.run(t)
        sim.m.on_birth("w", 1, sim.t, {"host": "x"})
    assert [v.reason for v in sim.verdicts] == ["silent"]
    assert sim.verdicts[0].at <= 4.5 + 2.5 + TICK


def test_a_heartbeat_from_a_newer_epoch_stands_in_for_its_birth() -> None:
    sim = Sim()
    sim.birth("w", epoch=1)
    sim.run(2.0, steady("w", 0.0, 2.0))
    sim.run(4.0, steady("w", 2.0, 4.0), epoch=2)
    sim.m.on_birth("w", 2, sim.t, {"pid": 42})  # the birth, late
    view = sim.view("w")
    assert (view.epoch, view.state, view.info) == (2, WorkerState.ONLINE, {"pid": 42})
    assert sim.verdicts == []


# -- the monitor's own connection -------------------------------------------------------------------
def test_while_disconnected_nobody_is_convicted_and_all_living_workers_are_stale() -> None:
    sim = Sim()
    for wid in ("a", "b", "c"):
        sim.birth(wid)
    sim.run(5.0, steady("a", 0.0, 5.0) + steady("b", 0.0, 5.0) + steady("c", 0.0, 5.0))
    sim.m.on_death("c", 1, sim.t, False)
    sim.m.on_connection(False, sim.t)
    sim.run(40.0)
    assert [(v.worker_id, v.reason) for v in sim.verdicts] == [("c", "will")]
    states = {v.worker_id: v.state for v in sim.m.views(sim.t)}
    assert states == {"a": WorkerState.STALE, "b": WorkerState.STALE, "c": WorkerState.DEAD}


def test_rebirths_within_the_grace_period_convict_nobody() -> None:
    sim = Sim()
    for wid in ("a", "b"):
        sim.birth(wid)
    sim.run(5.0, steady("a", 0.0, 5.0) + steady("b", 0.0, 5.0))
    sim.m.on_connection(False, sim.t)
    sim.run(35.0)
    sim.m.on_connection(True, sim.t)
    assert {v.state for v in sim.m.views(sim.t)} == {WorkerState.STALE}
    sim.run(36.0)
    sim.birth("a", epoch=2)
    sim.run(37.5, steady("a", 36.0, 37.5), epoch=2)
    sim.birth("b", epoch=2)
    sim.run(60.0, steady("a", 37.5, 60.0) + steady("b", 37.5, 60.0), epoch=2)
    assert sim.verdicts == []
    assert {v.state for v in sim.m.views(sim.t)} == {WorkerState.ONLINE}


def test_without_rebirth_a_worker_is_convicted_after_grace_and_within_the_backstop() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(5.0, steady("w", 0.0, 5.0))
    sim.m.on_connection(False, sim.t)
    sim.run(35.0)
    sim.m.on_connection(True, sim.t)
    cfg = sim.m.config
    sim.run(35.0 + cfg.grace_s - TICK)
    assert sim.verdicts == []
    sim.run(35.0 + cfg.grace_s + cfg.backstop_s + TICK)
    (v,) = sim.verdicts
    assert v.reason == "silent"
    assert 35.0 + cfg.grace_s <= v.at <= 35.0 + cfg.grace_s + cfg.backstop_s + TICK


def test_a_worker_that_kept_its_epoch_is_not_judged_by_the_interval_spanning_the_outage() -> None:
    sim = Sim()
    sim.birth("w")
    sim.run(5.0, steady("w", 0.0, 5.0))
    sim.m.on_connection(False, sim.t)
    sim.run(35.0)
    sim.m.on_connection(True, sim.t)
    sim.run(60.0, steady("w", 35.2, 50.0))
    (v,) = sim.verdicts
    assert v.phi >= 8.0  # convicted by phi: a learned 30 s interval would have left it to the backstop
    assert v.silence_s is not None
    assert v.silence_s < sim.m.config.backstop_s
    assert sim.m.counters.missed_heartbeats == 0  # no gap counted across the outage


# -- stuck work -------------------------------------------------------------------------------------
def feed(sim: Sim, until: float, progress: int, busy: bool) -> None:
    """Heartbeats every 0.5 s with fixed progress and busy flag, ticking in between."""
    while sim.t + 0.5 <= until + 1e-9:
        sim.run(sim.t + 0.5)
        sim.beat("w", progress=progress, busy=busy)


def test_busy_with_frozen_progress_hangs_once_then_recovers_when_progress_moves() -> None:
    sim = Sim()
    sim.birth("w")
    sim.m.set_deadline("w", 5.0)
    feed(sim, 3.0, progress=0, busy=True)
    feed(sim, 6.0, progress=1, busy=True)  # progress moved at 3.5 s
    feed(sim, 8.0, progress=1, busy=True)
    assert sim.verdicts == []
    feed(sim, 20.0, progress=1, busy=True)
    assert [(v.kind, v.reason) for v in sim.verdicts] == [(VerdictKind.HUNG, "stuck")]
    assert 8.5 <= sim.verdicts[0].at <= 8.5 + 0.5 + TICK
    assert sim.view("w").state is WorkerState.HUNG
    feed(sim, 20.5, progress=2, busy=True)
    sim.run(sim.t + TICK)  # verdicts from events come out of the next tick
    assert [(v.kind, v.reason) for v in sim.verdicts[1:]] == [(VerdictKind.RECOVERED, "progress")]
    assert sim.view("w").state is WorkerState.ONLINE


def test_an_idle_worker_is_never_hung() -> None:
    sim = Sim()
    sim.birth("w")
    sim.m.set_deadline("w", 1.0)
    feed(sim, 30.0, progress=7, busy=False)
    assert sim.verdicts == []


def test_the_stuck_clock_starts_when_work_is_taken_up() -> None:
    sim = Sim()
    sim.birth("w")
    sim.m.set_deadline("w", 5.0)
    feed(sim, 30.0, progress=7, busy=False)
    feed(sim, 34.0, progress=7, busy=True)
    assert sim.verdicts == []
    feed(sim, 40.0, progress=7, busy=True)
    assert [v.kind for v in sim.verdicts] == [VerdictKind.HUNG]


def test_hung_ends_when_the_work_is_gone() -> None:
    sim = Sim()
    sim.birth("w")
    sim.m.set_deadline("w", 2.0)
    feed(sim, 5.0, progress=0, busy=True)
    feed(sim, 6.0, progress=0, busy=False)
    assert [(v.kind, v.reason) for v in sim.verdicts] == [(VerdictKind.HUNG, "stuck"), (VerdictKind.RECOVERED, "idle")]


def test_default_stuck_deadline_applies_until_one_is_set() -> None:
    sim = Sim(MonitorConfig(stuck_after_s=4.0))
    sim.birth("w")
    sim.m.set_deadline("w", 100.0)
    feed(sim, 10.0, progress=0, busy=True)
    assert sim.verdicts == []
    sim.m.set_deadline("w", None)
    feed(sim, 11.0, progress=0, busy=True)
    assert [v.kind for v in sim.verdicts] == [VerdictKind.HUNG]


def test_a_non_positive_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        WorkerMonitor().set_deadline("w", 0.0)


# -- operator, sequence numbers, config -------------------------------------------------------------
def test_quarantine_survives_death_and_rebirth_until_released() -> None:
    sim = Sim()
    sim.m.quarantine("w")  # before the worker is known
    sim.birth("w")
    sim.run(2.0, steady("w", 0.0, 2.0))
    assert sim.view("w").state is WorkerState.QUARANTINED
    sim.m.on_death("w", 1, sim.t, False)
    sim.birth("w", epoch=2)
    assert sim.view("w").state is WorkerState.QUARANTINED
    sim.m.release("w")
    assert sim.view("w").state is WorkerState.ONLINE
    sim.m.release("nobody")


def test_sequence_numbers_wrap_and_gaps_count_missed_heartbeats() -> None:
    m = WorkerMonitor()
    m.on_birth("w", 1, 0.0)
    t = 0.0
    for seq in (250, 251, 252, 253, 254, 255, 0, 1, 2, 2, 5, 255, 1):
        t += 0.5
        m.on_heartbeat("w", 1, seq, 0, t, False)
    # 2 -> 5 misses 3 and 4; 5 -> 255 misses 249; 255 -> 1 misses 0. The repeated 2 is a duplicate.
    assert m.counters.missed_heartbeats == 2 + 249 + 1
    assert m.counters.duplicate_heartbeats == 1
    (view,) = m.views(t)
    assert (view.last_seq, view.missed_heartbeats) == (1, 252)


def test_views_carry_the_birth_and_the_last_heartbeat() -> None:
    sim = Sim()
    sim.birth("w", host="gpu-3", lanes=2)
    first = sim.view("w")
    assert (first.heartbeat_age_s, first.progress, first.last_seq, first.busy) == (None, None, None, False)
    sim.run(1.0)
    sim.beat("w", progress=12, busy=True)
    sim.run(1.25)
    view = sim.view("w")
    assert view.info == {"host": "gpu-3", "lanes": 2}
    assert view.heartbeat_age_s == pytest.approx(0.25)
    assert (view.progress, view.busy, view.last_seq) == (12, True, 0)


@pytest.mark.parametrize("bad", [{"late_phi": 9.0}, {"backstop_s": 0.4}, {"min_samples": 500}, {"grace_s": -1}])
def test_config_refuses_contradictions(bad: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        MonitorConfig.model_validate(bad)


# -- any sequence of events -------------------------------------------------------------------------
_WORKERS = st.sampled_from(["a", "b", "c"])
_EPOCHS = st.integers(0, 3)
_EVENTS = st.one_of(
    st.tuples(st.just("birth"), _WORKERS, _EPOCHS),
    st.tuples(st.just("hb"), _WORKERS, _EPOCHS, st.integers(0, 255), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("death"), _WORKERS, _EPOCHS, st.booleans()),
    st.tuples(st.just("connection"), st.booleans()),
    st.tuples(st.just("quarantine"), _WORKERS, st.booleans()),
    st.tuples(st.just("deadline"), _WORKERS, st.sampled_from([None, 0.5, 2.0])),
    st.tuples(st.just("tick")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), _EVENTS), max_size=80))
def test_any_event_sequence_convicts_each_epoch_at_most_once(steps: list[tuple[float, tuple[object, ...]]]) -> None:
    m = WorkerMonitor()
    t = 0.0
    connected, grace_until = True, -math.inf
    verdicts: list[Verdict] = []

    def tick() -> None:
        for v in m.tick(t):
            if v.reason == "silent":
                assert connected
                assert t >= grace_until
            verdicts.append(v)

    for dt, event in steps:
        t += dt
        match event:
            case ("birth", str(wid), int(epoch)):
                m.on_birth(wid, epoch, t, {"n": epoch})
            case ("hb", str(wid), int(epoch), int(seq), int(progress), bool(busy)):
                m.on_heartbeat(wid, epoch, seq, progress, t, busy)
            case ("death", str(wid), int(epoch), bool(graceful)):
                m.on_death(wid, epoch, t, graceful)
            case ("connection", bool(up)):
                m.on_connection(up, t)
                if up:
                    grace_until = t + m.config.grace_s
                connected = up
            case ("quarantine", str(wid), bool(on)):
                (m.quarantine if on else m.release)(wid)
            case ("deadline", str(wid), seconds):
                m.set_deadline(wid, seconds if isinstance(seconds, float) else None)
            case _:
                tick()
        for view in m.views(t):
            assert 0.0 <= view.phi < math.inf
    t += 60.0
    tick()
    dead = [(v.worker_id, v.epoch) for v in verdicts if v.kind is VerdictKind.DEAD]
    assert len(dead) == len(set(dead))
