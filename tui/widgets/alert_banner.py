"""The alert banner: shown under the status bar on every screen while an outage holds the run, or
once a part of the engine has stopped on an error.

The decisions this module protects:
- An outage (a full, read-only or failing disk, engine/edges/outage.py) is the one state in which the
  run waits on the operator's machine rather than on its work, so it is said in words on every
  screen, with its age, what is held and when the run will stop.
- No part of the engine dies in silence: when the control plane stops on an error (its traceback
  in the run's log), the room says so at once, what no longer works and where the traceback is.
  Before (issue 29), the plane died mid-run with one line in the log, and the room showed a
  worker's heartbeat age frozen at 190 ms for as long as it ran.
Nothing of either is cut: on a narrow terminal the banner wraps onto more lines.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widget import Widget

from warpdeck.engine.api import ControlView, EngineSnapshot, OutageView
from warpdeck.tui.app_access import warpdeck_app

__all__ = ["AlertBanner", "outage_text", "stopped_text"]


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


def stopped_text(control: ControlView, log: Path | None) -> str:
    """The banner's words for a control plane that stopped on an error."""
    where = f"  ·  traceback in {log}" if log is not None else ""
    return (f"⚠ control plane stopped: {control.error}  ·  workers are no longer heard and other rooms cannot "
            f"command this run; the run goes on{where}")


class AlertBanner(Widget):
    """Hidden unless the current snapshot carries an outage or a stopped control plane."""

    DEFAULT_CSS = """
    AlertBanner { height: auto; background: $error; color: $text; text-style: bold; padding: 0 1; display: none; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._text = ""

    def on_mount(self) -> None:
        self.watch(warpdeck_app(self), "snapshot", self._update, init=True)

    def _update(self, snap: EngineSnapshot | None) -> None:
        lines = []
        if snap is not None and snap.status == "running" and snap.outage is not None:
            lines.append(outage_text(snap.outage, snap.t))
        if snap is not None and snap.control is not None and snap.control.stopped:
            lines.append(stopped_text(snap.control, getattr(warpdeck_app(self), "log_path", None)))
        text = "\n".join(lines)
        self.display = bool(text)
        if text != self._text:
            self._text = text
            self.refresh(layout=True)

    def render(self) -> Text:
        return Text(self._text)
