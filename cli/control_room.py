"""``warpdeck run`` and ``warpdeck demo`` with the control room: the engine on its own thread,
the Textual app in the foreground, the run's report when the app closes."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from warpdeck.cli.run_log import LOG_NAME
from warpdeck.engine.api import (
    ControlSettings,
    EngineSnapshot,
    ExportSettings,
    GateDecision,
    PipelineSpec,
    RunReport,
    StepsReport,
)
from warpdeck.themes import BUILTIN_THEMES, all_themes
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import EngineLink, Link

__all__ = ["UnknownTheme", "check_theme", "run_control_room"]


class UnknownTheme(ValueError):
    """``--theme`` named a theme that is neither built in nor in the user's theme folder."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"no theme {name!r}; themes: {', '.join(known)}")
        self.name = name
        self.known = known


def check_theme(name: str | None) -> None:
    """Refuse an unknown ``--theme`` before anything starts."""
    if name is None or name in BUILTIN_THEMES:
        return
    themes, _ = all_themes()
    if name not in themes:
        raise UnknownTheme(name, sorted(themes))


def run_remote(link: Link, *, theme: str | None = None) -> int:
    """The control room over an attached or replayed engine, until the user quits."""
    try:
        WarpdeckApp(link, theme=theme).run()
    finally:
        link.stop()
    return 0


def run_control_room(spec: PipelineSpec, run_dir: Path, *, theme: str | None = None,
                     retry_failed: bool = False, journal: bool | None = None,
                     control: ControlSettings | None = None, headless: bool = False,
                     exports: ExportSettings | None = None,
                     decisions: dict[str, GateDecision] | None = None) -> RunReport | StepsReport | None:
    """Run ``spec`` under the control room until the user quits; the report, if the run got that far.
    Raises what stops the engine from starting (a bad run directory, a missing backend).

    Only the user stops the run: if the control room itself fails, the run goes on headless until
    it ends (ctrl+c stops it), and one line on stderr says how to attach again. ``headless``:
    the app draws nowhere (tests)."""
    options: dict[str, Any] = {"decisions": decisions or {}} if spec.steps else {}  # gates decided before the run
    link = EngineLink(spec, run_dir, retry_failed=retry_failed, journal=journal, control=control, exports=exports,
                      **options)
    link.open()
    app = WarpdeckApp(link, theme=theme, log_path=run_dir / LOG_NAME)
    try:
        app.run(headless=headless)
        if app.crash is not None and not link.engine.wait(0):
            _carry_on_headless(app, link, control)
    finally:
        link.stop()
    if spec.steps:
        return link.engine.steps_report
    report = link.engine.report
    if report is not None and app.stop_signals.received and report.status == "stopped" and not report.stopped_by:
        report = report.model_copy(update={"stopped_by": "signal"})  # SIGTERM or SIGHUP, as headless says
    return report


def _carry_on_headless(app: WarpdeckApp, link: EngineLink, control: ControlSettings | None) -> None:
    """The app failed while the engine runs: say so, and how to get the control room back."""
    end = time.monotonic() + 3.0  # an app that failed at once: the embedded broker may still be starting
    while not _broker(snap := link.engine.latest) and control is not None and time.monotonic() < end:
        time.sleep(0.05)
    broker = _broker(snap)
    pipeline = snap.pipeline if snap is not None else link.engine.spec.name
    again = (f"attach again with: warpdeck attach {broker} --pipeline {pipeline}" if broker
             else "no control plane to attach through (--broker none)")
    print(f"warpdeck: the control room stopped on an error ({type(app.crash).__name__}; see "
          f"{app.log_path}); the run goes on headless, ctrl+c stops it; {again}", file=sys.stderr, flush=True)
    app.log_crash()
    try:
        while not link.engine.wait(0.5):
            pass
    except KeyboardInterrupt:
        print("warpdeck: interrupted; stopping the run", file=sys.stderr, flush=True)


def _broker(snap: EngineSnapshot | None) -> str:
    return snap.control.broker if snap is not None and snap.control is not None else ""
