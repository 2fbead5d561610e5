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

A second decision: an id is never cut into another id. Where eight columns would leave under
``COMPACT_CELLS`` cells each (80x24), the board shows four: queued, running (the five phases
joined; each row's glyph still says its phase), stalled and done/failed. Both layouts are composed
once and the board switches between them on resize by hiding columns, so the columns that both
layouts share keep their cursor and scroll; a hidden column is not painted. The column with the
keyboard hands it, and its task, to the column of the other layout that holds that task.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar

from textual import events, work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal
from textual.reactive import Reactive
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.board_model import COLUMNS, COMPACT_COLUMNS, PHASE_COLUMNS, BoardRows, board_rows
from warpdeck.tui.filtering import TaskFilter
from warpdeck.tui.keymap import bindings
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.main import MainScreen
from warpdeck.tui.widgets.alert_banner import AlertBanner
from warpdeck.tui.widgets.board_column import BoardColumn
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.status_bar import StatusBar
from warpdeck.tui.widgets.task_list import TaskList

__all__ = ["BoardScreen"]


class BoardScreen(MainScreen):
    """Columns queued · fill · h2d · compute · d2h · sink · stalled · done/failed (on a narrow
    terminal: queued · running · stalled · done/failed)."""

    BINDINGS: ClassVar[list[BindingType]] = bindings("board")

    DEFAULT_CSS = """
    BoardScreen #columns { height: 1fr; }
    """

    LINES_PER_FRAME: ClassVar[int] = 50
    """Changed task-list lines one frame may repaint for a snapshot (a board column is ~44 high).
    A key waits for the frame being painted and shares the next one with a part: at 100 lines
    that was two 10-20 ms frames; at 50 the board still shows nearly every snapshot whole."""

    COMPACT_CELLS: ClassVar[int] = 12
    """Below this many cells a column (a task's glyph, its id, a scrollbar), the board goes compact."""

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
        self.compact = False
        """Showing the compact layout (``COMPACT_COLUMNS``)."""

    def compose(self) -> ComposeResult:
        yield StatusBar("board")
        yield AlertBanner()
        with Horizontal(id="columns"):
            # Board order in both layouts: the running column stands where the phases do.
            for cid, title in (COLUMNS[0], COMPACT_COLUMNS[1], *COLUMNS[1:]):
                column = BoardColumn(cid, title)
                column.display = cid in dict(COLUMNS)
                yield column
        yield FiguresStrip()
        yield KeyFooter()
        yield PromptBar()

    def on_mount(self) -> None:
        self._status, self._figures = self.query_one(StatusBar), self.query_one(FiguresStrip)
        self._status.paced = self._figures.paced = True
        self._lay_out(self.app.size.width)
        app = warpdeck_app(self)
        self.watch(app, "snapshot", self._changed)
        self.watch(app, "task_filter", self._new_filter, init=True)
        self.query_one("#list-queued", TaskList).focus()

    def on_screen_resume(self) -> None:
        self._lay_out(self.app.size.width)  # the terminal may have been resized while away
        self._changed(warpdeck_app(self).snapshot)

    def on_resize(self, event: events.Resize) -> None:
        if self._lay_out(event.size.width):
            self._changed(warpdeck_app(self).snapshot)

    def _new_filter(self, task_filter: TaskFilter) -> None:
        self._filter = task_filter
        self._seen = (-1, "")
        self._changed(warpdeck_app(self).snapshot)

    def _changed(self, snap: EngineSnapshot | None) -> None:
        if snap is None or not self.is_current:
            return
        first = self._board is None
        if self._seen == (snap.seq, self._filter.text) and self._snap is not None and snap is not self._snap:
            # The same frame told again with news of its link (an attached room's engine fell
            # silent): the tasks are as shown, and the status line says what the link says now.
            self._snap = snap
            self._status.show(snap)
            return
        if self._seen != (snap.seq, self._filter.text):
            self._seen = (snap.seq, self._filter.text)
            self._snap, self._board = snap, board_rows(snap, self._filter.mask(snap.tasks))
            columns = self._columns()
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
        return warpdeck_app(self).keys_seen

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
                part.show(snap)  # the snapshot the columns show, not a newer one
                budget = 0
                continue
            self._todo.pop(0)
            rows, total = board.column(part.column)
            shown = board.shown(part.column, rows)
            if part.column == "finished":
                # Titled "done": its count is the done tasks, the figure the status line shows, with
                # the failed and cancelled ones it also lists marked after it.
                failed, cancelled = board.failed_cancelled(snap, rows)
                budget -= part.show(snap, rows, total - board.failed - board.cancelled, board.failed,
                                    board.cancelled, shown=shown - failed - cancelled)
            elif part.column == "queued":
                budget -= part.show(snap, rows, total, shown=shown, beside=(snap.counts.to_come or 0, "to come"))
            else:
                budget -= part.show(snap, rows, total, shown=shown)
        if not self._todo:
            self.shown_seq = snap.seq

    def _columns(self) -> list[BoardColumn]:
        """The columns of the layout shown, in board order."""
        ids = dict(COMPACT_COLUMNS if self.compact else COLUMNS)
        return [c for c in self.query(BoardColumn) if c.column in ids]

    def _lay_out(self, width: int) -> bool:
        """Show the layout that suits ``width``; True if that changed it. The column with the
        keyboard, if hidden, hands it to the one now showing its task, cursor on that task."""
        compact = 0 < width < self.COMPACT_CELLS * len(COLUMNS)
        if compact == self.compact:
            return False
        self.compact = compact
        shown = self._columns()
        for column in self.query(BoardColumn):
            column.display = column in shown
        focused = self.focused
        if isinstance(focused, TaskList) and focused.parent not in shown:
            row = focused.current_row
            target = self._column_for(row).list
            self.set_focus(target, scroll_visible=False)
            self.call_after_refresh(lambda: row is None or target.select_row(row))
        # The columns now shown were not painted while hidden: the next snapshot is shown whole.
        self._seen, self._board = (-1, ""), None
        self._todo = [p for p in self._todo if not isinstance(p, BoardColumn)]
        return True

    def _column_for(self, row: int | None) -> BoardColumn:
        """The shown column that lists snapshot row ``row`` (a phase column's task: running, or
        the column of its phase), else the first running column."""
        cid = "running" if self.compact else PHASE_COLUMNS[0]
        if not self.compact and row is not None and self._board is not None:
            cid = next((p for p in PHASE_COLUMNS if row in self._board.rows[p]), cid)
        return self.query_one(f"#col-{cid}", BoardColumn)

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
        lists = [column.list for column in self._columns()]
        focused = self.focused
        i = lists.index(focused) if isinstance(focused, TaskList) and focused in lists else 0
        self.set_focus(lists[(i + step) % len(lists)])  # not ``focus()``: it repaints the whole list
