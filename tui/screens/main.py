"""What the three main screens (board, workers, timeline) share.

The decision this module protects: coming back to a screen costs one repaint from the lines its
widgets already hold, not a restyle of every widget on it. Textual restyles a whole screen each
time it is switched to, and that dropped every widget's cached lines: the board then rendered
all of them again, 40-70 ms while the key waited. Nothing a restyle would pick up can change
while a main screen is away: a theme change reaches it through ``App.refresh_css``, which Textual
runs on the switch itself for a screen styled before the change. The screens also hold the
prompt bar (``/`` and ``:``) on a layer of their own.
"""

from __future__ import annotations

from textual import events, on
from textual.screen import Screen

__all__ = ["MainScreen"]


class MainScreen(Screen[None]):
    """A screen of the control room's own (not a dialog)."""

    DEFAULT_CSS = """
    MainScreen { layers: default prompt; }
    """

    @on(events.ScreenResume)
    def _keep_styles(self, event: events.ScreenResume) -> None:
        # Handlers run subclass first: this one before Textual's own (``Screen``'s), which reads it.
        event.refresh_styles = False
