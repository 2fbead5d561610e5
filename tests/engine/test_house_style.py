"""House rules a linter does not check (../shared/STYLE.md, "Sizes and names")."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SPHINX_COMMENT = re.compile(r"^\s*#: ")
"""A ``#:`` comment above an attribute: the style the house gave up for the docstring below it."""


def test_attributes_are_documented_one_way_by_a_docstring_below_them() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    found = [f"{name}:{i}" for name in tracked.stdout.split()
             for i, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1)
             if _SPHINX_COMMENT.match(line)]
    assert not found, f"'#:' comments (write the docstring under the attribute instead): {found[:10]}"
