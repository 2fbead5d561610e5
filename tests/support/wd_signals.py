"""Whether another process has a handler for a signal yet: its ``SigCgt`` mask in /proc (Linux)."""

from __future__ import annotations

import signal
from pathlib import Path


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (False once it has gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)
