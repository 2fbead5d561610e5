"""Textual's private names the control room relies on: one list, checked at start and by a test.

The decision this module protects: the control room overrides a few of Textual's internals for
speed (frames painted on idle instead of a 60 Hz timer, screens styled once, a task list that
keeps its own scrollbar) and reads a few more. Textual may rename any of them in any release, so
they are listed here, the package pins the Textual it was written against (pyproject.toml), and
``check()`` fails at start with a message that names what is gone, instead of an AttributeError
deep in a paint. tests/tui/test_textual_internals.py is the canary.
"""

from __future__ import annotations

import importlib.metadata

from textual.app import App
from textual.screen import Screen
from textual.widget import Widget

__all__ = ["TEXTUAL_WRITTEN_FOR", "USED", "check", "missing"]

TEXTUAL_WRITTEN_FOR = "8.2.8"
"""The Textual release these overrides were written and tested against."""

USED: tuple[tuple[type[object], tuple[str, ...], str], ...] = (
    (Screen, ("_on_timer_update", "_on_idle", "_layout_required", "_scroll_required", "_repaint_required",
              "_recompose_required", "_dirty_widgets", "_invoke_and_clear_callbacks"), "tui/screens/main.py"),
    (Screen, ("_compositor",), "tests/support/wd_screen.py"),
    (App, ("_batch_count", "_screen_stacks", "_init_mode", "_css_update_count"), "tui/screens/main.py, tui/app.py"),
    (App, ("_exception",), "tui/app.py"),
    (Widget, ("_size_updated", "_selector_names"), "tui/widgets/task_list.py"),
)
"""(class, private names on an instance of it, where warpdeck uses them)."""


def missing() -> list[str]:
    """``Class._name (where)`` for each private name this Textual no longer has."""
    instances: dict[type[object], object] = {}
    gone = []
    for cls, names, where in USED:
        obj = instances.get(cls)
        if obj is None:
            obj = instances[cls] = cls()
        gone += [f"{cls.__name__}.{n} ({where})" for n in names if not hasattr(obj, n)]
    return gone


def check() -> None:
    """Raise ``RuntimeError`` naming what is gone when this Textual lacks a name the control room uses."""
    gone = missing()
    if gone:
        have = importlib.metadata.version("textual")
        raise RuntimeError(f"the control room was written for Textual {TEXTUAL_WRITTEN_FOR}; Textual {have} lacks "
                           f"{', '.join(gone)}: install textual=={TEXTUAL_WRITTEN_FOR}")
