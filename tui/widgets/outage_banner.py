"""The outage banner: shown under the status bar on every screen while an outage holds the run.

The decision this module protects: an outage (a full, read-only or failing disk, engine/run/outage.py)
is the one state in which the run waits on the operator's machine rather than on its work, so it
is said in words on every screen, with its age, what is held and when the run will stop, and
nothing of it is cut: on a narrow terminal the banner wraps onto more lines.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot, OutageView
from warpdeck.tui.app_access import warpdeck_app

__all__ = ["OutageBanner", "outage_text"]


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def outage_text(view: OutageView, now: float) -> str:
    """The banner's words for ``view`` at engine time ``now`` (a snapshot's ``t``)."""
    age = now - view.since
    if view.timeout_s <= 0:
        end = "stopping now"
    else:
        end = f"stops in {_age(view.timeout_s - age)} if it lasts"
    return (f"⚠ outage {_age(age)}  {view.reason}  ·  holding: nothing admitted, nothing fails, carries on "
            f"when writes succeed  ·  {end}")


class OutageBanner(Widget):
    """Hidden unless the current snapshot carries an outage."""

    DEFAULT_CSS = """
    OutageBanner { height: auto; background: $error; color: $text; text-style: bold; padding: 0 1; display: none; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._text = ""

    def on_mount(self) -> None:
        self.watch(warpdeck_app(self), "snapshot", self._update, init=True)

    def _update(self, snap: EngineSnapshot | None) -> None:
        view = snap.outage if snap is not None and snap.status == "running" else None
        text = outage_text(view, snap.t) if view is not None and snap is not None else ""
        self.display = bool(text)
        if text != self._text:
            self._text = text
            self.refresh(layout=True)

    def render(self) -> Text:
        return Text(self._text)
