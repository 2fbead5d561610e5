"""Shared test setup: stage functions for specs live in tests/support (importable by name)."""

from __future__ import annotations

import faulthandler
import os
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

_TRAIL = Path(os.environ["WARPDECK_TEST_TRAIL"]) if os.environ.get("WARPDECK_TEST_TRAIL") else None
"""CI names a file here (.ci/run): each test's id is written to it as the test starts, so that a crash that takes pytest
down (a segfault in a C extension) still says which test it was in."""


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if _TRAIL is not None:
        with _TRAIL.open("a") as f:
            f.write(f"{nodeid}\n")


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


@pytest.fixture(autouse=True)
def _no_report_above_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run report made in this process (any test, any front end) has overlap efficiency <= 1
    and device busy within [0, 1]: the bound is never below what the run reached (issue 16)."""
    from warpdeck.engine import engine as engine_module

    made = engine_module.make_report

    def checked(*args: object, **kwargs: object) -> object:
        report = made(*args, **kwargs)  # type: ignore[arg-type]
        assert report.overlap_efficiency <= 1.0 + 1e-9, f"overlap efficiency {report.overlap_efficiency} > 1"
        assert 0.0 <= report.device_busy <= 1.0, f"device busy {report.device_busy}"
        return report

    monkeypatch.setattr(engine_module, "make_report", checked)
