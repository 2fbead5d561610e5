"""``warpdeck`` as a person runs it: the real command in a subprocess (``python -m warpdeck.cli``),
with this folder's test stages importable and the terminal width pinned, so lines wrap the same on
every machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["COMMAND", "SUPPORT", "cli_env", "warpdeck"]

SUPPORT = Path(__file__).resolve().parent
"""This folder: the test stages (``wd_stages:double``) a spec names."""
COMMAND = (sys.executable, "-m", "warpdeck.cli")
"""The command, before its arguments."""


def cli_env(columns: int | None = None, *, support: bool = True) -> dict[str, str]:
    """The environment: this one, with ``tests/support`` on the path (unless ``support`` is off: a
    test of what cannot be imported) and ``COLUMNS`` set when given."""
    env = dict(os.environ)
    if support:
        env["PYTHONPATH"] = str(SUPPORT)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return env


def warpdeck(*args: str, cwd: Path, columns: int | None = 120, timeout: float = 120,
             support: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``warpdeck ARGS`` in ``cwd`` to its end: its exit status, stdout and stderr as text."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, cwd=cwd,
                          env=cli_env(columns, support=support), timeout=timeout, check=False)
