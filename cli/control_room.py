"""``warpdeck run`` and ``warpdeck demo`` with the control room: the engine on its own thread,
the Textual app in the foreground, the run's report when the app closes."""

from __future__ import annotations

from pathlib import Path

from warpdeck.engine.api import ControlSettings, PipelineSpec, RunReport
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
                     control: ControlSettings | None = None) -> RunReport | None:
    """Run ``spec`` under the control room until the user quits; the report, if the run got that far.
    Raises what stops the engine from starting (a bad run directory, a missing backend)."""
    link = EngineLink(spec, run_dir, retry_failed=retry_failed, journal=journal, control=control)
    link.open()
    try:
        WarpdeckApp(link, theme=theme).run()
    finally:
        link.stop()
    return link.report
