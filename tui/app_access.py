"""The typed way from a screen or widget to the control room app that holds it.

The decision this module protects: screens and widgets read the app's state (the snapshot, the
filter, the link) through ``warpdeck_app(self)``, typed as ``WarpdeckApp`` and checked, never by
``getattr(self.app, "snapshot", None)``. A renamed or retyped attribute is then a type error, not a
default value shown in silence, and a widget mounted in an app of another kind stops at once with a
message that says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.dom import DOMNode

if TYPE_CHECKING:
    from warpdeck.tui.app import WarpdeckApp

__all__ = ["warpdeck_app"]


def warpdeck_app(node: DOMNode) -> WarpdeckApp:
    """The control room ``node`` runs in; ``TypeError`` if it runs in another kind of app."""
    from warpdeck.tui.app import WarpdeckApp  # noqa: PLC0415 - app.py imports the screens, which import this

    app = node.app
    if not isinstance(app, WarpdeckApp):
        raise TypeError(f"{type(node).__name__} needs the warpdeck control room; it runs in {type(app).__name__}")
    return app
