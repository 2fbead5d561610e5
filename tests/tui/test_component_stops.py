"""No silent component death (issue 29, item 3): when the control plane stops on an error mid-run,
the room says so at once on every screen, with where the traceback is, the log keeps the
traceback, the report says it, and the run goes on to the end.

The engine, its embedded broker and the room are real; the plane's failure is injected (its tick
raises what the heartbeat race raised), since a race cannot be made to lose on demand."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
from wd_screen import screen_text
from wd_tui import slow_spec, until

from warpdeck.engine.api import ControlSettings
from warpdeck.engine.control.plane import ControlPlane
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import EngineLink
from warpdeck.tui.widgets.alert_banner import AlertBanner


# The plane dies mid-connection, so the embedded broker's side of that connection is never closed
# in order: its streams are collected here (below), not in whichever test runs next.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_control_plane_that_dies_is_a_banner_at_once_and_a_traceback_in_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls = {"n": 0}
    real = ControlPlane._measure_lag

    def dies_on_the_fifth(self: ControlPlane, now: float) -> None:
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("deque mutated during iteration")
        real(self, now)

    monkeypatch.setattr(ControlPlane, "_measure_lag", dies_on_the_fifth)
    link = EngineLink(slow_spec(), tmp_path / "run", control=ControlSettings())
    app = WarpdeckApp(link, screenshot_dir=tmp_path, log_path=tmp_path / "run" / "warpdeck.log")
    with caplog.at_level(logging.ERROR, logger="warpdeck"):
        async with app.run_test(size=(150, 42)) as pilot:
            await until(pilot, lambda: app.snapshot is not None and app.snapshot.control is not None
                        and app.snapshot.control.stopped, 30)
            await until(pilot, lambda: any(b.display for b in app.screen.query(AlertBanner)))
            await until(pilot, lambda: "control plane stopped" in " ".join(screen_text(app)))  # drawn
            text = " ".join(line.strip() for line in screen_text(app))  # the banner wraps, never cuts
            assert "control plane stopped: RuntimeError: deque mutated during iteration" in text
            assert "warpdeck.log" in text and "the run goes on" in text
            await pilot.press("2")  # on every screen
            await until(pilot, lambda: app.screen.name == "workers" and any(
                b.display for b in app.screen.query(AlertBanner)))
            done = app.snapshot.counts.done
            await until(pilot, lambda: app.snapshot.counts.done > done)  # the run goes on
    gc.collect()
    stopped = [r for r in caplog.records if r.getMessage().startswith("control plane stopped")]
    assert stopped and stopped[0].exc_info is not None  # the traceback, not one line
