"""The top line of every screen: pipeline, status, backend, progress, filter and screen tabs.

The decision this module protects: the line is always true and never cut mid-word. The status
it names follows the run as it is now (paused, draining, stalled because every worker is
quarantined, finished, drained), and failed and cancelled tasks are counted side by side. When
the line is wider than the terminal it drops whole parts, least important first (the backend, the
other screens' tabs, the elapsed time), marks the gap with ``…``, and abbreviates its counts
before it drops the run's status or progress. An attached room's line also tells its link to the
engine (``tui/attach.py``, ``link_words``): a room that shows a run must say how stale it may be.
"""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from warpdeck.engine.api import ALL_QUARANTINED, EngineSnapshot, EngineStatus, ended_words
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.attach import link_words, stale_words
from warpdeck.tui.fit import Part, count_forms, fit_parts

__all__ = ["StatusBar", "run_state"]

_SCREENS = (("board", "1 Board"), ("workers", "2 Workers"), ("timeline", "3 Timeline"))
_GAP = "  "
_ENDED: dict[EngineStatus, str] = {"finished": "✓", "drained": "✓", "cancelled": "⊘", "stopped": "■"}
"""The glyph of each status a run ends in."""


def run_state(snap: EngineSnapshot) -> tuple[str, str]:
    """The run's state as a glyph and words: what it is doing now, not only what it was started as."""
    if snap.finished or snap.status == "stopped":
        c = snap.counts
        words = ended_words(snap.status, c.failed, c.cancelled)
        glyph = _ENDED.get(snap.status, "■") if words == snap.status else "✗" if c.failed else "⊘"
        return glyph, words
    stale = stale_words(snap.link, snap.status) if snap.link is not None else None
    if stale is not None:  # attached, and the engine no longer heard: its state is not known
        return "?", stale
    if snap.outage is not None:
        return "⚠", "outage: holding"
    if snap.feeder.state == "paused":
        return "⏸", "paused"
    workers = snap.workers
    if (workers and all(w.state == "quarantined" for w in workers)) or any(
            s.note == ALL_QUARANTINED for s in snap.stalled):
        return "⚠", f"stalled: {ALL_QUARANTINED}"
    if snap.feeder.state == "draining":
        return "⇣", "draining"
    return ("●", "running") if snap.status == "running" else ("○", snap.status)


class StatusBar(Widget):
    """Where the run stands, in one line."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $foreground; text-wrap: nowrap; }
    """

    screen_name: reactive[str] = reactive("board")
    """The screen this bar sits on (its tab is highlighted)."""

    def __init__(self, screen_name: str) -> None:
        super().__init__()
        self.screen_name = screen_name
        self._snap: EngineSnapshot | None = None
        self.paced = False
        """True: the screen says which snapshot to show, and when (``show``): the line then tells the
        same snapshot as the board's columns, never a newer one beside them."""
        self._shown: EngineSnapshot | None = None

    def on_mount(self) -> None:
        app = warpdeck_app(self)
        self.watch(app, "snapshot", self._update, init=True)
        self.watch(app, "filter_text", self._note_changed)
        self.watch(app, "readonly_note", self._note_changed)

    def _update(self, snap: EngineSnapshot | None) -> None:
        self._snap = snap
        if not self.paced:
            self.refresh()

    def show(self, snap: EngineSnapshot) -> None:
        """Paced: show ``snap`` (the one the screen's other parts show) from the next repaint."""
        self._shown = snap
        self.refresh()

    def _note_changed(self, _text: str) -> None:
        self.refresh()

    def render(self) -> Text:
        width = self.size.width or 1_000
        line = Text(no_wrap=True, overflow="crop")
        for level in (0, 2, 3):  # exact counts, then ``70.5k/1.0M``, then ``70k/1M``
            parts = self._parts(level)
            kept, note = fit_parts(parts, width, note_gap=len(_GAP))
            if all(p in kept for p in parts if p.rank <= 1):
                break
        tabs = parts[-len(_SCREENS):]
        for part in kept:
            if note and part in tabs:  # what was dropped, and where it is, before the tabs
                line.append(note + _GAP, "italic")
                note = ""
            line.append_text(part.item)
        if note:
            line.append(note, "italic")
        return line

    def _parts(self, level: int) -> list[Part[Text]]:
        """The line's parts in order, each with its rank (0 kept first) and its own trailing gap;
        counts at ``level`` of ``count_forms``."""
        parts: list[Part[Text]] = []

        def add(text: str | Text, rank: int, style: str = "", where: str = "") -> None:
            item = Text(text, style) if isinstance(text, str) else text
            parts.append(Part(item, item.cell_len, rank, where))

        def n(value: int) -> str:
            forms = count_forms(value)
            return forms[min(level, len(forms) - 1)]

        add(" warpdeck ", 3, "bold reverse")
        snap = self._shown if self.paced else self._snap
        if snap is None:
            add("  waiting for the engine…", 0)
        else:
            glyph, words = run_state(snap)
            add(f" {snap.pipeline}{_GAP}", 2, "bold")
            add(f"{glyph} {words}{_GAP}", 0, "bold" if words != "running" else "")
        app = warpdeck_app(self)
        text = app.filter_text
        if text:
            add(f"filter /{text}/{_GAP}", 1, "italic")
        if snap is not None:
            c = snap.counts
            add(f"{snap.backend}·{snap.device}{_GAP}", 5)
            add(f"{n(c.done_all)}/{n(c.out_of)} done{_GAP}", 0)
            if c.earlier:  # a resume: the done count holds what the earlier run did
                add(f"({n(c.earlier)} earlier){_GAP}", 1, "italic")
            # An ended run whose words are more than its status counts them already (``ended_words``).
            said = (snap.finished or snap.status == "stopped") and words != snap.status
            if c.failed and not said:
                add(f"✗{n(c.failed)} failed{_GAP}", 0, "bold")
            if c.cancelled and not said:
                add(f"⊘{n(c.cancelled)} cancelled{_GAP}", 0, "bold")
            add(f"t {snap.t:,.1f}s{_GAP}", 3)
        note = app.readonly_note
        if note:
            add(f"{note}{_GAP}", 1, "italic")
        if snap is not None and snap.link is not None:  # attached: the link to the engine (tui/attach.py)
            add(f"{link_words(snap.link)}{_GAP}", 1, "italic")
        for name, label in _SCREENS:
            current = name == self.screen_name
            add(Text(f" {label} ", "reverse bold" if current else ""), 1 if current else 4)
        return parts  # the tabs last
