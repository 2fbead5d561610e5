"""What the worker monitor is tuned by and what it hands out: its configuration, its verdicts, the
worker rows the control room shows and the counts of what it refused.

The decisions this module protects (DESIGN.md section 5):
- **The defaults convict quickly and forgive a pause**: a worker that freezes while heartbeating
  every 0.5 s is convicted after about 1.8 s of silence (phi), 2.5 s at the latest (the backstop),
  and a 1 s pause (a GC, a broker hiccup) is forgiven. A configuration that could never show a
  worker late before convicting it, whose backstop fires between two heartbeats, or that needs more
  samples than its window holds is refused when it is made, naming the fields.
- **A verdict names the epoch**: fencing rejects that epoch's results, not the worker's, so a worker
  re-born under a new epoch takes work again.
- **What the UI reads is a copy** (``WorkerStatus``), never the monitor's live record; a worker's
  state is the most pressing that applies: an operator's quarantine, then death, then what the
  monitor cannot know (stale), then hung, late, online.
- **What was refused is counted, by why**, never silently lost (``MonitorCounters``, ``Refusal``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from warpdeck.engine.state.part_views import WorkerState

__all__ = [
    "MonitorConfig",
    "MonitorCounters",
    "Refusal",
    "Verdict",
    "VerdictKind",
    "VerdictReason",
    "WorkerStatus",
]


class MonitorConfig(BaseModel):
    """How quickly the monitor suspects and convicts workers. The defaults convict a worker that
    freezes while heartbeating every 0.5 s after about 1.8 s of silence (phi), 2.5 s at the latest
    (backstop), and forgive a 1 s pause: its heartbeat arrives 1.5 s after the previous one, at
    phi 2.2."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    interval_s: float = Field(default=0.5, gt=0, le=60)
    """The heartbeat interval expected until a worker's window has samples. A worker that promises
    a longer one in its birth is judged by its own, and its backstop and pause grow in proportion."""
    phi_threshold: float = Field(default=8.0, gt=0)
    """phi at which a silent worker is convicted (Akka and Cassandra use 8)."""
    late_phi: float = Field(default=3.0, gt=0)
    """phi above which a worker is shown late (with the defaults: after about 1.55 s of silence)."""
    min_std_s: float = Field(default=0.1, gt=0)
    """Floor under the learned standard deviation, so a steady worker is not convicted for jitter."""
    acceptable_pause_s: float = Field(default=0.75, ge=0)
    """Added to the expected interval: the pause (GC, broker hiccup) forgiven without suspicion.
    Without it phi reaches 8 after 1.02 s of silence, so a 1 s pause would convict."""
    backstop_s: float = Field(default=2.5, gt=0)
    """Silence that convicts whatever phi says (a window that learned erratic intervals is slow)."""
    grace_s: float = Field(default=3.0, ge=0)
    """After the monitor reconnects, nobody is convicted for silence for this long."""
    stuck_after_s: float = Field(default=60.0, gt=0)
    """Busy with progress frozen for this long makes a worker hung (``set_deadline`` per worker)."""
    window: int = Field(default=200, ge=3, le=10_000)
    """Heartbeat intervals each detector remembers."""
    min_samples: int = Field(default=3, ge=1)
    """Intervals needed before a worker is judged by its own rhythm rather than ``interval_s``."""
    forget_after_s: float = Field(default=300.0, gt=0)
    """A worker dead this long is forgotten (its record goes; a dead worker holds no work: its
    leases were taken back when it was convicted), as is one known only from a retained birth and
    not heard for this long."""
    max_workers: int = Field(default=10_000, ge=1)
    """Worker records kept at most. A new worker's birth beyond it forgets the oldest dead record,
    else the oldest known only from a retained birth and unheard past its grace and backstop, else
    it is refused."""

    @model_validator(mode="after")
    def _ordered(self) -> MonitorConfig:
        if self.late_phi >= self.phi_threshold:
            raise ValueError(f"late_phi ({self.late_phi}) must be below phi_threshold ({self.phi_threshold})")
        if self.backstop_s <= self.interval_s:
            raise ValueError(f"backstop_s ({self.backstop_s}) must exceed interval_s ({self.interval_s})")
        if self.min_samples > self.window:
            raise ValueError(f"min_samples ({self.min_samples}) must not exceed window ({self.window})")
        return self


class VerdictKind(enum.StrEnum):
    """What changed: a worker was convicted, began to hang, or came back (hang over, or re-born)."""

    DEAD = "dead"
    HUNG = "hung"
    RECOVERED = "recovered"


VerdictReason = Literal["will", "graceful", "silent", "stuck", "progress", "idle", "rebirth"]
Refusal = Literal["unborn", "too_many_workers"]
"""Why an event made no change: the worker (or that epoch of it) was never born here, or a new worker's birth found
every record in use."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One change the rest of the engine acts on (reassign leases, publish an event). Dead verdicts
    name the epoch, because fencing rejects that epoch's results, not the worker's."""

    worker_id: str
    epoch: int
    kind: VerdictKind
    reason: VerdictReason
    """dead: will, graceful, silent; hung: stuck; recovered: progress, idle, rebirth."""
    at: float
    phi: float
    """The detector's phi at ``at`` (0.0 when the worker was never heard)."""
    silence_s: float | None
    """Seconds since the last sign of life the monitor could hear (counted from its reconnection when it was
    disconnected in between); None when it never heard the worker."""


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One worker as of ``views(now)``: a copy, so the UI never reads the monitor's live state."""

    worker_id: str
    state: WorkerState
    epoch: int
    heartbeat_age_s: float | None
    """Seconds since this epoch's last heartbeat; None before its first."""
    phi: float
    progress: int | None
    busy: bool
    last_seq: int | None
    info: Mapping[str, object]
    """The birth's details (host, pid, device, ...); empty when no birth of this epoch was seen."""
    convicted_at: float | None
    """When this epoch was convicted; None while it lives."""
    hung_since: float | None
    """When the current hung episode began; None when not hung."""
    missed_heartbeats: int
    """Heartbeats of this epoch that never arrived (sequence gaps)."""


@dataclass(frozen=True, slots=True)
class MonitorCounters:
    """Messages the monitor counted rather than acted on."""

    stale_epoch: int
    """Births, heartbeats and deaths from an epoch older than the newest one known."""
    missed_heartbeats: int
    """Heartbeats whose sequence numbers show that earlier ones never arrived (summed)."""
    duplicate_heartbeats: int
    """Heartbeats repeating the previous sequence number (QoS 1 redelivery)."""
    after_conviction: int
    """Heartbeats from an epoch already convicted (a frozen process that woke up)."""
    unborn: int = 0
    """Heartbeats and deaths of a worker, or an epoch of it, never born here."""
    too_many_workers: int = 0
    """Births of new workers refused because every record was in use (``max_workers``)."""
    forgotten: int = 0
    """Records forgotten: dead (or never heard) for ``forget_after_s``, or to make room."""
    workers_lost: int = 0
    """Workers of this run convicted, each once per record (a worker forgotten and born again counts again)."""
