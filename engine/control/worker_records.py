"""The monitor's live record of each worker, and the bounded table that holds them.

The decisions this module protects (docs/control-plane.md, "Bounded state"):
- **Records are bounded**, whatever is published to the broker: at most ``max_workers`` of them.
  Only a birth makes one (``WorkerMonitor`` refuses a heartbeat or death of an unknown worker).
- **The dead are forgotten**: a record dead for ``forget_after_s``, or known only from a retained
  birth and not heard for that long, goes; whoever else remembers the worker learns which from
  ``take_forgotten``.
- **Room is made from what cannot be heard again**: a birth past the ceiling forgets the oldest
  dead record; failing that, the oldest known only from a retained birth and unheard for longer
  than a live worker could be (the reconnection grace and its backstop; never while the input
  lags, when silence proves nothing); failing that there is no room. A record whose worker may be
  alive is never taken: its heartbeats would no longer be heard.

Only ``WorkerMonitor`` (engine/control/monitor.py) touches these; it decides when a worker is dead
or heard, this module how long that is remembered.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType

from .phi import PhiAccrual

__all__ = ["WorkerRecord", "WorkerRecords"]

_NEVER = math.inf
_EMPTY: Mapping[str, object] = MappingProxyType({})


class WorkerRecord:
    """The monitor's live record of one worker; only ``WorkerMonitor`` touches it."""

    __slots__ = (
        "accrual",
        "backstop_s",
        "busy",
        "convicted_at",
        "due",
        "epoch",
        "hung_due",
        "hung_since",
        "info",
        "last_hb",
        "last_seen",
        "last_seq",
        "lost",
        "missed",
        "ours",
        "progress",
        "stuck_since",
        "worker_id",
    )

    def __init__(self, worker_id: str, epoch: int, accrual: PhiAccrual, backstop_s: float) -> None:
        self.worker_id = worker_id
        self.epoch = epoch
        self.accrual = accrual
        self.backstop_s = backstop_s
        self.info: Mapping[str, object] = _EMPTY
        self.last_seen: float | None = None
        """Last sign of life of this epoch (its birth or a heartbeat); None if only its death was heard."""
        self.last_hb: float | None = None
        self.last_seq: int | None = None
        self.progress: int | None = None
        self.busy = False
        self.missed = 0
        self.convicted_at: float | None = None
        self.due = _NEVER
        """Silence conviction is checked no earlier than this (a deadline precomputed per heartbeat)."""
        self.stuck_since = 0.0
        self.hung_due = _NEVER
        self.hung_since: float | None = None
        self.ours = False
        """Heard in this run (a birth sent while we listened, or a heartbeat), this epoch or before."""
        self.lost = False
        """Convicted once already (counted in ``workers_lost``), this epoch or before."""


class WorkerRecords:
    """Every worker's record by id, in the order first made (a new epoch keeps its worker's place),
    with the dead and the unheard ones by when they became so, oldest first."""

    __slots__ = ("_forget_after_s", "_forgotten", "_grace_s", "_max", "by_id", "dead", "forgotten", "unheard")

    def __init__(self, max_workers: int, forget_after_s: float, grace_s: float) -> None:
        self._max = max_workers
        self._forget_after_s = forget_after_s
        self._grace_s = grace_s
        self.by_id: dict[str, WorkerRecord] = {}
        """The records. ``WorkerMonitor`` reads it directly: every heartbeat looks a worker up here."""
        self.dead: OrderedDict[str, float] = OrderedDict()
        """Records of dead workers, and of workers known only from a retained birth, by when they became so, oldest
        first: forgotten after ``forget_after_s``, or to make room."""
        self.unheard: OrderedDict[str, float] = OrderedDict()
        self.forgotten = 0
        """Records forgotten so far."""
        self._forgotten: list[str] = []
        """Forgotten since ``take_forgotten`` was last called."""

    def put(self, w: WorkerRecord) -> None:
        """A new record for its worker (a new epoch, or a worker first known): neither dead nor
        unheard yet."""
        wid = w.worker_id
        self.by_id[wid] = w
        self.dead.pop(wid, None)
        self.unheard.pop(wid, None)

    def unheard_since(self, worker_id: str, now: float) -> None:
        """The worker is known only from a retained birth, as of ``now``."""
        self.unheard[worker_id] = now

    def heard(self, worker_id: str) -> None:
        """The worker was heard in this run: it is no longer forgotten for being unheard."""
        self.unheard.pop(worker_id, None)

    def died(self, worker_id: str, now: float) -> None:
        """The worker's record is dead as of ``now``: forgotten ``forget_after_s`` later."""
        self.unheard.pop(worker_id, None)
        self.dead[worker_id] = now

    def has_room(self, now: float, *, lagging: bool) -> bool:
        """Whether a new worker's record may be made: under the ceiling, or once the oldest dead
        record is forgotten, else the oldest known only from a retained birth and unheard for longer
        than a live worker could be (never while the input ``lagging``)."""
        if len(self.by_id) < self._max:
            return True
        if self.dead:
            self.forget(next(iter(self.dead)))
            return True
        if self.unheard and not lagging:
            wid, since = next(iter(self.unheard.items()))
            if since + self._grace_s + self.by_id[wid].backstop_s <= now:
                self.forget(wid)
                return True
        return False

    def forget_idle(self, now: float) -> None:
        """Forget every record dead, or unheard, for ``forget_after_s`` at ``now``."""
        cutoff = now - self._forget_after_s
        for idle in (self.dead, self.unheard):
            while idle and next(iter(idle.values())) <= cutoff:
                self.forget(next(iter(idle)))

    def forget(self, worker_id: str) -> None:
        del self.by_id[worker_id]
        self.dead.pop(worker_id, None)
        self.unheard.pop(worker_id, None)
        self._forgotten.append(worker_id)
        self.forgotten += 1

    def take_forgotten(self) -> list[str]:
        """The workers forgotten since the last call, oldest first."""
        out, self._forgotten = self._forgotten, []
        return out
