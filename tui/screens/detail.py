"""Task detail: state, phase, stall reason, attempts with their history, and the traceback."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from warpdeck.engine.api import EngineSnapshot, TaskDetail
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.glyphs import STALL_BADGES, STATE_GLYPHS
from warpdeck.tui.keymap import reading_bindings

__all__ = ["DetailScreen", "render_detail"]


def render_detail(d: TaskDetail) -> Group:
    """Everything known about one task, as rich renderables."""
    badge = STATE_GLYPHS.get(d.state) if d.state != "unknown" else None
    head = Text()
    head.append(f"{badge.glyph if badge else '?'} {d.key}\n", "bold")
    head.append(f"state {d.state}")
    if d.state == "running":
        head.append(f" · phase {d.phase}")
    if d.admitted:
        head.append(f" · attempt {d.attempt} · batch {d.batch if d.batch >= 0 else '—'}")
    head.append("\n")
    if d.note:
        head.append(f"{d.note}\n", "italic")
    if d.stall != "none":
        stall = STALL_BADGES.get(d.stall)
        head.append(f"stalled: {stall.glyph if stall else ''} {d.stall}", "bold")
        head.append(f" — {d.stall_note}\n" if d.stall_note else "\n")
    if d.error:
        head.append(f"error: {d.error}\n", "bold")
    history = Table(title="attempts", title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in ("#", "ended as", "reason"):
        history.add_column(col)
    for a in d.history:
        history.add_row(str(a.attempt), a.outcome, a.reason)
    parts: list[Text | Table] = [head]
    if d.history:
        parts.append(history)
    if d.traceback:
        parts.append(Text("\ntraceback (most recent call last is at the bottom):", style="bold"))
        parts.append(Text(d.traceback.rstrip()))
    return Group(*parts)


class DetailScreen(ModalScreen[None]):
    """One task in full; refreshed with each snapshot while open."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "dismiss", "Close"),
        *reading_bindings(),  # the command line and the filter (a prompt screen opens over this one)
    ]

    DEFAULT_CSS = """
    DetailScreen { align: center middle; }
    DetailScreen > VerticalScroll { width: 90%; height: 80%; border: thick $accent; background: $surface;
                                    padding: 0 1; }
    """

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(f"loading {self.key}…", id="detail-body")

    def on_mount(self) -> None:
        self.watch(warpdeck_app(self), "snapshot", self._snapshot_changed, init=True)

    def _snapshot_changed(self, _snap: EngineSnapshot | None) -> None:
        self.reload()

    @work(group="detail", exclusive=True)
    async def reload(self) -> None:
        """Ask the link for the task's detail and show it."""
        detail = await warpdeck_app(self).link.detail(self.key)
        bodies = self.query("#detail-body")  # none once the screen was closed during the wait (the key fuzz)
        if bodies:
            bodies.first(Static).update(render_detail(detail) if detail is not None else f"no task {self.key!r}")
