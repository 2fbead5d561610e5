"""Glyphs and short labels for every state, phase, stall reason and worker state.

The decision this module protects: every state is readable by its glyph alone (``NO_COLOR``, a
monochrome terminal, a colour-blind reader), so colour only ever repeats what the glyph says.
Each entry also names the theme variable (``wd-*``) and component class that colour it.
"""

from __future__ import annotations

from dataclasses import dataclass

from warpdeck.engine.api import PhaseName, StallName, StateName, WorkerState

__all__ = ["PHASE_GLYPHS", "STALL_BADGES", "STATE_GLYPHS", "WORKER_GLYPHS", "Badge"]


@dataclass(frozen=True, slots=True)
class Badge:
    """A glyph, a short label and the component-class suffix (``state-queued`` and so on)."""

    glyph: str
    label: str
    style: str


STATE_GLYPHS: dict[StateName, Badge] = {
    "queued": Badge("○", "queued", "queued"),
    "running": Badge("▶", "running", "compute"),
    "done": Badge("✓", "done", "done"),
    "failed": Badge("✗", "failed", "failed"),
    "cancelled": Badge("⊘", "cancelled", "cancelled"),
}

PHASE_GLYPHS: dict[PhaseName, Badge] = {
    "fill": Badge("◐", "fill", "fill"),
    "h2d": Badge("↑", "h2d", "h2d"),
    "compute": Badge("▶", "compute", "compute"),
    "d2h": Badge("↓", "d2h", "d2h"),
    "sink": Badge("⇲", "sink", "sink"),
}

STALL_BADGES: dict[StallName, Badge] = {
    "memory": Badge("◌", "mem", "stall-memory"),
    "control": Badge("⏸", "ctl", "stall-control"),
    "backpressure": Badge("⇥", "bp", "stall-backpressure"),
    "worker_lost": Badge("☠", "lost", "stall-worker-lost"),
    "hung": Badge("⧗", "hung", "stall-hung"),
}

WORKER_GLYPHS: dict[WorkerState, Badge] = {
    WorkerState.ONLINE: Badge("●", "online", "worker-online"),
    WorkerState.LATE: Badge("◔", "late", "worker-late"),
    WorkerState.STALE: Badge("◌", "stale", "worker-stale"),
    WorkerState.DEAD: Badge("✗", "dead", "worker-dead"),
    WorkerState.QUARANTINED: Badge("⊘", "quarantined", "worker-quarantined"),
    # Heartbeats flow, progress does not: the stall colour of a hung task.
    WorkerState.HUNG: Badge("⧗", "hung", "stall-hung"),
}
