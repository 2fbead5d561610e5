"""What the three main screens (board, workers, timeline) share.

The decision this module protects: coming back to a screen costs one repaint from the lines its
widgets already hold, not a restyle of every widget on it. Textual restyles a whole screen each
time it is switched to, and that dropped every widget's cached lines: the board then rendered
all of them again, 40-70 ms while the key waited. Nothing a restyle would pick up can change
while a main screen is away: a theme change reaches it through ``App.refresh_css``, which Textual
runs on the switch itself for a screen styled before the change. The screens also hold the
prompt bar (``/`` and ``:``) on a layer of their own.

A second decision: a frame is painted as soon as the screen is idle with something to paint and
the last frame began at least a frame period (1/60 s) ago. Textual paints on a fixed 60 Hz grid
instead, and after a frame longer than the period it skips to the grid point after next: a key
whose lines were ready 1 ms after such a frame waited up to 33 ms, with the loop idle, for its
frame. The 60 Hz ceiling stays.
"""

from __future__ import annotations

import asyncio
import time

from textual import events, on
from textual.screen import UPDATE_PERIOD, Screen

__all__ = ["MainScreen"]


class MainScreen(Screen[None]):
    """A screen of the control room's own (not a dialog)."""

    DEFAULT_CSS = """
    MainScreen { layers: default prompt; }
    """

    _frame_at: float = 0.0
    """When the last frame with something to paint began (``time.monotonic``)."""
    _wake: asyncio.TimerHandle | None = None

    @on(events.ScreenResume)
    def _keep_styles(self, event: events.ScreenResume) -> None:
        # Handlers run subclass first: this one before Textual's own (``Screen``'s), which reads it.
        event.refresh_styles = False

    def _wants_frame(self) -> bool:
        return bool(self._layout_required or self._scroll_required or self._repaint_required
                    or self._recompose_required or self._dirty_widgets)

    def _on_timer_update(self) -> None:
        if self._wants_frame():
            self._frame_at = time.monotonic()
        super()._on_timer_update()

    async def _on_idle(self, event: events.Idle) -> None:
        # Runs before Textual's own (``Screen._on_idle``), which resumes the 60 Hz frame timer.
        if not self.is_current or self.app._batch_count or not self._wants_frame():
            return
        wait = self._frame_at + UPDATE_PERIOD - time.monotonic()
        if wait <= 0:
            event.prevent_default()  # painted here: Textual's handler has nothing left to do
            self._on_timer_update()
            await self._invoke_and_clear_callbacks()  # what runs "after refresh"
        elif self._wake is None:
            self._wake = asyncio.get_running_loop().call_later(wait, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self.check_idle()
