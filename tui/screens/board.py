"""The board: every task in one of eight columns, queued through running phases to done."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.board_model import COLUMNS, board_rows
from warpdeck.tui.filtering import TaskFilter
from warpdeck.tui.keymap import bindings
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.widgets.board_column import BoardColumn
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.status_bar import StatusBar
from warpdeck.tui.widgets.task_list import TaskList

__all__ = ["BoardScreen"]


class BoardScreen(Screen[None]):
    """Columns queued · fill · h2d · compute · d2h · sink · stalled · done/failed."""

    BINDINGS: ClassVar = bindings("board")

    DEFAULT_CSS = """
    BoardScreen #columns { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__(name="board")
        self._seen: tuple[int, str] = (-1, "")
        self._filter = TaskFilter()

    def compose(self) -> ComposeResult:
        yield StatusBar("board")
        with Horizontal(id="columns"):
            for cid, title in COLUMNS:
                yield BoardColumn(cid, title)
        yield FiguresStrip()
        yield Footer()

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._changed)
        self.watch(self.app, "task_filter", self._new_filter, init=True)
        self.query_one("#list-queued", TaskList).focus()

    def on_screen_resume(self) -> None:
        self._changed(getattr(self.app, "snapshot", None))

    def _new_filter(self, task_filter: TaskFilter) -> None:
        self._filter = task_filter
        self._seen = (-1, "")
        self._changed(getattr(self.app, "snapshot", None))

    def _changed(self, snap: EngineSnapshot | None) -> None:
        if snap is None or not self.is_current or self._seen == (snap.seq, self._filter.text):
            return
        self._seen = (snap.seq, self._filter.text)
        board = board_rows(snap, self._filter.mask(snap.tasks))
        for column in self.query(BoardColumn):
            extra = ""
            if column.column == "finished" and (board.failed or board.cancelled):
                extra = f" ✗{board.failed:,}" + (f" ⊘{board.cancelled:,}" if board.cancelled else "")
            column.show(snap, board.rows[column.column], board.totals[column.column], extra)

    def focused_key(self) -> str | None:
        """The highlighted task of the focused column."""
        focused = self.focused
        return focused.current_key if isinstance(focused, TaskList) else None

    def on_task_list_opened(self, event: TaskList.Opened) -> None:
        self.app.push_screen(DetailScreen(event.key))

    def action_column(self, step: int) -> None:
        lists = list(self.query(TaskList))
        focused = self.focused
        i = lists.index(focused) if isinstance(focused, TaskList) and focused in lists else 0
        lists[(i + step) % len(lists)].focus()
