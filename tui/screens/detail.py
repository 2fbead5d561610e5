"""Task detail: a task's whole story (tui/widgets/task_story.py), refreshed with each snapshot.

The decision this module protects: the screen only asks the link for the task's detail (in a worker of
its own group, the newest question winning) and hands the answer to its ``TaskStory``; what the story
says and how it is laid out is the engine's and the widget's.
"""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.keymap import reading_bindings
from warpdeck.tui.widgets.task_story import TaskStory

__all__ = ["DetailScreen"]


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
            yield TaskStory(self.key, id="detail-body")

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
            bodies.first(TaskStory).show(detail)
