"""The engine stays headless and light: importing it loads no UI library and no CuPy."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["warpdeck.engine", "warpdeck.engine.api"])
def test_engine_import_loads_no_ui_or_cupy(module: str) -> None:
    code = (f"import sys, {module}\n"
            "bad = [m for m in ('textual', 'rich', 'cupy', 'warpdeck.tui', 'warpdeck.themes') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
