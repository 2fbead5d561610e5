"""Workers: state, heartbeat age, phi, lanes busy, progress and device figures per worker."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.widgets import Static

from warpdeck.engine.api import EngineSnapshot, Quarantine, Release
from warpdeck.tui.keymap import bindings
from warpdeck.tui.screens.main import MainScreen
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.status_bar import StatusBar
from warpdeck.tui.widgets.worker_table import WorkerTable

__all__ = ["WorkersScreen"]


class WorkersScreen(MainScreen):
    """One row per worker, updated in place."""

    BINDINGS: ClassVar = bindings("workers")

    DEFAULT_CSS = """
    WorkersScreen WorkerTable { height: 1fr; }
    WorkersScreen .summary { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self) -> None:
        super().__init__(name="workers")

    def compose(self) -> ComposeResult:
        yield StatusBar("workers")
        yield Static("", classes="summary", id="workers-summary")
        yield WorkerTable()
        yield FiguresStrip()
        yield KeyFooter()
        yield PromptBar()

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._changed, init=True)
        self.query_one(WorkerTable).focus()

    def on_screen_resume(self) -> None:
        self._changed(getattr(self.app, "snapshot", None))

    def _changed(self, snap: EngineSnapshot | None) -> None:
        if snap is None or not self.is_current:
            return
        self.query_one(WorkerTable).show(snap)
        states: dict[str, int] = {}
        for w in snap.workers:
            states[w.state] = states.get(w.state, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no workers yet"
        self.query_one("#workers-summary", Static).update(f"{len(snap.workers)} worker(s): {summary}  ·  s sorts")

    def action_sort(self) -> None:
        title = self.query_one(WorkerTable).cycle_sort()
        self.notify(f"workers sorted by {title}", timeout=2)

    async def action_quarantine(self) -> None:
        """Quarantine the highlighted worker, or release it if it is quarantined."""
        table = self.query_one(WorkerTable)
        wid = table.current_id
        snap = getattr(self.app, "snapshot", None)
        if wid is None or snap is None:
            self.notify("no worker highlighted", severity="warning", timeout=2)
            return
        state = next((w.state for w in snap.workers if w.id == wid), "")
        app = self.app
        if state == "quarantined":
            await app.send(Release(worker=wid), undo=("release", Quarantine(worker=wid)))  # type: ignore[attr-defined]
        else:
            await app.send(Quarantine(worker=wid), undo=("quarantine", Release(worker=wid)))  # type: ignore[attr-defined]

    def highlight(self, worker_id: str) -> bool:
        """Move the cursor to a worker's row; False if there is no such worker."""
        table = self.query_one(WorkerTable)
        try:
            table.move_cursor(row=table.get_row_index(worker_id))
        except KeyError:
            return False
        return True
