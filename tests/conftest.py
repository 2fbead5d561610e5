"""Shared test setup: stage functions for specs live in tests/support (importable by name)."""

from __future__ import annotations

import faulthandler
import signal
import sys
from pathlib import Path

SUPPORT = Path(__file__).parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

# `kill -USR1 <pytest pid>` prints every thread's stack: how CI finds what keeps a finished run alive.
faulthandler.register(signal.SIGUSR1, all_threads=True)
