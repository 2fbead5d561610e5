"""A virtual, scrollable list of tasks: only the visible rows are ever rendered.

The decision this module protects: a column may hold a million tasks, so the list keeps an index
array into the snapshot (never a widget or a string per task), renders rows on demand through the
Line API, and keeps the cursor on the same task across snapshots, so refreshes never make the
selection jump.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from warpdeck.engine.api import EngineSnapshot, Phase, StallReason, State
from warpdeck.tui.glyphs import PHASE_GLYPHS, STALL_BADGES, STATE_GLYPHS, Badge
from warpdeck.tui.keymap import bindings

__all__ = ["TaskList"]

_STATE_NAMES = {int(s): s.name.lower() for s in State}
_PHASE_NAMES = {int(p): p.name.lower() for p in Phase if p}
_STALL_NAMES = {int(r): r.name.lower() for r in StallReason if r}
_STYLES = ("queued", "fill", "h2d", "compute", "d2h", "sink", "done", "failed", "cancelled", "stall-memory",
           "stall-control", "stall-backpressure", "stall-worker-lost", "stall-hung")


class TaskList(ScrollView, can_focus=True):
    """The tasks of one board column, one row each: glyph, key, attempt and stall badges."""

    # Arrow keys mean task up/down here; left/right bubble up to the board (column focus).
    inherit_bindings = False
    BINDINGS: ClassVar = bindings("list")

    COMPONENT_CLASSES: ClassVar[set[str]] = {"task-list--cursor", "task-list--dim",
                                             *(f"task-list--{s}" for s in _STYLES)}

    DEFAULT_CSS = """
    TaskList { height: 1fr; scrollbar-size-vertical: 1; overflow-x: hidden; background: $surface; }
    TaskList:focus { background: $boost; }
    TaskList > .task-list--cursor { background: $panel; text-style: bold; }
    TaskList:focus > .task-list--cursor { background: $accent 35%; }
    TaskList > .task-list--dim { color: $text-muted; }
    TaskList > .task-list--queued { color: $wd-queued; }
    TaskList > .task-list--fill { color: $wd-fill; }
    TaskList > .task-list--h2d { color: $wd-h2d; }
    TaskList > .task-list--compute { color: $wd-compute; }
    TaskList > .task-list--d2h { color: $wd-d2h; }
    TaskList > .task-list--sink { color: $wd-sink; }
    TaskList > .task-list--done { color: $wd-done; }
    TaskList > .task-list--failed { color: $wd-failed; text-style: bold; }
    TaskList > .task-list--cancelled { color: $wd-cancelled; }
    TaskList > .task-list--stall-memory { color: $wd-stall-memory; }
    TaskList > .task-list--stall-control { color: $wd-stall-control; }
    TaskList > .task-list--stall-backpressure { color: $wd-stall-backpressure; }
    TaskList > .task-list--stall-worker-lost { color: $wd-stall-worker-lost; }
    TaskList > .task-list--stall-hung { color: $wd-stall-hung; }
    """

    cursor: reactive[int] = reactive(0, layout=False)
    """Index of the highlighted row in the list."""

    class Opened(Message):
        """Enter (or a double click) on a task."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self._rows: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._snap: EngineSnapshot | None = None
        self._stall_age: dict[str, float] = {}
        self._cursor_row = -1
        # Rendering a row is pure in (row, state, phase, stall, attempt, age, width, cursor): cache
        # the strips, so a snapshot that moved a few tasks repaints only those; styles likewise.
        self._strips: LRUCache[tuple[object, ...], Strip] = LRUCache(1024)
        self._styles: dict[str, Style] = {}

    # -- data ------------------------------------------------------------------------------------
    def show(self, snap: EngineSnapshot, rows: npt.NDArray[np.int64]) -> None:
        """Show these snapshot rows; the cursor stays on its task if the task is still listed."""
        self._snap = snap
        self._rows = rows
        self._stall_age = {s.key: s.stalled_s for s in snap.stalled} if snap.stalled else {}
        self.virtual_size = Size(self.size.width, len(rows))
        if self._cursor_row >= 0 and len(rows):
            hit = np.flatnonzero(rows == self._cursor_row)
            new = int(hit[0]) if len(hit) else min(self.cursor, len(rows) - 1)
            self.set_reactive(TaskList.cursor, new)
        elif len(rows) == 0:
            self.set_reactive(TaskList.cursor, 0)
        self._cursor_row = int(rows[self.cursor]) if len(rows) else -1
        self.refresh()

    @property
    def count(self) -> int:
        return len(self._rows)

    @property
    def current_key(self) -> str | None:
        """The highlighted task's key, if any."""
        if self._snap is None or not len(self._rows):
            return None
        return self._snap.tasks.key(int(self._rows[min(self.cursor, len(self._rows) - 1)]))

    # -- watchers --------------------------------------------------------------------------------
    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, len(self._rows) - 1)) if len(self._rows) else 0

    def watch_cursor(self, _old: int, new: int) -> None:
        self._cursor_row = int(self._rows[new]) if len(self._rows) else -1
        self.scroll_to_region(Region(0, new, 1, 1), animate=False, force=True)
        self.refresh()

    # -- rendering -------------------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips.clear()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        index = self.scroll_offset.y + y
        if self._snap is None or index >= len(self._rows):
            return Strip.blank(width, self.rich_style)
        row = int(self._rows[index])
        view = self._snap.tasks
        age = self._stall_age.get(view.keys[row]) if view.stall[row] else None
        cache_key = (row, int(view.state[row]), int(view.phase[row]), int(view.stall[row]), int(view.attempt[row]),
                     _age(age) if age is not None else "", width, index == self.cursor, self.has_focus)
        strip = self._strips.get(cache_key)
        if strip is None:
            strip = Strip(self._row_segments(row)).adjust_cell_length(width, self.rich_style)
            if index == self.cursor:
                strip = strip.apply_style(self._style("task-list--cursor"))
            self._strips[cache_key] = strip
        return strip

    def _row_segments(self, row: int) -> list[Segment]:
        assert self._snap is not None
        view = self._snap.tasks
        state = _STATE_NAMES[int(view.state[row])]
        key = view.key(row)
        stall = int(view.stall[row])
        out: list[Segment] = []
        if stall and state in ("queued", "running"):
            badge = STALL_BADGES[_STALL_NAMES[stall]]
            age = self._stall_age.get(key)
            label = badge.glyph + (_age(age) if age is not None else "")
            out.append(Segment(label + " ", self._badge_style(badge)))
        else:
            badge = PHASE_GLYPHS[_PHASE_NAMES[int(view.phase[row])]] if state == "running" else STATE_GLYPHS[state]
            out.append(Segment(badge.glyph + " ", self._badge_style(badge)))
        out.append(Segment(key, self.rich_style))
        attempt = int(view.attempt[row])
        if attempt > 1:
            out.append(Segment(f" ↻{attempt}", self._style("task-list--dim")))
        return out

    def _badge_style(self, badge: Badge) -> Style:
        return self._style(f"task-list--{badge.style}")

    def _style(self, component: str) -> Style:
        style = self._styles.get(component)
        if style is None:
            style = self._styles[component] = self.get_component_rich_style(component)
        return style

    def on_focus(self) -> None:
        self._styles.clear()

    def on_blur(self) -> None:
        self._styles.clear()

    def on_resize(self, event: events.Resize) -> None:
        self.virtual_size = Size(event.size.width, len(self._rows))

    # -- handlers --------------------------------------------------------------------------------
    def on_click(self, event: events.Click) -> None:
        self.focus()
        self.cursor = self.scroll_offset.y + event.y
        if event.chain >= 2:
            self.action_open()

    # -- actions ---------------------------------------------------------------------------------
    def action_cursor_down(self) -> None:
        self.cursor += 1

    def action_cursor_up(self) -> None:
        self.cursor -= 1

    def action_first(self) -> None:
        self.cursor = 0

    def action_last(self) -> None:
        self.cursor = len(self._rows) - 1

    def action_page_down(self) -> None:
        self.cursor += max(1, self.size.height - 1)

    def action_page_up(self) -> None:
        self.cursor -= max(1, self.size.height - 1)

    def action_open(self) -> None:
        key = self.current_key
        if key is not None:
            self.post_message(self.Opened(key))


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
