"""The monitor's tick skips its scan of the workers until the earliest deadline (engine/control/monitor.py):
it gives exactly the verdicts, at exactly the ticks, of a monitor that scans every worker on every
tick, whatever the events in between (births, heartbeats moving or frozen, deaths, stuck deadlines
set and shortened, the broker lost and back, input lag)."""

from __future__ import annotations

import random

import pytest

from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import MonitorConfig, Verdict

TICK_S = 0.05
IDS = [f"w{i}" for i in range(12)]


def _events(seed: int, ticks: int) -> list[list[tuple[str, tuple[object, ...]]]]:
    """Per tick, the events before it: (method, args without ``now``)."""
    rng = random.Random(seed)
    epoch = dict.fromkeys(IDS, 1)
    seq = dict.fromkeys(IDS, 0)
    progress = dict.fromkeys(IDS, 0)
    silent: set[str] = set()
    out: list[list[tuple[str, tuple[object, ...]]]] = []
    for k in range(ticks):
        evs: list[tuple[str, tuple[object, ...]]] = []
        if k == 0:
            evs += [("on_birth", (wid, 1)) for wid in IDS]
        for wid in IDS:
            if wid in silent:
                if rng.random() < 0.01:  # thawed, or re-born
                    silent.discard(wid)
                    if rng.random() < 0.5:
                        epoch[wid] += 1
                        seq[wid] = 0
                        evs.append(("on_birth", (wid, epoch[wid])))
                continue
            if k % 10 == IDS.index(wid) % 10:  # a heartbeat every 0.5 s, phases spread
                seq[wid] = (seq[wid] + 1) % 256
                if rng.random() < 0.7:
                    progress[wid] += 1
                evs.append(("on_heartbeat", (wid, epoch[wid], seq[wid], progress[wid], rng.random() < 0.8)))
            r = rng.random()
            if r < 0.004:
                silent.add(wid)  # frozen
            elif r < 0.006:
                evs.append(("on_death", (wid, epoch[wid], rng.random() < 0.5)))
                silent.add(wid)
            elif r < 0.012:
                evs.append(("set_deadline", (wid, rng.choice((None, 0.2, 0.6, 1.5, 5.0)))))
        r = rng.random()
        if r < 0.004:
            evs.append(("on_connection", (False,)))
        elif r < 0.02:
            evs.append(("on_connection", (True,)))
        elif r < 0.03:
            evs.append(("on_input_lag", (rng.random() < 0.5,)))
        out.append(evs)
    return out


def _run(events: list[list[tuple[str, tuple[object, ...]]]], scan_every_tick: bool) -> list[tuple[int, Verdict]]:
    mon = WorkerMonitor(MonitorConfig(stuck_after_s=2.0))
    got: list[tuple[int, Verdict]] = []
    for k, evs in enumerate(events):
        now = k * TICK_S
        for name, args in evs:
            method = getattr(mon, name)
            if name in ("set_deadline",):
                method(*args)
            elif name == "on_heartbeat":
                wid, ep, sq, prog, busy = args
                method(wid, ep, sq, prog, now, busy=busy)
            elif name == "on_death":
                wid, ep, graceful = args
                method(wid, ep, now, graceful=graceful)
            else:
                method(*args, now)
        if scan_every_tick:
            mon._next_check = float("-inf")  # the reference: every tick scans every worker, as before the skip
        got += [(k, v) for v in mon.tick(now + 0.001)]
    return got


@pytest.mark.parametrize("seed", range(8))
def test_skipping_scans_changes_no_verdict(seed: int) -> None:
    events = _events(seed, 1200)  # a minute of ticks
    reference = _run(events, scan_every_tick=True)
    assert _run(events, scan_every_tick=False) == reference
    assert {v.kind for _, v in reference} >= {"dead", "hung"}, "the events should convict and hang some workers"


@pytest.mark.parametrize("comes_back_by", ["birth", "heartbeat"])
def test_a_worker_back_after_everyone_died_is_still_judged(comes_back_by: str) -> None:
    """With every worker dead a scan finds no deadline at all; the next one set must be watched."""
    mon = WorkerMonitor()
    mon.on_birth("w", 1, 0.0)
    mon.on_death("w", 1, 0.1, graceful=False)
    assert [v.reason for v in mon.tick(0.2)] == ["will"]
    if comes_back_by == "birth":
        mon.on_birth("w", 2, 0.3)
    else:
        mon.on_heartbeat("w", 2, 0, 0, 0.3, busy=False)
    verdicts = [v for k in range(1, 200) for v in mon.tick(0.3 + k * TICK_S)]
    dead = [v for v in verdicts if v.kind == "dead"]
    assert [(v.epoch, v.reason) for v in dead] == [(2, "silent")], verdicts
    assert dead[0].at <= 0.3 + mon.config.backstop_s + TICK_S
