"""A stage module that takes a while to import: a window in a run's start-up, before its signal
handlers, for tests/engine/test_cli.py to send a signal into. It touches ``$WARPDECK_TEST_STAMP``
when the import begins."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

if os.environ.get("WARPDECK_TEST_STAMP"):
    Path(os.environ["WARPDECK_TEST_STAMP"]).touch()
time.sleep(float(os.environ.get("WARPDECK_TEST_IMPORT_S", "3")))


def double(xp: Any, inp: Any, out: Any) -> None:
    """out = 2 * inp."""
    xp.multiply(inp, 2, out=out)
