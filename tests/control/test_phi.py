"""The phi-accrual detector (engine/control/phi.py), on a fake clock: times are passed in."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpdeck.engine.control.phi import PhiAccrual, phi_of_sigmas, sigmas_for_phi


def steady(accrual: PhiAccrual, beats: int, interval: float = 0.5, start: float = 0.0) -> float:
    """Feed ``beats`` heartbeats ``interval`` apart; return the time of the last."""
    t = start
    for i in range(beats):
        t = start + i * interval
        accrual.heartbeat(t)
    return t


def test_no_suspicion_before_the_first_heartbeat() -> None:
    assert PhiAccrual().phi(1_000.0) == 0.0


def test_bootstrap_assumes_the_configured_interval_until_three_samples() -> None:
    accrual = PhiAccrual(interval_s=0.5, min_std_s=0.1)
    steady(accrual, 3, interval=2.0)  # two intervals of 2 s: not yet trusted
    assert accrual.mean_std() == (0.5, 0.125)
    accrual.heartbeat(6.0)
    assert accrual.mean_std() == (2.0, 0.1)


def test_bootstrap_std_is_floored_by_min_std() -> None:
    assert PhiAccrual(interval_s=0.2, min_std_s=0.1).mean_std() == (0.2, 0.1)


def test_phi_at_the_expected_arrival_is_log10_of_two() -> None:
    accrual = PhiAccrual(acceptable_pause_s=0.25)
    last = steady(accrual, 20)
    assert accrual.phi(last + 0.5 + 0.25) == pytest.approx(math.log10(2), abs=1e-3)


def test_min_std_alone_convicts_a_one_second_gap_at_half_second_heartbeats() -> None:
    """What really happens without an acceptable pause: phi 8 is crossed at 1.02 s of silence, so a
    1 s pause on top of the interval (a 1.5 s gap) reads as phi 38. The monitor adds a margin."""
    accrual = PhiAccrual(interval_s=0.5, min_std_s=0.1)
    last = steady(accrual, 40)
    assert accrual.phi(last + 1.0) == pytest.approx(7.30, abs=0.01)
    assert accrual.phi(last + 1.5) > 30
    assert accrual.silence_for(8.0) == pytest.approx(1.023, abs=1e-3)


def test_phi_grows_with_silence() -> None:
    accrual = PhiAccrual()
    last = steady(accrual, 20)
    values = [accrual.phi(last + s / 10) for s in range(100)]
    assert values == sorted(values)
    assert values[-1] > 1_000


@pytest.mark.parametrize("silence", [-1e12, -5.0, 0.0, 1e6, 1e300, math.inf])
def test_phi_is_finite_for_any_silence(silence: float) -> None:
    accrual = PhiAccrual()
    steady(accrual, 10)
    assert 0.0 <= accrual.phi_after(silence) < math.inf


@given(st.floats(min_value=0.001, max_value=3_000))
def test_sigmas_for_phi_inverts_phi(phi: float) -> None:
    assert phi_of_sigmas(sigmas_for_phi(phi)) == pytest.approx(phi, rel=1e-9)


def test_sigmas_for_phi_rejects_zero() -> None:
    with pytest.raises(ValueError, match="positive"):
        sigmas_for_phi(0.0)


def test_silence_for_is_where_phi_reaches_the_value() -> None:
    accrual = PhiAccrual(acceptable_pause_s=0.75)
    last = steady(accrual, 50)
    assert accrual.phi(last + accrual.silence_for(8.0)) == pytest.approx(8.0, rel=1e-9)


def test_window_is_bounded_and_its_running_sums_do_not_drift() -> None:
    rng = random.Random(7)
    accrual = PhiAccrual(window=100)
    t, intervals = 0.0, []
    for _ in range(25_000):
        step = rng.uniform(0.2, 0.9) if rng.random() < 0.99 else rng.uniform(5, 50)
        t += step
        intervals.append(step)
        accrual.heartbeat(t)
    assert accrual.samples == 100
    mean, std = accrual.mean_std()
    recent = intervals[-100:]
    assert mean == pytest.approx(statistics.fmean(recent), rel=1e-9)
    assert std == pytest.approx(max(statistics.pstdev(recent), 0.1), rel=1e-6)


def test_unsampled_heartbeat_restarts_the_clock_without_learning() -> None:
    accrual = PhiAccrual()
    last = steady(accrual, 10)
    before = accrual.mean_std()
    accrual.heartbeat(last + 60.0, sample=False)
    assert accrual.mean_std() == before
    assert accrual.phi(last + 60.0) < 0.01


def test_reset_forgets_the_rhythm() -> None:
    accrual = PhiAccrual()
    steady(accrual, 10, interval=2.0)
    accrual.reset()
    assert accrual.samples == 0
    assert accrual.last_arrival is None
    assert accrual.mean_std() == (0.5, 0.125)


@pytest.mark.parametrize(
    "kwargs",
    [{"interval_s": 0}, {"min_std_s": -1}, {"acceptable_pause_s": -0.1}, {"min_samples": 0}, {"window": 2}],
)
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PhiAccrual(**kwargs)  # type: ignore[arg-type]
