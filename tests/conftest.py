"""Shared test setup: stage functions for specs live in tests/support (importable by name)."""

from __future__ import annotations

import faulthandler
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from wd_broker import Mosquitto

SUPPORT = Path(__file__).parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

# `kill -USR1 <pytest pid>` prints every thread's stack: how CI finds what keeps a finished run alive.
faulthandler.register(signal.SIGUSR1, all_threads=True)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A real Mosquitto on a free loopback port, stopped afterwards (fails under CI=true if missing)."""
    from wd_broker import Mosquitto

    b = Mosquitto(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()
