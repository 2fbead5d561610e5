"""A monitor whose own input runs behind convicts nobody for silence: the lag, measured with the
engine's own heartbeats (engine/control/lag.py), holds silence verdicts until the input catches up.

The unit tests drive ``InputLag`` and ``WorkerMonitor`` with an injected clock; the broker test
stops a real Mosquitto with SIGSTOP for longer than the phi budget, with and without the hold, so
it shows both what goes wrong and that the hold prevents it."""

from __future__ import annotations

import itertools
import signal
import sys
import threading
import time

import pytest
from wd_broker import Mosquitto
from wd_control import EngineThread, WorkerProcess, slow_spec, wait_for, workers

from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.heartbeat import Heartbeater
from warpdeck.engine.control.lag import InputLag
from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import MonitorConfig
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.state.part_views import WorkerState

# -- InputLag -------------------------------------------------------------------------------------


def test_nothing_sent_or_everything_heard_is_no_lag() -> None:
    lag = InputLag()
    assert lag.behind("w", (), 10.0) == 0.0
    lag.on_heard("w", 7, 3)
    assert lag.behind("w", ((7, 2, 8.0), (7, 3, 9.0)), 10.0) == 0.0


def test_the_oldest_unheard_heartbeat_measures_the_lag() -> None:
    lag = InputLag()
    sent = ((7, 1, 1.0), (7, 2, 1.5), (7, 3, 2.0), (7, 4, 2.5))
    assert lag.behind("w", sent, 3.0) == pytest.approx(2.0), "nothing heard yet: from the first"
    lag.on_heard("w", 7, 2)
    assert lag.behind("w", sent, 3.0) == pytest.approx(1.0)
    lag.on_heard("w", 7, 4)
    assert lag.behind("w", sent, 3.0) == 0.0


def test_a_lost_heartbeat_stops_counting_once_a_later_one_is_heard() -> None:
    lag = InputLag()
    lag.on_heard("w", 7, 3)  # seq 2 never came
    assert lag.behind("w", ((7, 1, 1.0), (7, 2, 1.5), (7, 3, 2.0)), 30.0) == 0.0


def test_only_the_newest_epoch_counts() -> None:
    lag = InputLag()
    lag.on_heard("w", 7, 200)
    sent = ((7, 201, 1.0), (8, 0, 5.0), (8, 1, 5.5))
    assert lag.behind("w", sent, 6.0) == pytest.approx(1.0), "epoch 7's leftover never comes"
    lag.on_heard("w", 8, 0)
    assert lag.behind("w", sent, 6.0) == pytest.approx(0.5)


def test_seq_wraps_inside_one_epoch() -> None:
    lag = InputLag()
    sent = ((7, 254, 1.0), (7, 255, 1.5), (7, 0, 2.0), (7, 1, 2.5))
    lag.on_heard("w", 7, 255)
    assert lag.behind("w", sent, 3.0) == pytest.approx(1.0)


def test_hold_and_resume_with_hysteresis() -> None:
    lag = InputLag(hold_s=1.0, resume_s=0.5)
    sent = [(1, 0, 0.0)]
    assert lag.update([("w", sent)], 0.9) is None
    change = lag.update([("w", sent)], 1.0)
    assert change is not None and change.holding and lag.holding and lag.holds == 1
    lag.on_heard("w", 1, 0)
    sent.append((1, 1, 1.5))
    assert lag.update([("w", sent)], 2.1) is None, "0.6 s behind: still above resume_s"
    lag.on_heard("w", 1, 1)
    change = lag.update([("w", sent)], 2.2)
    assert change is not None and not change.holding and not lag.holding
    assert lag.worst_s == pytest.approx(1.0)


def test_the_worst_probe_decides() -> None:
    lag = InputLag()
    lag.on_heard("a", 1, 0)
    change = lag.update([("a", [(1, 0, 0.0)]), ("b", [(1, 0, 0.0)])], 1.2)
    assert change is not None and change.holding and lag.lag_s == pytest.approx(1.2)


def test_a_hold_runs_out_and_needs_a_recovery_before_the_next() -> None:
    lag = InputLag(hold_s=1.0, resume_s=0.5, max_hold_s=10.0)
    lost = [(1, 0, 0.0)]  # never heard
    assert lag.update([("w", lost)], 1.0) is not None
    change = lag.update([("w", lost)], 11.0)
    assert change is not None and not change.holding, "a probe that never comes blinds nobody for good"
    assert lag.update([("w", lost)], 12.0) is None, "no new hold while the same lag goes on"
    lag.on_heard("w", 1, 0)
    assert lag.update([("w", lost)], 13.0) is None
    assert lag.update([("w", [*lost, (1, 1, 13.0)])], 14.5) is not None, "after a recovery it holds again"
    assert lag.holds == 2


def test_none_measures_but_never_holds() -> None:
    lag = InputLag(None)
    assert lag.update([("w", [(1, 0, 0.0)])], 30.0) is None
    assert lag.lag_s == pytest.approx(30.0) and lag.holds == 0


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="resume_s"):
        InputLag(hold_s=0.4, resume_s=0.5)


# -- WorkerMonitor.on_input_lag -------------------------------------------------------------------


def _steady(mon: WorkerMonitor, wid: str, until: float, start: float = 0.0) -> None:
    t, seq = start, 0
    while t <= until:
        mon.on_heartbeat(wid, 1, seq, 0, t, busy=False)
        t, seq = t + 0.5, (seq + 1) % 256


def test_the_time_the_input_lagged_is_nobodys_silence() -> None:
    mon = WorkerMonitor(MonitorConfig())
    mon.on_birth("w", 1, 0.0)
    _steady(mon, "w", 5.0)
    mon.on_input_lag(True, 5.9, since=5.2)  # noticed at 5.9: lagging since the probe left at 5.2
    assert mon.tick(8.0) == [], "2.5 s of silence while lagging is not evidence"
    view = mon.views(8.0)[0]
    assert view.state is WorkerState.ONLINE and view.phi < 1.0, "the lag is not shown as the worker's silence"
    mon.on_input_lag(False, 8.0)
    assert mon.lagging is False
    # Counted silence: 0.2 s before the lag, then from 8.0 on.
    assert mon.tick(9.3) == [], "1.5 s of counted silence is inside the phi budget"
    verdicts = mon.tick(9.7)
    assert [(v.worker_id, v.kind, v.reason) for v in verdicts] == [("w", "dead", "silent")], \
        "a worker still silent once the budget is spent outside the lag is convicted"
    assert verdicts[0].silence_s == pytest.approx(1.9)


def test_short_lags_over_and_over_only_slow_a_conviction_down() -> None:
    mon = WorkerMonitor(MonitorConfig())
    mon.on_birth("w", 1, 0.0)
    _steady(mon, "w", 5.0)  # then frozen
    t, convicted = 5.0, None
    while t < 12.0 and convicted is None:
        t = round(t + 0.05, 2)
        frac = (t - 5.0) % 1.0
        mon.on_input_lag(0.4 <= frac < 0.7, t, since=t)  # lagging 0.3 s of every second
        dead = [v for v in mon.tick(t) if v.kind == "dead"]
        convicted = dead[0] if dead else None
    assert convicted is not None and convicted.reason == "silent"
    assert 5.0 + 1.8 < convicted.at < 5.0 + 3.2, f"convicted at {convicted.at}"
    assert convicted.silence_s is not None and convicted.silence_s < convicted.at - 5.0


def test_a_will_convicts_even_while_the_input_lags() -> None:
    mon = WorkerMonitor(MonitorConfig())
    mon.on_birth("w", 1, 0.0)
    _steady(mon, "w", 2.0)
    mon.on_input_lag(True, 2.2)
    mon.on_death("w", 1, 2.3, graceful=False)
    assert [(v.kind, v.reason) for v in mon.tick(2.4)] == [("dead", "will")]


def test_heartbeats_heard_during_the_lag_keep_counting() -> None:
    mon = WorkerMonitor(MonitorConfig())
    mon.on_birth("w", 1, 0.0)
    _steady(mon, "w", 5.0)
    mon.on_input_lag(True, 5.5, since=5.1)
    _steady(mon, "w", 9.0, start=8.0)  # the backlog arrives
    mon.on_input_lag(False, 9.0)
    assert mon.tick(9.1) == []
    assert mon.views(9.1)[0].state is WorkerState.ONLINE


# -- a real broker, stopped ----------------------------------------------------------------------

STALL_S = 2.8  # past the backstop (2.5 s): without the hold, every worker is convicted


@pytest.mark.parametrize("hold", [0.5, None], ids=["hold", "no-hold"])
def test_a_stalled_broker_convicts_nobody(mosquitto: Mosquitto, hold: float | None) -> None:
    et = EngineThread(slow_spec(f"lag-{'on' if hold else 'off'}"), mosquitto.address)
    et.settings.input_lag_hold_s = hold
    with et, workers(WorkerProcess(mosquitto.url, "w-far", et.spec.name)):
        local = et.engine.worker_id
        wait_for(lambda: et.state_of("w-far") == "online" and et.state_of(local) == "online", 10, "online")
        time.sleep(1.5)  # the detectors learn the rhythm
        epochs = {w: et.worker(w).epoch for w in ("w-far", local)}
        assert mosquitto.proc is not None
        t0 = time.monotonic()
        mosquitto.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(STALL_S)
        finally:
            mosquitto.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: et.state_of("w-far") in ("online", "dead"), 5, "the worker heard again")
        plane = et.engine.control
        assert plane is not None

        def convicted() -> list[str]:
            return sorted({v.worker_id for v in list(plane.verdicts) if v.kind == "dead" and v.at >= t0})

        if hold is None:
            # Both convictions are events: wait for them rather than for a second to pass.
            wait_for(lambda: {"w-far", local} <= set(convicted()), 1.0, "both workers convicted")
            dead = convicted()
            assert "w-far" in dead and local in dead, "without the hold the stall convicts the innocent"
            assert plane.lag.holds == 0
            # Told of their conviction, the living workers are born again under new epochs, and
            # the engine's own worker takes work again.
            for w in ("w-far", local):
                wait_for(lambda w=w: et.state_of(w) == "online" and et.worker(w).epoch > epochs[w], 10, f"{w} reborn")
            assert plane.heartbeaters[local].rebirths >= 1
            done = et.snapshot().counts.done
            wait_for(lambda: et.snapshot().counts.done > done + 2, 10, "the reborn worker works")
        else:
            # A verdict not given has no event to wait on: give the caught-up monitor a quiet second.
            time.sleep(1.0)
            dead = convicted()
            lag = plane.lag
            assert dead == [], f"convicted while the broker, not the worker, was stopped: {list(plane.verdicts)} " \
                               f"(stall began at {t0:.3f}; lag holds {lag.holds}, worst {lag.worst_s:.2f} s)"
            assert plane.lag.holds >= 1 and plane.lag.worst_s >= 1.0, "the stall was seen as input lag"
            assert et.state_of("w-far") == "online" and et.state_of(local) == "online"
            assert {w: et.worker(w).epoch for w in epochs} == epochs, "the stall alone re-births nobody"
            view = plane.view()
            assert view.lag_holds == plane.lag.holds


# -- the outbox, read across threads ---------------------------------------------------------------


def test_the_outbox_is_read_whole_while_its_thread_appends() -> None:
    # A stress test of the heartbeat thread against the plane: the plane's lag measure used to
    # iterate the outbox while the heartbeat's thread appended to it ("deque mutated during
    # iteration"), which ended the control plane mid-run with one line in the log (issue 29).
    heart = Heartbeater(BrokerAddress("127.0.0.1", 1), Topics("stress"), "w")
    stop = threading.Event()

    def beat() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            heart.outbox.append((1, seq, time.monotonic()))

    writer = threading.Thread(target=beat, daemon=True)
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    writer.start()
    try:
        reads = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            sent = heart.sent_since(0.0)
            assert all(a[1] < b[1] for a, b in itertools.pairwise(sent)), "a copy of one moment, in order"
            reads += 1
    finally:
        stop.set()
        writer.join(5)
        sys.setswitchinterval(0.005)
    assert reads > 100
