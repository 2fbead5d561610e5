"""How the run's parts look in a snapshot: the feeder's state, an outage's hold, an attached room's
link, a worker's state.

The decision this module protects: these are contract types, read by the snapshot, the wire, the
exports and the control room, and written by the parts that measure them (the feeder, the outage
watch, the link meter, the worker monitor). They live at the bottom of the engine, with the other
frozen types, so a reader never imports the part that produces them: the engine's rooms import
one way (docs/design.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FeederState", "LinkView", "OutageView", "WorkerState"]


class FeederState(enum.StrEnum):
    """What the feeder is doing, as the control room shows it."""

    FILLING = "filling"
    FULL = "full"
    BACKPRESSURE = "backpressure"
    PAUSED = "paused"
    OUTAGE = "outage"
    DRAINING = "draining"
    EXHAUSTED = "exhausted"



class WorkerState(enum.StrEnum):
    """What the control room shows for a worker, most pressing first: an operator's quarantine,
    then death, then what the monitor cannot know (stale), then hung, late, online."""

    ONLINE = "online"
    LATE = "late"
    STALE = "stale"
    DEAD = "dead"
    QUARANTINED = "quarantined"
    HUNG = "hung"



@dataclass(frozen=True, slots=True)
class OutageView:
    """An outage as the control room and the headless output show it."""

    what: str
    """Which writes are held: ``sink``, ``journal`` or both (``sink, journal``)."""
    cause: str
    """The environment error, in words: ``no space left on device``."""
    path: str
    """Where: the directory the failing write went to."""
    since: float
    """When it began, in seconds since the engine started (snapshots' ``t``)."""
    held: int
    """Writes held right now (one per sink thread or journal writer)."""
    timeout_s: float
    """How long it may last before the run stops (``[faults] outage_timeout_s``)."""

    @property
    def reason(self) -> str:
        """One line: ``sink: no space left on device (outputs/)``."""
        return f"{self.what}: {self.cause} ({self.path})"



@dataclass(frozen=True, slots=True)
class LinkView:
    """An attached room's link as its client measured it; None in a snapshot from this process."""

    connected: bool
    """Whether the client is connected to the broker."""
    bytes_s: float
    """Telemetry bytes received a second, as they came over the wire (compressed)."""
    frames_s: float
    lag_s: float | None
    """The newest frame's arrival less its send time (the engine's clock against this machine's:
    their difference is in it); None before any frame."""
    behind_s: float
    """The newest lag above the least of the last minute: how far behind the frames run, free of
    any constant clock difference."""
    silent_s: float | None
    """Since the newest frame arrived; None before any."""
    lost: int
    """Frames that never arrived (gaps in the engine's frame numbers)."""
    refused: str = ""
    """The newest telemetry refused, and why (a version this build does not speak, …)."""
