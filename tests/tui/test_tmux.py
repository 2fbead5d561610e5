"""``warpdeck demo`` in a real terminal (tmux), driven by keys as a person would, read off the pane."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wd_tmux import TMUX_MARK, Pane

pytestmark = TMUX_MARK


def test_demo_driven_from_the_keyboard(tmp_path: Path) -> None:
    warpdeck = Path(sys.executable).parent / "warpdeck"
    pane = Pane(f"{warpdeck} demo --count 200000 --run-dir {tmp_path / 'run'}; echo EXIT=$?; sleep 30", tmp_path)
    try:
        pane.wait_for("● running")
        pane.assert_app_fills_the_pane()
        screen = pane.wait_for("compute")
        assert "queued" in screen and "stalled" in screen and "tasks/s" in screen
        pane.keys("p")
        pane.wait_for("paused")
        pane.keys("/")
        pane.wait_for("regex on the key")
        pane.keys("state:done", "Enter")
        pane.wait_for("filter /state:done/")
        pane.keys("?")
        help_screen = pane.wait_for("warpdeck keys")
        assert "Screens" in help_screen and "Board" in help_screen
        pane.keys("Escape")  # alone: ESC then a key at once would read as alt+key
        pane.wait_gone("warpdeck keys")
        pane.keys("2")
        # The demo's own worker heartbeats over the embedded broker: its age shows in ms.
        pane.wait_for("● online")
        end = time.monotonic() + 20  # until the monitor has heard its first heartbeats
        while not re.search(r"online\s+[\d,]+ ms", workers := pane.text()) and time.monotonic() < end:
            time.sleep(0.1)
        assert re.search(r"online\s+[\d,]+ ms", workers), workers
        pane.keys("3")
        pane.wait_for("overlap efficiency")
        pane.keys("q")
        pane.wait_for("Work is still running")
        pane.keys("y")
        final = pane.wait_for("EXIT=")
        assert "EXIT=4" in final  # quit with work left: stopped before the end (a resume finishes it)
        assert "demo-spectrogram: stopped" in final
    finally:
        pane.close()


def test_a_command_typed_in_one_burst_at_120x40(tmp_path: Path) -> None:
    """Issue 13's walk: `:depth 5⏎` sent in one go sets the depth and drains nothing; `:worker nope`
    answers; the board shows ids whole or shortened with an ellipsis, never cut."""
    warpdeck = Path(sys.executable).parent / "warpdeck"
    pane = Pane(f"{warpdeck} demo --count 200000 --run-dir {tmp_path / 'run'}; echo EXIT=$?; sleep 30", tmp_path,
                (120, 40))
    try:
        pane.wait_for("● running")
        pane.wait_for("compute")
        pane.keys(":depth 5", "Enter")  # one send-keys: the keys arrive in one burst
        pane.wait_for("slot depth 5")
        assert "Drain" not in pane.text()
        pane.keys(":worker nope", "Enter")
        pane.wait_for("no worker 'nope'")
        screen = pane.text()
        assert "● running" in screen and "drained" not in screen
        ids = re.findall(r"syn-[0-9…]+", screen)
        assert ids, screen
        for key in ids:  # whole (syn- and 8 digits) or shortened in the middle, keeping the tail
            assert re.fullmatch(r"syn-\d{8}|syn-\d*…\d+", key), (key, screen)
        pane.keys("q")
        pane.wait_for("Work is still running")
        pane.keys("y")
        pane.wait_for("EXIT=")
    finally:
        pane.close()


@pytest.mark.parametrize("sig", ["TERM", "HUP"])
def test_a_stop_signal_ends_the_room_as_a_quit_and_gives_the_terminal_back(tmp_path: Path, sig: str) -> None:
    """Issue 29: SIGTERM or SIGHUP to the control room ended it by Python's default (exit 143 or
    129, no report), the terminal left in the alternate screen with mouse reporting on and the
    cursor hidden. Now: the run stops as a confirmed quit stops it, exit 4 with its report, and the
    terminal is as it was."""
    warpdeck = Path(sys.executable).parent / "warpdeck"
    run_dir = tmp_path / f"run-{sig}"
    pane = Pane(f"{warpdeck} demo --count 200000 --run-dir {run_dir} --json report.json; echo EXIT=$?; sleep 30",
                tmp_path)
    try:
        pane.wait_for("● running")
        pane.wait_for("compute")
        assert pane.modes() == {"alternate": "1", "mouse": "1", "cursor": "0"}, "the app holds the terminal"
        os.kill(_room_pid(run_dir), getattr(signal, f"SIG{sig}"))
        final = pane.wait_for("EXIT=")
        assert "EXIT=4" in final, final
        assert pane.modes() == {"alternate": "0", "mouse": "0", "cursor": "1"}, "the terminal given back"
        report = json.loads((tmp_path / "report.json").read_text())
        assert (report["status"], report["stopped_by"]) == ("stopped", "signal")
    finally:
        pane.close()


def _room_pid(run_dir: Path) -> int:
    """The control room's own process (not the pane's shell, nor tmux, whose command lines hold the same words)."""
    found = subprocess.run(["pgrep", "-f", rf"python[0-9.]* \S*warpdeck demo --count 200000 --run-dir {run_dir}"],
                           capture_output=True, text=True, check=True)
    return int(found.stdout.split()[0])


def test_closing_the_terminal_stops_the_run_with_its_report(tmp_path: Path) -> None:
    """Issue 29: the terminal gone (the window closed: SIGHUP, and every write fails), the room
    stops the run and writes its report instead of waiting forever on a terminal nobody sees."""
    warpdeck = Path(sys.executable).parent / "warpdeck"
    run_dir = tmp_path / "run"
    pane = Pane(f"{warpdeck} demo --count 200000 --run-dir {run_dir} --json report.json; sleep 30", tmp_path)
    try:
        pane.wait_for("● running")
        pane.wait_for("compute")
        pid = _room_pid(run_dir)
    finally:
        pane.close()
    end = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < end, "the room outlived its terminal"
        time.sleep(0.1)
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["status"], report["stopped_by"]) == ("stopped", "signal")


def test_a_question_takes_only_keys_typed_once_it_showed(tmp_path: Path) -> None:
    """Issue 29, item 1, as a person meets it: `:cancel K⏎` and `:retry⏎` typed in one go. The
    retry's `y` must not confirm the cancel; the cancel asks, and `:retry` runs after the answer."""
    warpdeck = Path(sys.executable).parent / "warpdeck"
    pane = Pane(f"{warpdeck} demo --count 200000 --run-dir {tmp_path / 'run'}; echo EXIT=$?; sleep 30", tmp_path)
    try:
        pane.wait_for("● running")
        pane.keys("p")  # paused: the waiting tasks stay waiting (stalled by the operator) while it reads one
        pane.wait_for("paused")
        end = time.monotonic() + 20
        while not (waiting := re.search(r"⏸\S* (syn-\d{8})", pane.text())) and time.monotonic() < end:
            time.sleep(0.1)
        assert waiting, pane.text()
        key = waiting[1]
        pane.keys(f":cancel {key}", "Enter", ":retry", "Enter")  # one send-keys: one burst
        pane.wait_for(f"Cancel {key}")
        time.sleep(1.0)  # whatever the burst held has arrived by now
        assert f"Cancel {key}" in pane.text() and "cancelled" not in pane.text()
        pane.keys("n")
        pane.wait_for("no failed task to retry")  # the retry, after the answer: and only then
        pane.wait_gone(f"Cancel {key}")
        pane.keys("q")
        pane.wait_for("Work is still running")
        time.sleep(0.3)
        pane.keys("y")
        pane.wait_for("EXIT=")
    finally:
        pane.close()
