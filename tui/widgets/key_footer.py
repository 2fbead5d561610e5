"""The key footer: Textual's ``Footer``, rebuilt only when the keys it shows change.

The decision this module protects: Textual rebuilds its footer (a widget per key, then a layout of
the whole screen) whenever the focus moves, because the active bindings may differ. On the board
they never do between two task lists, and that rebuild cost more than the rest of a key press:
so the footer compares what it would show and keeps itself when that is unchanged. While the
prompt bar is open it covers the footer, and the keys it shows are the input's: the footer keeps
the keys it had, so opening and closing the prompt rebuild nothing.
"""

from __future__ import annotations

from collections.abc import Hashable

from textual.screen import Screen
from textual.widgets import Footer

from warpdeck.tui.widgets.prompt_bar import PromptBar

__all__ = ["KeyFooter"]


class KeyFooter(Footer):
    """A footer that skips rebuilding when the shown keys, labels and states are the same."""

    def __init__(self) -> None:
        super().__init__()
        self._shown: Hashable = None

    def bindings_changed(self, screen: Screen[object]) -> None:
        focused = screen.focused
        if focused is not None and any(isinstance(node, PromptBar) for node in focused.ancestors):
            return
        shown = tuple((binding.key, binding.action, binding.description, enabled, tooltip)
                      for _, binding, enabled, tooltip in screen.active_bindings.values() if binding.show)
        if shown == self._shown:
            return
        self._shown = shown
        super().bindings_changed(screen)
