"""A real terminal for tests: one tmux session running one command, read off its pane as a person
reads it, driven by ``send-keys`` as a person types (several keys in one call arrive in one burst)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

__all__ = ["TMUX_MARK", "Pane"]

TMUX_MARK = pytest.mark.skipif(shutil.which("tmux") is None and os.environ.get("CI") != "true",
                               reason="tmux is not installed")
"""Skips a test where tmux is missing, except in CI, which must have it."""


class Pane:
    """One tmux session running one command."""

    def __init__(self, command: str, cwd: Path, size: tuple[int, int] = (150, 42)) -> None:
        self.name = f"wd-{uuid.uuid4().hex[:8]}"
        self.WIDTH, self.HEIGHT = size
        # pytest's capture imports readline, which exports COLUMNS=80 and LINES=24 into the process
        # environment (C level: os.environ does not show them). A tmux server started from here
        # hands them to every session, and Textual, like shutil.get_terminal_size, takes them over
        # the pane's real size and ignores every resize: the app drew 80x24 in a 150x42 pane.
        command = f"unset COLUMNS LINES; {command}"
        for _ in range(3):  # a server still exiting after the last test's session refuses a session
            made = subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(self.WIDTH),
                                   "-y", str(self.HEIGHT), "-c", str(cwd), command], capture_output=True, text=True,
                                  check=False)
            if made.returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"tmux new-session failed: {made.stderr}")
        # A detached session may keep tmux's default 80x24 whatever -x/-y say: size it for sure.
        self.resize(self.WIDTH, self.HEIGHT)

    def resize(self, width: int, height: int) -> None:
        subprocess.run(["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)], check=False)

    def assert_app_fills_the_pane(self) -> None:
        """The app must lay itself out at the pane's size (see ``__init__``), or the checks below
        would fail on cut-off columns instead of on what they check."""
        end = time.monotonic() + 20
        while self._drawn_width() < self.WIDTH - 2:
            if time.monotonic() > end:
                raise AssertionError(f"the app never filled the pane's {self.WIDTH} columns:\n{self.text()}")
            time.sleep(0.1)

    def _drawn_width(self) -> int:
        """The right end of the footer's last key: the width the app laid itself out at."""
        return max((len(line.rstrip()) for line in self.text().splitlines() if "palette" in line), default=0)

    def text(self, styles: bool = False) -> str:
        """What the pane shows; ``styles``: with its SGR escapes (bold, reverse, colours)."""
        out = subprocess.run(["tmux", "capture-pane", "-p", *(["-e"] if styles else []), "-t", self.name],
                             capture_output=True, text=True, check=True)
        return out.stdout

    def reversed_runs(self) -> list[tuple[int, str]]:
        """(line, text) of every run of reverse-video cells on the pane, as tmux redraws them."""
        runs = []
        for y, line in enumerate(self.text(styles=True).splitlines()):
            on = False
            for part in re.split(r"(\x1b\[[0-9;]*m)", line):
                if part.startswith("\x1b["):
                    params = part[2:-1].split(";") if part[2:-1] else ["0"]
                    on = "7" in params or (on and "0" not in params and "27" not in params)
                elif on and part.strip():
                    runs.append((y, part))
        return runs

    def modes(self) -> dict[str, str]:
        """What the program in the pane has set: the alternate screen, mouse reporting, a visible cursor."""
        out = subprocess.run(["tmux", "display-message", "-p", "-t", self.name,
                              "#{alternate_on} #{mouse_any_flag} #{cursor_flag}"], capture_output=True, text=True,
                             check=True)
        alternate, mouse, cursor = out.stdout.split()
        return {"alternate": alternate, "mouse": mouse, "cursor": cursor}

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, needle: str, limit_s: float = 20.0) -> str:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            text = self.text()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never showed; the pane holds:\n{self.text()}")

    def wait_gone(self, needle: str, limit_s: float = 20.0) -> None:
        end = time.monotonic() + limit_s
        while needle in self.text():
            if time.monotonic() > end:
                raise AssertionError(f"{needle!r} never went away")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True, check=False)
