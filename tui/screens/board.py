"""The board: every task in one of eight columns, queued through running phases to done.

The decision this module protects: a key press is never queued behind a whole board's repaint.
At ten thousand transitions a second nearly every visible row of six columns changes between two
snapshots, and repainting them all in one frame takes longer than a key may wait. So a snapshot
is spread over a few frames: the status bar, then the columns (the focused one first) at most
``LINES_PER_FRAME`` changed lines a frame, then the figures strip; each next part is handed out
after the frame before it is painted, and keys are handled in between; a key's own frame carries
no part (the next one waits a frame after any key), so it is as short as the key's lines make it.
The two bars get a frame each because Textual repaints the box around everything dirty: a bar at
the top and one at the bottom in one frame make it the whole screen. A newer snapshot replaces
the one being spread (latest wins) and the parts it had not reached yet go first, so none is
starved. The first snapshot the board shows is painted whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar

from textual import events, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import Reactive
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.board_model import COLUMNS, BoardRows, board_rows
from warpdeck.tui.filtering import TaskFilter
from warpdeck.tui.keymap import bindings
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.main import MainScreen
from warpdeck.tui.widgets.board_column import BoardColumn
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.status_bar import StatusBar
from warpdeck.tui.widgets.task_list import TaskList

__all__ = ["BoardScreen"]


class BoardScreen(MainScreen):
    """Columns queued · fill · h2d · compute · d2h · sink · stalled · done/failed."""

    BINDINGS: ClassVar = bindings("board")

    DEFAULT_CSS = """
    BoardScreen #columns { height: 1fr; }
    """

    LINES_PER_FRAME: ClassVar[int] = 50
    """Changed task-list lines one frame may repaint for a snapshot (a board column is ~44 high).
    A key waits for the frame being painted and shares the next one with a part: at 100 lines
    that was two 10-20 ms frames; at 50 the board still shows nearly every snapshot whole."""

    focused: Reactive[Widget | None] = Reactive(None, repaint=False)
    """Textual's, less its repaint of the whole screen on every focus change (``h``/``l``): the
    widgets whose look follows the current column (the two lists, their columns' titles) are
    restyled, and so repainted, when a list takes the focus."""

    def __init__(self) -> None:
        super().__init__(name="board")
        self._seen: tuple[int, str] = (-1, "")
        self._filter = TaskFilter()
        self._snap: EngineSnapshot | None = None
        self._board: BoardRows | None = None
        self._todo: list[BoardColumn | StatusBar | FiguresStrip] = []
        self._spreading = False
        self._keys_at_part = 0
        """The app's key count when the last part was handed out."""
        self.shown_seq = -1
        """The snapshot every column shows (-1: none yet, or one is still being spread)."""

    def compose(self) -> ComposeResult:
        yield StatusBar("board")
        with Horizontal(id="columns"):
            for cid, title in COLUMNS:
                yield BoardColumn(cid, title)
        yield FiguresStrip()
        yield KeyFooter()
        yield PromptBar()

    def on_mount(self) -> None:
        self._status, self._figures = self.query_one(StatusBar), self.query_one(FiguresStrip)
        self._status.paced = self._figures.paced = True
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
        if snap is None or not self.is_current:
            return
        first = self._board is None
        if self._seen != (snap.seq, self._filter.text):
            self._seen = (snap.seq, self._filter.text)
            self._snap, self._board = snap, board_rows(snap, self._filter.mask(snap.tasks))
            columns = list(self.query(BoardColumn))
            columns.sort(key=lambda c: not c.active)  # stable: the current column, then board order
            parts: list[BoardColumn | StatusBar | FiguresStrip] = [self._status, *columns, self._figures]
            self._todo = self._todo + [p for p in parts if p not in self._todo]
            self.shown_seq = -1
        if first:
            self._show_some(whole=True)
        elif self._todo and not self._spreading:
            self._spreading = True
            self._spread()

    @work(group="board-paint")
    async def _spread(self) -> None:
        """Hand the newest board out a frame's worth at a time, each part after the last is painted,
        and none in the frame after a key: that frame carries the key's lines alone."""
        try:
            while self._todo and self.is_current:
                keys = self._keys_seen()
                if keys != self._keys_at_part:
                    self._keys_at_part = keys
                    await self._next_frame()  # the key's (at once if it changed nothing)
                    continue
                self._show_some()
                if self._todo:
                    await asyncio.sleep(0)  # the parts' repaint requests reach the screen first
                    await self._next_frame()
        finally:
            self._spreading = False

    async def _next_frame(self) -> None:
        # The wait rides on the top screen: one pushed and popped meanwhile (a dialog) takes it
        # along, so a few frames' wait is the most it gets.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.25):
                await self.wait_for_refresh()

    def _keys_seen(self) -> int:
        return int(getattr(self.app, "keys_seen", 0))

    def _show_some(self, whole: bool = False) -> None:
        """Show the newest board in the parts still to do, until this frame's lines are spent."""
        snap, board = self._snap, self._board
        if snap is None or board is None:
            return
        budget = self.LINES_PER_FRAME
        while self._todo and (whole or budget > 0):
            part = self._todo[0]
            if not isinstance(part, BoardColumn):  # a bar as wide as the screen: a frame of its own
                if budget < self.LINES_PER_FRAME and not whole:
                    break
                self._todo.pop(0)
                part.refresh()
                budget = 0
                continue
            self._todo.pop(0)
            extra = ""
            if part.column == "finished" and (board.failed or board.cancelled):
                extra = f" ✗{board.failed:,}" + (f" ⊘{board.cancelled:,}" if board.cancelled else "")
            budget -= part.show(snap, board.rows[part.column], board.totals[part.column], extra)
        if not self._todo:
            self.shown_seq = snap.seq

    def focused_key(self) -> str | None:
        """The highlighted task of the focused column."""
        focused = self.focused
        return focused.current_key if isinstance(focused, TaskList) else None

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        # The column whose list has the keyboard is the current one, and stays so while the
        # prompt bar has it: a column's look changes only when another column takes over.
        if isinstance(event.widget, TaskList):
            for column in self.query(BoardColumn):
                column.active = column.list is event.widget

    def on_task_list_opened(self, event: TaskList.Opened) -> None:
        self.app.push_screen(DetailScreen(event.key))

    def action_column(self, step: int) -> None:
        lists = list(self.query(TaskList))
        focused = self.focused
        i = lists.index(focused) if isinstance(focused, TaskList) and focused in lists else 0
        self.set_focus(lists[(i + step) % len(lists)])  # not ``focus()``: it repaints the whole list
