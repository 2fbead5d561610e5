"""What happens during a run, as a stream of events for the exporters that write it elsewhere.

The decisions this module protects:
- Snapshots are latest-wins and carry only the newest batch records; a trace or a counter must see
  every batch, stall, command and conviction. The run's parts emit them here, on the engine's loop,
  one event per batch (a stall that hits a whole batch is one event with its task count), and
  listeners (engine/edges/trace_export.py, engine/edges/metrics_export.py) subscribe.
- A listener must be quick (append to a buffer, bump a counter) and must not raise: one that
  raises is dropped with its error logged, and the run goes on; an exporter never stops a run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.task_states import StallName

__all__ = ["BatchFinished", "CommandEvent", "RunEvent", "RunEvents", "StallEvent", "WorkerConvicted", "WorkerGone",
           "WorkerReborn", "WorkerWaiting", "worker_line"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchFinished:
    """A batch left its lane (its outputs written, or it failed: ``record.ok``), under ``worker``'s
    lease of ``epoch``."""

    record: BatchRecord
    worker: str
    epoch: int


@dataclass(frozen=True, slots=True)
class StallEvent:
    """``tasks`` tasks began (``began``) or stopped being stalled for ``reason``: a batch's on a lane
    (``batch``, ``lane``), or tasks waiting in the queue (``batch`` and ``lane`` -1). ``t`` is on
    ``time.perf_counter``'s clock; an ending carries how long the stall lasted."""

    t: float
    reason: StallName
    tasks: int
    began: bool
    batch: int = -1
    lane: int = -1
    note: str = ""
    lasted_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CommandEvent:
    """An operator's command, applied or refused by the engine (``verb`` is its ``kind``)."""

    t: float
    verb: str
    applied: bool
    tasks: int
    message: str


@dataclass(frozen=True, slots=True)
class WorkerConvicted:
    """A worker convicted under ``epoch`` (``cause``: its Will, silence, a hang, Ray's report)."""

    t: float
    worker: str
    epoch: int
    cause: str
    batches: int = 0
    """Batches and tasks taken back from it (0 and 0: the second report of a conviction, or a worker that held
    nothing)."""
    tasks: int = 0


@dataclass(frozen=True, slots=True)
class WorkerReborn:
    """A convicted worker works again under a newer ``epoch`` (a Ray actor restarted in a new
    process ``pid``, or re-born in the same one); pid 0 where unknown."""

    t: float
    worker: str
    epoch: int
    pid: int = 0


@dataclass(frozen=True, slots=True)
class WorkerWaiting:
    """A worker is not running and why (``restarting: waiting for 1 CPU``: Ray restarts it but no
    node has room for it)."""

    t: float
    worker: str
    note: str


@dataclass(frozen=True, slots=True)
class WorkerGone:
    """A worker that will not come back (Ray will not restart the actor): its lanes stop."""

    t: float
    worker: str
    reason: str


RunEvent = BatchFinished | StallEvent | CommandEvent | WorkerConvicted | WorkerReborn | WorkerWaiting | WorkerGone

_DETAIL = 160
"""The most of a cause's or reason's detail a worker line repeats."""


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def worker_line(event: RunEvent) -> str | None:
    """A worker event in one line, as the headless display and the control room both say it
    (``worker ray-1 back under epoch 9 (pid 222)``); None for an event that is not a worker's."""
    match event:
        case WorkerConvicted():
            cause, _, detail = event.cause.partition(":")
            line = (f"worker {event.worker} convicted ({cause.strip() or 'unknown'}): "
                    f"{_count(event.batches, 'batch', 'batches')}, {_count(event.tasks, 'task', 'tasks')} requeued")
            return line + (f" ({detail.strip()[:_DETAIL]})" if detail.strip() else "")
        case WorkerReborn():
            pid = f" (pid {event.pid})" if event.pid else ""
            return f"worker {event.worker} back under epoch {event.epoch}{pid}"
        case WorkerWaiting():
            return f"worker {event.worker} {event.note}"
        case WorkerGone():
            return f"worker {event.worker} gone: Ray will not restart it ({event.reason[:_DETAIL]})"
    return None


class RunEvents:
    """The run's event stream: ``emit`` on the engine's loop, ``subscribe`` from anywhere before
    the run starts (or on the loop)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[RunEvent], None]] = []

    def subscribe(self, listener: Callable[[RunEvent], None]) -> Callable[[], None]:
        """Call ``listener`` with each event; returns a function that unsubscribes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    @property
    def heard(self) -> bool:
        """Whether anyone listens (emitters skip building events nobody reads)."""
        return bool(self._listeners)

    def emit(self, event: RunEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("a run-event listener failed and was dropped; the run goes on")
                self._listeners.remove(listener)


def now() -> float:
    """The events' clock (the batch records' too)."""
    return time.perf_counter()
