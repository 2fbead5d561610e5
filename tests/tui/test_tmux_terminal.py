"""The control room in a real terminal (tmux) as a person's terminal treats it: keys it merges, sizes
it changes under the app (issue 29, item 10)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from wd_tmux import TMUX_MARK, Pane

pytestmark = TMUX_MARK
WARPDECK = Path(sys.executable).parent / "warpdeck"


def _demo(tmp_path: Path) -> Any:
    pane = Pane(f"{WARPDECK} demo --count 200000 --run-dir {tmp_path / 'run'}; echo EXIT=$?; sleep 30", tmp_path)
    pane.wait_for("● running")
    pane.wait_for("compute")
    return pane


def _quit(pane: Any) -> str:
    pane.keys("q")
    pane.wait_for("Work is still running")
    time.sleep(0.3)  # a question takes only keys typed once it showed (tui/keygate.py)
    pane.keys("y")
    return str(pane.wait_for("EXIT="))


def test_escape_and_colon_sent_at_once_open_the_command_prompt(tmp_path: Path) -> None:
    """ESC and ``:`` in one write (what tmux hands on for an escape typed just before ``:``) open the
    prompt from the board. Textual 8.2.8 reads them as a plain ``:`` (its issue #6663); a Textual
    that reads them as ``alt+colon`` needs the key gate's ``_as_typed`` (tests/tui/test_prompt_line.py)."""
    pane = _demo(tmp_path)
    try:
        pane.keys("M-:")  # ESC and ":" in one write, as tmux hands on an escape typed just before ":"
        pane.wait_for("tab or → completes")
        pane.keys("depth 7", "Enter")
        pane.wait_for("slot depth 7")
        _quit(pane)
    finally:
        pane.close()


def _laid_out_at(pane: Any, width: int) -> bool:
    """The footer's last key ends at the pane's right edge: the app has laid itself out at ``width``."""
    ends = [len(line.rstrip()) for line in pane.text().splitlines() if "palette" in line]
    return bool(ends) and width - 2 <= max(ends) <= width


def test_quitting_after_a_resize_gives_the_terminal_back_with_no_frame_left(tmp_path: Path) -> None:
    pane = _demo(tmp_path)
    try:
        for width, height in ((100, 30), (80, 24), (130, 36)):
            pane.resize(width, height)
            end = time.monotonic() + 20
            while not _laid_out_at(pane, width):
                assert time.monotonic() < end, f"never laid out at {width}x{height}:\n{pane.text()}"
                time.sleep(0.1)
        final = _quit(pane)
        assert "EXIT=4" in final, final
        assert pane.modes() == {"alternate": "0", "mouse": "0", "cursor": "1"}, "the terminal given back"
        history = subprocess.run(["tmux", "capture-pane", "-p", "-S", "-", "-t", pane.name], capture_output=True,
                                 text=True, check=True).stdout  # the screen and everything scrolled off it
        shown = [line for line in history.splitlines() if line.strip()]
        assert shown[0].startswith("demo-spectrogram: ") and shown[-1] == "EXIT=4", history  # the report, first
        assert not any(word in history for word in ("palette", "tasks/s", "queued")), history
    finally:
        pane.close()



def test_the_highlighted_task_is_a_bar_that_stays_in_view_as_tasks_arrive(tmp_path: Path) -> None:
    # Issue 29, item 6, as a person sees it: the highlight is a reversed bar (not only bold), and
    # while done tasks keep arriving at the top of the done column it stays on its task, on the
    # line where it was seen.
    pane = _demo(tmp_path)
    try:
        key = re.compile(r"[A-Za-z]+-\d{3,}")

        def highlighted() -> tuple[int, str] | None:
            found = [(y, m.group(0)) for y, run in pane.reversed_runs() if (m := key.search(run))]
            return found[0] if len(found) == 1 else None

        def wait_highlight(on_line: int | None = None) -> tuple[int, str]:
            end = time.monotonic() + 10
            while (at := highlighted()) is None or (on_line is not None and at[0] != on_line):
                assert time.monotonic() < end, (at, pane.text(styles=True))
                time.sleep(0.1)
            return at

        pane.keys("h")  # from the queued column round to the done column
        top, _ = wait_highlight()
        # Three rows down. The column may hold fewer than four tasks at first (a slow machine): a j
        # past its end moves nothing, so one at a time until the bar is three rows down.
        end = time.monotonic() + 10
        while (at := highlighted()) is None or at[0] < top + 3:
            assert time.monotonic() < end, (at, pane.text(styles=True))
            pane.keys("j")
            time.sleep(0.3)
        first = wait_highlight(top + 3)
        done_before = pane.text()
        time.sleep(2.0)  # hundreds of tasks finish meanwhile, each listed above it
        assert pane.text() != done_before
        assert highlighted() == first, (first, highlighted())
        _quit(pane)
    finally:
        pane.close()
