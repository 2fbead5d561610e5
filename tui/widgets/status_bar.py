"""The top line of every screen: pipeline, status, backend, progress, filter and screen tabs."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot

__all__ = ["StatusBar"]

_SCREENS = (("board", "1 Board"), ("workers", "2 Workers"), ("timeline", "3 Timeline"))


class StatusBar(Widget):
    """Where the run stands, in one line."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $foreground; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    screen_name: reactive[str] = reactive("board")
    """The screen this bar sits on (its tab is highlighted)."""

    def __init__(self, screen_name: str) -> None:
        super().__init__()
        self.screen_name = screen_name
        self._snap: EngineSnapshot | None = None
        self.paced = False
        """True: a new snapshot is only recorded; the screen says when to repaint (``refresh``)."""

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._update, init=True)
        self.watch(self.app, "filter_text", lambda _: self.refresh())
        self.watch(self.app, "readonly_note", lambda _: self.refresh())

    def _update(self, snap: EngineSnapshot | None) -> None:
        self._snap = snap
        if not self.paced:
            self.refresh()

    def render(self) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(" warpdeck ", "bold reverse")
        snap = self._snap
        if snap is None:
            line.append("  waiting for the engine…")
        else:
            status = "paused" if snap.feeder.state == "paused" and not snap.finished else snap.status
            mark = {"running": "●", "paused": "⏸", "finished": "✓", "drained": "✓"}.get(status, "■")
            line.append(f" {snap.pipeline} ", "bold")
            line.append(f"{mark} {status}  ", "bold" if status != "running" else "")
        text = getattr(self.app, "filter_text", "")
        if text:  # before the figures: on a narrow terminal the end of the line is cut
            line.append(f"filter /{text}/  ", "italic")
        if snap is not None:
            c = snap.counts
            line.append(f"{snap.backend}·{snap.device}  ")
            total = c.expected if c.expected is not None else c.total
            line.append(f"{c.done:,}/{total:,} done  ")
            if c.failed:
                line.append(f"✗{c.failed:,} failed  ", "bold")
            line.append(f"t {snap.t:,.1f}s  ")
        note = getattr(self.app, "readonly_note", "")
        if note:
            line.append(f"{note}  ", "italic")
        for name, label in _SCREENS:
            line.append(f" {label} ", "reverse bold" if name == self.screen_name else "")
        return line
