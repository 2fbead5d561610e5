"""One board column: a title with its count, and the virtual list of its tasks."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.widgets.task_list import TaskList

__all__ = ["BoardColumn"]


class BoardColumn(Vertical):
    """A titled task list; the title says how many tasks the column holds (and how many pass
    the filter, when one is set)."""

    DEFAULT_CSS = """
    BoardColumn { width: 1fr; height: 1fr; border-right: vkey $panel; }
    BoardColumn > .column-title { height: 1; padding: 0 1; background: $panel; text-style: bold;
                                  text-wrap: nowrap; text-overflow: ellipsis; }
    BoardColumn.-active > .column-title { background: $accent 50%; }
    """

    def __init__(self, column: str, title: str) -> None:
        super().__init__(id=f"col-{column}")
        self.column = column
        self.title_text = title
        self._shown_title = title
        self._title = Static(title, classes="column-title")
        self._list = TaskList(id=f"list-{column}")

    def compose(self) -> ComposeResult:
        yield self._title
        yield self._list

    @property
    def list(self) -> TaskList:
        return self._list

    @property
    def active(self) -> bool:
        """The board's current column (marked until another column takes the keyboard)."""
        return self.has_class("-active")

    @active.setter
    def active(self, active: bool) -> None:
        self.set_class(active, "-active")
        self._list.active = active

    def show(self, snap: EngineSnapshot, rows: npt.NDArray[np.int64], total: int, extra: str = "") -> int:
        """Show ``rows`` of ``snap``; ``total`` is the column's unfiltered count. Returns how many
        lines will repaint."""
        shown = len(rows)
        count = f"{shown:,}" if shown == total else f"{shown:,}/{total:,}"
        title = f"{self.title_text} {count}{extra}"
        lines = 0
        if title != self._shown_title:
            # One line high and as wide as the column whatever it says: no layout needed.
            self._title.update(title, layout=False)
            self._shown_title = title
            lines = 1
        return lines + self.list.show(snap, rows)
