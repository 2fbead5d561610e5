"""One board column: a title with its count, and the virtual list of its tasks."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from textual.app import ComposeResult
from textual.containers import Vertical

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.widgets.column_title import ColumnTitle
from warpdeck.tui.widgets.task_list import TaskList

__all__ = ["BoardColumn"]


class BoardColumn(Vertical):
    """A titled task list; the title says how many tasks the column holds (and how many pass
    the filter, when one is set), fitted to the column's width (``column_title.py``)."""

    DEFAULT_CSS = """
    BoardColumn { width: 1fr; height: 1fr; border-right: vkey $panel; }
    BoardColumn.-active > .column-title { background: $accent 50%; }
    """

    def __init__(self, column: str, title: str, *, classes: str | None = None) -> None:
        super().__init__(id=f"col-{column}", classes=classes)
        self.column = column
        self.title_text = title
        self._title = ColumnTitle(title, classes="column-title")
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

    def show(self, snap: EngineSnapshot, rows: npt.NDArray[np.int64], total: int, failed: int = 0,
             cancelled: int = 0, shown: int | None = None, beside: tuple[int, str] = (0, "")) -> int:
        """Show ``rows`` of ``snap``; ``total`` is the column's unfiltered count, ``failed`` and
        ``cancelled`` are marked after it; ``shown`` is what the title counts as shown (default: the
        rows; an attached room's sampled rows stand for the whole column); ``beside``: tasks the
        column stands for without rows (``column_title``). Returns how many lines will repaint."""
        # One line high and as wide as the column whatever it says: no layout needed.
        count = len(rows) if shown is None else shown
        lines = 1 if self._title.set_counts(count, total, failed, cancelled, beside) else 0
        return lines + self.list.show(snap, rows)
