"""A virtual, scrollable list of tasks: only the visible rows are ever rendered.

The decision this module protects: a column may hold a million tasks, so the list keeps an index
array into the snapshot (never a widget or a string per task), renders rows on demand through the
Line API, and keeps the cursor on the same task across snapshots, so refreshes never make the
selection jump; and that task in view (issue 29): when rows come or go above it the view moves
with it, and a scroll brings the highlight along, so x and Enter never act on a task off screen.
A list nobody has moved in (the highlight on its first row, at the top) keeps showing its head.

A repaint costs per line, not per task, and most of a snapshot's changes are off screen: ``show``
compares what each visible line would show (the task's key and its state, phase, stall, attempt,
age and cursor) with what was last painted there, and refreshes only the lines that differ. A list
whose visible rows did not change costs nothing to repaint; a length change moves the scrollbar
without a screen layout.

A line is told by its task's key, not its row: an attached room's table is rebuilt from every
telemetry frame (``snapshot_from``), where a row holds whichever key the frame's sample put there.
Before (issue 29) lines and cached strips were keyed by row, and an attached queued list stood
still while its tasks left it, done climbing by 13 000: the sample's rows, states and length were
the same from frame to frame. The highlight follows its task the same way: by row while the row
still holds it (the engine's own table, append-only), else by its key among the list's rows.

A key wider than its row is shortened in the middle (``tui/fit.py``), never cut at the end: cut
ids read as other ids. That is done while a row's strip is built, so per visible row, and the
strip cache is keyed by the width it was built for.
"""

from __future__ import annotations

from collections.abc import Hashable
from math import ceil
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import BindingType
from textual.cache import LRUCache
from textual.color import Color
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar
from textual.strip import Strip

from warpdeck.engine.api import EngineSnapshot, Phase, PhaseName, StallName, StallReason, State, StateName
from warpdeck.tui.fit import middle
from warpdeck.tui.glyphs import PHASE_GLYPHS, STALL_BADGES, STATE_GLYPHS, Badge
from warpdeck.tui.keymap import bindings

__all__ = ["TaskList"]

_STATE_NAMES: dict[int, StateName] = {int(s): s.label for s in State}
_PHASE_NAMES: dict[int, PhaseName] = {int(p): p.label for p in Phase if p}
_STALL_NAMES: dict[int, StallName] = {int(r): r.label for r in StallReason if r}
_BOLD = frozenset({"failed"})
"""Badge styles (``Badge.style``: each takes its colour from the theme's ``$wd-<style>``) that are bold."""


class TaskList(ScrollView, can_focus=True):
    """The tasks of one board column, one row each: glyph, key, attempt and stall badges."""

    # Arrow keys mean task up/down here; left/right bubble up to the board (column focus).
    inherit_bindings = False
    BINDINGS: ClassVar[list[BindingType]] = bindings("list")

    # Badge colours come straight from the theme's variables, not from a component class each:
    # Textual restyles every component class of every list on each focus change and screen
    # switch, and fourteen of them made that the slowest part of a key press.
    COMPONENT_CLASSES: ClassVar[set[str]] = {"task-list--cursor", "task-list--dim"}

    # The current list is marked by a class (``active``), not by ``:focus``: it stays marked while
    # the prompt bar has the keyboard, so opening and closing the prompt repaints no list.
    DEFAULT_CSS = """
    TaskList { height: 1fr; scrollbar-size-vertical: 1; overflow-x: hidden; background: $surface; }
    TaskList.-active { background: $boost; }
    TaskList > .task-list--cursor { background: $panel; text-style: bold; }
    TaskList.-active > .task-list--cursor { background: $accent 35%; text-style: bold reverse; }
    TaskList > .task-list--dim { color: $text-muted; }
    """

    cursor: reactive[int] = reactive(0, layout=False, repaint=False)  # watch_cursor repaints two lines
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
        # Rendering a row is pure in (key, state, phase, stall, attempt, age, width, cursor): cache
        # the strips, so a snapshot that moved a few tasks repaints only those; styles likewise.
        self._strips: LRUCache[tuple[object, ...], Strip] = LRUCache(48)
        self._styles: dict[str, Style] = {}
        # What each visible line showed when last asked to repaint: (scroll offset, one key a line).
        self._painted: tuple[int, list[Hashable]] = (-1, [])
        # What the last screen layout that reached Textual's own size update gave the list.
        self._laid_out: tuple[object, ...] | None = None

    # -- data ------------------------------------------------------------------------------------
    def show(self, snap: EngineSnapshot, rows: npt.NDArray[np.int64]) -> int:
        """Show these snapshot rows; the cursor stays on its task if the task is still listed.
        Returns how many visible lines will repaint (those whose row, or what it shows, changed)."""
        chosen = self._chosen_key()
        self._snap = snap
        self._rows = rows
        self._stall_age = {s.key: s.stalled_s for s in snap.stalled} if snap.stalled else {}
        line = self.cursor - self.scroll_offset.y  # where the highlighted task is drawn now
        # A list nobody has moved in (highlight on the first row, at the top) keeps showing its head
        # as rows come and go; one the user moved in keeps the task they chose, in view.
        at_head = self.cursor == 0 and self.scroll_offset.y == 0
        self._set_length(len(rows))
        if self._cursor_row >= 0 and len(rows):
            at = -1 if at_head else self._index_of(chosen)
            new = 0 if at_head else at if at >= 0 else min(self.cursor, len(rows) - 1)
            self.set_reactive(TaskList.cursor, new)
            if 0 <= line < self.size.height and new - line != self.scroll_offset.y:
                # The task moved in the list (rows came or went above it): the view moves with it,
                # so the highlighted task stays where it was seen. Before (issue 29) it stayed on
                # its task while thousands of rows arrived above, off screen, where x and Enter
                # still acted on it.
                self.scroll_to(y=new - line, animate=False, immediate=True)
        elif len(rows) == 0:
            self.set_reactive(TaskList.cursor, 0)
        self._cursor_row = int(rows[self.cursor]) if len(rows) else -1
        return self._refresh_changed()

    def _chosen_key(self) -> str | None:
        """The highlighted task's key in the snapshot shown until now (None: no task highlighted)."""
        snap, row = self._snap, self._cursor_row
        return snap.tasks.key(row) if snap is not None and 0 <= row < len(snap.tasks) else None

    def _index_of(self, key: str | None) -> int:
        """Where the task ``key`` (highlighted until now, at snapshot row ``_cursor_row``) stands in
        the list now; -1 if it is not listed. Its row first, while that row still holds it; else, in
        a table rebuilt from telemetry, by its key among the list's rows (a sample: a few hundred)."""
        assert self._snap is not None
        keys, row = self._snap.tasks.keys, self._cursor_row
        if key is None:
            return -1
        if row < len(keys) and keys[row] == key:
            hit = np.flatnonzero(self._rows == row)
            return int(hit[0]) if len(hit) else -1
        return next((i for i, r in enumerate(self._rows.tolist()) if keys[r] == key), -1)

    def _set_length(self, length: int) -> None:
        """Make the list ``length`` rows long. While the scrollbar stays as it is (shown, or not),
        the screen's layout cannot change, so only the scrollbar and the scroll limit follow; a
        layout of the whole screen per snapshot would cost more than the repaint itself."""
        new = Size(self.size.width, length)
        old = self.virtual_size
        if new == old:
            return
        height = self.scrollable_content_region.height
        if new.width != old.width or (length > height) != (old.height > height) or not self.size:
            self.virtual_size = new
            self._laid_out = None  # the next layout shows or hides the scrollbar
            return
        self.set_reactive(TaskList.virtual_size, new)
        if self.show_vertical_scrollbar:
            # Repainting a scrollbar costs as much as a whole list: only when its thumb moves.
            bar = self.vertical_scrollbar
            before = _thumb(bar, bar.window_virtual_size)
            bar.set_reactive(ScrollBar.window_virtual_size, length)
            if _thumb(bar, length) != before:
                bar.refresh()
        self.scroll_y = self.validate_scroll_y(self.scroll_y)
        self.scroll_target_y = self.validate_scroll_target_y(self.scroll_target_y)

    def _window(self) -> list[Hashable]:
        """One key per visible line: what it shows, so two equal keys paint the same strip."""
        top, height = self.scroll_offset.y, self.size.height
        snap = self._snap
        if snap is None:
            return [None] * height
        view = snap.tasks
        idx = self._rows[top:top + height]
        stall = view.stall[idx].tolist()
        out: list[Hashable] = []
        for i, (row, state, phase, stalled, attempt) in enumerate(zip(
                idx.tolist(), view.state[idx].tolist(), view.phase[idx].tolist(), stall, view.attempt[idx].tolist(),
                strict=True)):
            key = view.keys[row]
            age = self._stall_age.get(key) if stalled else None
            out.append((key, state, phase, stalled, attempt, _age(age) if age is not None else "",
                        top + i == self.cursor))
        out.extend([None] * (height - len(out)))
        return out

    def _refresh_changed(self) -> int:
        """Refresh the visible lines whose key changed since the last call (all, if scrolled);
        returns how many."""
        top = self.scroll_offset.y
        window = self._window()
        old_top, old = self._painted
        self._painted = (top, window)
        if old_top != top or len(old) != len(window):
            self.refresh()
            return len(window)
        changed = y = 0
        while y < len(window):
            if window[y] == old[y]:
                y += 1
                continue
            start = y
            while y < len(window) and window[y] != old[y]:
                y += 1
            self.refresh_lines(top + start, y - start)
            changed += y - start
        return changed

    @property
    def active(self) -> bool:
        """Shown as the board's current list (it has the keyboard, or had it before the prompt)."""
        return self.has_class("-active")

    @active.setter
    def active(self, active: bool) -> None:
        self.set_class(active, "-active")  # a restyle, which drops the cached lines and repaints

    @property
    def count(self) -> int:
        return len(self._rows)

    @property
    def current_row(self) -> int | None:
        """The highlighted task's row in the snapshot, if any."""
        return self._cursor_row if len(self._rows) else None

    def select_row(self, row: int) -> bool:
        """Move the cursor to snapshot row ``row``; False if the list does not show it."""
        hit = np.flatnonzero(self._rows == row)
        if len(hit):
            self.cursor = int(hit[0])
        return bool(len(hit))

    @property
    def current_key(self) -> str | None:
        """The highlighted task's key, if any."""
        if self._snap is None or not len(self._rows):
            return None
        return self._snap.tasks.key(int(self._rows[min(self.cursor, len(self._rows) - 1)]))

    # -- watchers --------------------------------------------------------------------------------
    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, len(self._rows) - 1)) if len(self._rows) else 0

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        # Scrolled by the wheel or the scrollbar: the highlight comes along, so no key acts on a
        # task the list no longer shows.
        top, height = int(new), self.scrollable_content_region.height
        if height > 0 and len(self._rows) and not top <= self.cursor < top + height:
            self.cursor = min(max(self.cursor, top), top + height - 1)

    def watch_cursor(self, _old: int, new: int) -> None:
        self._cursor_row = int(self._rows[new]) if len(self._rows) else -1
        self.scroll_to_region(Region(0, new, 1, 1), animate=False, force=True)
        self._refresh_changed()  # the old and the new cursor line, or all of them if it scrolled

    # -- rendering -------------------------------------------------------------------------------
    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._strips.clear()

    def render_line(self, y: int) -> Strip:
        # The row's own width: ``size`` also spans the scrollbar, which would hide a key's tail.
        width = self.scrollable_content_region.width
        index = self.scroll_offset.y + y
        if self._snap is None or index >= len(self._rows):
            return Strip.blank(width, self._base_style)
        row = int(self._rows[index])
        view = self._snap.tasks
        key = view.keys[row]
        age = self._stall_age.get(key) if view.stall[row] else None
        cache_key = (key, int(view.state[row]), int(view.phase[row]), int(view.stall[row]), int(view.attempt[row]),
                     _age(age) if age is not None else "", width, index == self.cursor)
        strip = self._strips.get(cache_key)
        if strip is None:
            strip = Strip(self._row_segments(row, width)).adjust_cell_length(width, self._base_style)
            if index == self.cursor:
                strip = strip.apply_style(self._style("task-list--cursor"))
            self._strips[cache_key] = strip
        return strip

    def _row_segments(self, row: int, width: int) -> list[Segment]:
        """The row's badge, key and attempt in ``width`` cells: the key gives way to the badges,
        shortened in the middle (``syn-…46720``) so its distinguishing tail stays on screen."""
        assert self._snap is not None
        view = self._snap.tasks
        state = _STATE_NAMES[int(view.state[row])]
        key = view.key(row)
        stall = int(view.stall[row])
        if stall and state in ("queued", "running"):
            badge = STALL_BADGES[_STALL_NAMES[stall]]
            age = self._stall_age.get(key)
            label = badge.glyph + (_age(age) if age is not None else "") + " "
        else:
            badge = PHASE_GLYPHS[_PHASE_NAMES[int(view.phase[row])]] if state == "running" else STATE_GLYPHS[state]
            label = badge.glyph + " "
        attempt = int(view.attempt[row])
        retry = f" ↻{attempt}" if attempt > 1 else ""
        out = [Segment(label, self._badge_style(badge)),
               Segment(middle(key, width - cell_len(label) - cell_len(retry)), self._base_style)]
        if retry:
            out.append(Segment(retry, self._style("task-list--dim")))
        return out

    @property
    def _base_style(self) -> Style:
        """``rich_style``, which walks every ancestor's styles: once per style change, not per row."""
        style = self._styles.get("")
        if style is None:
            style = self._styles[""] = self.rich_style
        return style

    def _badge_style(self, badge: Badge) -> Style:
        """The badge's theme colour over the list's background, as a component class would give it."""
        style = self._styles.get(badge.style)
        if style is None:
            # The variables the stylesheet was last built from (``get_css_variables`` would build
            # the whole colour system again, per badge, after every restyle).
            colour = Color.parse(self.app.theme_variables[f"wd-{badge.style}"])
            _, background = self.background_colors
            style = Style.from_color((background + colour).rich_color, background.rich_color if background.a else None)
            if badge.style in _BOLD:
                style += Style(bold=True)
            self._styles[badge.style] = style
        return style

    def _style(self, component: str) -> Style:
        style = self._styles.get(component)
        if style is None:
            style = self._styles[component] = self.get_component_rich_style(component)
        return style

    def on_focus(self, event: events.Focus) -> None:
        # Textual's own handler, less its repaint of the whole list (hence prevent_default, which
        # skips it): nothing a list shows follows the focus (``active`` marks the current list),
        # and with that repaint the prompt bar opening and closing made a whole-screen frame
        # (Textual repaints the box around all that is dirty: a list at the top and the bar at
        # the bottom span the screen).
        event.prevent_default()
        self.has_focus = True
        if self.parent is not None:
            self.parent.post_message(events.DescendantFocus(self))

    def on_blur(self, event: events.Blur) -> None:
        event.prevent_default()  # as on_focus
        self.has_focus = False
        if self.parent is not None:
            self.parent.post_message(events.DescendantBlur(self))

    def watch_has_focus(self, _has_focus: bool) -> None:
        # Textual restyles a widget whenever it gains or loses the focus, and a restyled list
        # repaints with its scrollbars, a whole column high: with the prompt bar opening at the
        # foot of the screen in the same frame, that made the frame the whole screen (Textual
        # composites the box around all that is dirty). No rule styles a list by its focus
        # (``-active`` marks the current one), so the restyle runs only if a stylesheet adds one.
        if self._styled_by_focus():
            super().watch_has_focus(_has_focus)

    def _styled_by_focus(self) -> bool:
        """Whether any rule that can match this list depends on the focus."""
        rules_map = self.app.stylesheet.rules_map
        return any(not rule.pseudo_classes.isdisjoint(("focus", "blur", "focus-within"))
                   for name in rules_map.keys() & self._selector_names for rule in rules_map[name])

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        # The list sets its own virtual size (its rows) and keeps its scrollbar in step with it
        # (``_set_length``); the virtual size a screen layout passes in never matches it, and
        # Textual then repaints the scrollbar: every layout (the prompt opening, say) repainted
        # all eight. So a layout that changes neither the list's size nor what its scrollbar
        # depends on leaves the list as it is.
        laid_out = (size, container_size, self.styles.scrollbar_size_vertical)
        if laid_out == self._laid_out:
            return False
        self._laid_out = laid_out
        return super()._size_updated(size, virtual_size, container_size, layout)

    def on_resize(self, event: events.Resize) -> None:
        self.virtual_size = Size(event.size.width, len(self._rows))
        self._laid_out = None
        self._painted = (-1, [])

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


def _thumb(bar: ScrollBar, virtual: int) -> tuple[int, int]:
    """Where ``bar``'s thumb starts and ends over ``virtual`` rows, in eighths of a cell: the
    arithmetic of Textual's ``ScrollBarRender.render_bar``, so equal spans paint the same bar."""
    size = bar.size.height
    window = bar.window_size if bar.window_size < virtual else 0
    if not (window and size and virtual and size != virtual):
        return (0, 0)
    thumb = max(1.0, window / (virtual / size))
    start = int((size - thumb) * (bar.position / (virtual - window)) * 8)
    return (start, start + ceil(thumb * 8))


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
