"""The attached room's link meter, with its clocks in the test's hands: rates over the window,
lag against the send time, ``behind`` free of a clock difference, frames lost, silence."""

from __future__ import annotations

import pytest

from warpdeck.engine.control.link_meter import LinkMeter

SKEW = 3.0  # this machine's clock runs 3 s ahead of the engine's


def _steady(meter: LinkMeter, frames: int, *, size: int = 4000, delay: float = 0.05, start: int = 0) -> float:
    """``frames`` frames at 4 Hz, each ``delay`` on the way; returns the monotonic time of the last."""
    mono = 0.0
    for i in range(start, start + frames):
        sent = 1_000.0 + i / 4
        mono = 100.0 + i / 4 + delay
        meter.on_frame(size, sent, i, mono, sent + delay + SKEW)
    return mono


def test_a_steady_link_shows_its_rates_and_lag() -> None:
    meter = LinkMeter()
    now = _steady(meter, 40)
    v = meter.view(now, connected=True)
    assert v.frames_s == pytest.approx(4.0) and v.bytes_s == pytest.approx(16_000.0)
    assert v.lag_s == pytest.approx(0.05 + SKEW)  # the clock difference is in the lag...
    assert v.behind_s == pytest.approx(0.0)  # ...and not in how far behind the frames run
    assert (v.lost, v.silent_s, v.connected) == (0, 0.0, True)


def test_frames_that_queue_on_the_way_show_as_behind() -> None:
    meter = LinkMeter()
    _steady(meter, 20)
    now = 0.0
    for i in range(20, 28):  # the link falls behind: each frame 0.25 s later than the one before
        sent = 1_000.0 + i / 4
        now = 100.0 + i / 4 + 0.05 + (i - 19) * 0.25
        meter.on_frame(4000, sent, i, now, sent + 0.05 + (i - 19) * 0.25 + SKEW)
    v = meter.view(now, connected=True)
    assert v.behind_s == pytest.approx(8 * 0.25)


def test_gaps_in_frame_numbers_are_lost_frames_and_a_restart_is_not() -> None:
    meter = LinkMeter()
    for frame in (0, 1, 2, 5, 6, 0, 1, 3):  # 3 and 4 lost; the engine's plane restarts; 2 lost
        meter.on_frame(100, 0.0, frame, 1.0 + frame, 1.0)
    assert meter.view(10.0, connected=True).lost == 3


def test_a_quiet_link_decays_and_says_how_long_it_has_been_silent() -> None:
    meter = LinkMeter(window_s=5.0)
    last = _steady(meter, 40)
    assert meter.view(last + 2.0, connected=True).frames_s < 4.0
    quiet = meter.view(last + 7.0, connected=False)
    assert quiet.frames_s == 0.0 and quiet.bytes_s == 0.0
    assert quiet.silent_s == pytest.approx(7.0) and not quiet.connected


def test_before_any_frame_nothing_is_claimed() -> None:
    v = LinkMeter().view(5.0, connected=True)
    assert (v.lag_s, v.silent_s, v.frames_s, v.bytes_s, v.lost) == (None, None, 0.0, 0.0, 0)
