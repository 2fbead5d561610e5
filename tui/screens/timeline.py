"""Timeline: per lane, the last seconds of each phase, with overlap efficiency and the bound."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.keymap import bindings
from warpdeck.tui.screens.main import MainScreen
from warpdeck.tui.widgets.alert_banner import AlertBanner
from warpdeck.tui.widgets.figures_strip import FiguresStrip
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.lane_timeline import LaneTimeline
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.status_bar import StatusBar

__all__ = ["TimelineScreen"]


class TimelineScreen(MainScreen):
    """Lanes over time; zoom with [ and ], freeze and follow with f."""

    BINDINGS: ClassVar[list[BindingType]] = bindings("timeline")

    def __init__(self) -> None:
        super().__init__(name="timeline")

    def compose(self) -> ComposeResult:
        yield StatusBar("timeline")
        yield AlertBanner()
        yield LaneTimeline()
        yield FiguresStrip()
        yield KeyFooter()
        yield PromptBar()

    def on_mount(self) -> None:
        app = warpdeck_app(self)
        self.watch(app, "snapshot", self._changed, init=True)
        self.watch(app, "follow", self._follow, init=True)

    def on_screen_resume(self) -> None:
        self._changed(warpdeck_app(self).snapshot)

    def _follow(self, follow: bool) -> None:
        self.query_one(LaneTimeline).follow = follow

    def _changed(self, snap: EngineSnapshot | None) -> None:
        if snap is not None and self.is_current:
            self.query_one(LaneTimeline).show(snap)

    def action_zoom(self, step: int) -> None:
        self.query_one(LaneTimeline).zoom += step
