"""A stage that stays slow until the test opens a gate, for runs that must outlast something the test
does (a flood of messages) however long that takes on the machine, and then finish quickly.

The gate is a file named by ``$WD_GATE``: while it is absent each batch takes ``SLOW_S``; once the
test creates it, batches run at full speed. Nothing waits on the gate, so a run whose test died
still finishes, slowly."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

GATE_ENV = "WD_GATE"
SLOW_S = 0.08


def slow_until_gate(xp: Any, inp: Any, out: Any) -> None:
    """out = 2 * inp, after ``SLOW_S`` while the gate file is absent."""
    gate = os.environ.get(GATE_ENV)
    if gate is None or not Path(gate).exists():
        time.sleep(SLOW_S)
    xp.multiply(inp, 2, out=out)
