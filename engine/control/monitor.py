"""The worker monitor's verdicts: which workers are dead, hung, or back.

The decisions this module protects (DESIGN.md section 5):
- **Dead**: a Last Will or a goodbye convicts at once; a silent worker is convicted when its
  phi-accrual detector reaches the threshold or its silence reaches a fixed backstop, whichever
  comes first. Each epoch of a worker is convicted at most once.
- **Epochs fence**: a birth, heartbeat or death from an older epoch than the newest one known is
  counted and ignored; a birth with a newer epoch starts the worker afresh, even from the dead.
  A death of an epoch never born here fences nothing: it is refused (``unborn``).
- **Records are bounded**: only a birth makes a record (a heartbeat or death of an unknown worker
  is refused as ``unborn``); a worker dead for ``forget_after_s`` is forgotten; and a birth that
  would pass ``max_workers`` forgets the oldest dead record first (else one of a worker known only
  from a retained birth and unheard for longer than a live worker could be), or is refused
  (``too_many_workers``). A record whose worker may be alive is never taken to make room: its
  heartbeats would no longer be heard.
- **This run's workers only**: a worker known only from a retained birth (the broker's memory of
  an earlier connection) is shown stale and never convicted for its silence; it becomes this run's
  once heard (a heartbeat, or a birth sent while we listen). Its death, or its forgetting, is no
  verdict and no loss: only this run's workers are lost.
- **Broker lost**: while the monitor is itself disconnected it convicts nobody and shows every
  living worker as stale. After it reconnects, silence is counted from the reconnection, and nobody
  is convicted for silence during a grace period in which workers re-birth.
- **Input lag**: the time during which the monitor's own input ran behind (``on_input_lag``,
  measured by ``engine/control/lag.py``, from the moment the lag began) is not counted as anyone's
  silence, nor in the phi shown. Late heartbeats are not silent workers;
  a worker silent outside those spans is still convicted, only later by their length.
- **Stuck**: heartbeats flowing, work leased, and the progress counter frozen past the worker's
  deadline make it hung, once per episode, until progress moves or the work is gone.

Everything here is pure and clock-injected: the caller (the MQTT side) feeds events with ``now``
from ``time.monotonic`` and calls ``tick`` a few times a second. A heartbeat costs O(1): it turns
the detector's threshold into a deadline, so ``tick`` compares one float per worker and evaluates
phi only for workers past their deadline; and it keeps the earliest deadline of all, so a ``tick``
before it compares nothing (with steady heartbeats, one tick in about twenty scans the workers).
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Relative, so that `mypy engine/control/monitor.py` (which names the file engine.control.monitor,
# not warpdeck.engine.control.monitor) resolves it as well as `mypy -p warpdeck.engine` does.
from .phi import PhiAccrual

__all__ = [
    "MonitorConfig",
    "MonitorCounters",
    "Refusal",
    "Verdict",
    "VerdictKind",
    "VerdictReason",
    "WorkerMonitor",
    "WorkerState",
    "WorkerStatus",
]

_SEQ_MOD = 256
_NEVER = math.inf
_EMPTY: Mapping[str, object] = MappingProxyType({})
#: Input-lag spans remembered: older ones lie before any silence still being judged.
_MAX_HOLDS = 256


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


class WorkerState(enum.StrEnum):
    """What the control room shows for a worker, most pressing first: an operator's quarantine,
    then death, then what the monitor cannot know (stale), then hung, late, online."""

    ONLINE = "online"
    LATE = "late"
    STALE = "stale"
    DEAD = "dead"
    QUARANTINED = "quarantined"
    HUNG = "hung"


class VerdictKind(enum.StrEnum):
    """What changed: a worker was convicted, began to hang, or came back (hang over, or re-born)."""

    DEAD = "dead"
    HUNG = "hung"
    RECOVERED = "recovered"


VerdictReason = Literal["will", "graceful", "silent", "stuck", "progress", "idle", "rebirth"]
#: Why an event made no change: the worker (or that epoch of it) was never born here, or a new
#: worker's birth found every record in use.
Refusal = Literal["unborn", "too_many_workers"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One change the rest of the engine acts on (reassign leases, publish an event). Dead verdicts
    name the epoch, because fencing rejects that epoch's results, not the worker's."""

    worker_id: str
    epoch: int
    kind: VerdictKind
    #: dead: will, graceful, silent; hung: stuck; recovered: progress, idle, rebirth.
    reason: VerdictReason
    at: float
    #: The detector's phi at ``at`` (0.0 when the worker was never heard).
    phi: float
    #: Seconds since the last sign of life the monitor could hear (counted from its reconnection
    #: when it was disconnected in between); None when it never heard the worker.
    silence_s: float | None


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One worker as of ``views(now)``: a copy, so the UI never reads the monitor's live state."""

    worker_id: str
    state: WorkerState
    epoch: int
    #: Seconds since this epoch's last heartbeat; None before its first.
    heartbeat_age_s: float | None
    phi: float
    progress: int | None
    busy: bool
    last_seq: int | None
    #: The birth's details (host, pid, device, ...); empty when no birth of this epoch was seen.
    info: Mapping[str, object]
    #: When this epoch was convicted; None while it lives.
    convicted_at: float | None
    #: When the current hung episode began; None when not hung.
    hung_since: float | None
    #: Heartbeats of this epoch that never arrived (sequence gaps).
    missed_heartbeats: int


@dataclass(frozen=True, slots=True)
class MonitorCounters:
    """Messages the monitor counted rather than acted on."""

    #: Births, heartbeats and deaths from an epoch older than the newest one known.
    stale_epoch: int
    #: Heartbeats whose sequence numbers show that earlier ones never arrived (summed).
    missed_heartbeats: int
    #: Heartbeats repeating the previous sequence number (QoS 1 redelivery).
    duplicate_heartbeats: int
    #: Heartbeats from an epoch already convicted (a frozen process that woke up).
    after_conviction: int
    #: Heartbeats and deaths of a worker, or an epoch of it, never born here.
    unborn: int = 0
    #: Births of new workers refused because every record was in use (``max_workers``).
    too_many_workers: int = 0
    #: Records forgotten: dead (or never heard) for ``forget_after_s``, or to make room.
    forgotten: int = 0
    #: Workers of this run convicted, each once per record (a worker forgotten and born again
    #: counts again).
    workers_lost: int = 0


class _Worker:
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
        #: Last sign of life of this epoch (its birth or a heartbeat); None if only its death was heard.
        self.last_seen: float | None = None
        self.last_hb: float | None = None
        self.last_seq: int | None = None
        self.progress: int | None = None
        self.busy = False
        self.missed = 0
        self.convicted_at: float | None = None
        #: Silence conviction is checked no earlier than this (a deadline precomputed per heartbeat).
        self.due = _NEVER
        self.stuck_since = 0.0
        self.hung_due = _NEVER
        self.hung_since: float | None = None
        #: Heard in this run (a birth sent while we listened, or a heartbeat), this epoch or before.
        self.ours = False
        #: Convicted once already (counted in ``workers_lost``), this epoch or before.
        self.lost = False


class WorkerMonitor:
    """Judges every worker from the events fed to it; ``tick`` returns the verdicts.

    Call ``on_connection(True, now)`` on every successful connection to the broker, the first
    included, and pass ``retained=True`` for the retained births the broker then hands over: those
    of workers long gone make stale records, convicted never and forgotten in time.
    """

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self._workers: dict[str, _Worker] = {}
        self._pending: list[Verdict] = []
        self._deadlines: dict[str, float] = {}
        self._quarantined: set[str] = set()
        self._connected = True
        #: Spans [start, end] of input lag, oldest first; the last is open (end inf) while lagging.
        self._holds: list[list[float]] = []
        self._disconnected_at = _NEVER
        #: Silence is counted from no earlier than this: the last reconnection.
        self._floor = -_NEVER
        self._grace_until = -_NEVER
        self._stale_epoch = 0
        self._missed = 0
        self._duplicates = 0
        self._after_conviction = 0
        self._unborn = 0
        self._too_many = 0
        self._forgotten_count = 0
        self._lost = 0
        #: Records of dead workers, and of workers known only from a retained birth, by when they
        #: became so, oldest first: forgotten after ``forget_after_s``, or to make room.
        self._dead: OrderedDict[str, float] = OrderedDict()
        self._unheard: OrderedDict[str, float] = OrderedDict()
        #: Forgotten since ``take_forgotten`` was last called.
        self._forgotten: list[str] = []
        #: No live worker's silence or stuck deadline falls before this (a lower bound: a deadline
        #: set earlier lowers it; ``tick`` sets it exactly after each scan).
        self._next_check = -_NEVER

    # -- events ------------------------------------------------------------------------------------
    def on_birth(
        self,
        worker_id: str,
        epoch: int,
        now: float,
        info: Mapping[str, object] | None = None,
        *,
        interval_s: float | None = None,
        retained: bool = False,
    ) -> Refusal | None:
        """A worker (re)connected with ``epoch``; ``interval_s`` is the heartbeat interval it
        promises. A newer epoch starts it afresh (back to life if it was dead; a quarantine stays);
        the same epoch again (a retained birth redelivered) only fills in details and is no sign of
        life; an older one is counted and ignored. A ``retained`` birth (the broker's copy, handed
        over when we subscribed) of a worker not heard in this run is no sign of life either: its
        worker is stale until heard. Returns why the birth was refused, if it was."""
        w = self._workers.get(worker_id)
        if w is not None and epoch < w.epoch:
            self._stale_epoch += 1
            return None
        if w is not None and epoch == w.epoch:
            if not w.info and info:
                w.info = MappingProxyType(dict(info))
            return None
        if w is None and len(self._workers) >= self.config.max_workers and not self._make_room(now):
            self._too_many += 1
            return "too_many_workers"
        w = self._begin(worker_id, epoch, now, interval_s, heard=not retained)
        if info:
            w.info = MappingProxyType(dict(info))
        if w.ours:
            w.last_seen = now
            self._arm_silence(w, now)
        else:
            self._unheard[worker_id] = now
        return None

    def on_heartbeat(
        self, worker_id: str, epoch: int, seq: int, progress: int, now: float, busy: bool
    ) -> Refusal | None:
        """A heartbeat: ``seq`` wraps at 256, ``progress`` counts finished batches, ``busy`` says
        the worker holds leased work. A newer epoch than known stands in for a birth not yet seen;
        a worker never born here is refused (``unborn``)."""
        w = self._workers.get(worker_id)
        if w is None:
            self._unborn += 1
            return "unborn"
        if epoch > w.epoch:
            w = self._begin(worker_id, epoch, now, None, heard=True)
        elif epoch < w.epoch:
            self._stale_epoch += 1
            return None
        if w.convicted_at is not None:
            self._after_conviction += 1
            return None
        if not w.ours:  # known from a retained birth: alive after all, and this run's
            w.ours = True
            self._unheard.pop(worker_id, None)
        if w.last_seq is not None:
            step = (seq - w.last_seq) % _SEQ_MOD
            if step == 0:
                self._duplicates += 1
                return None
            w.missed += step - 1
            self._missed += step - 1
        w.last_seq = seq
        # An interval spanning the monitor's own disconnection or input lag is not the worker's rhythm.
        last = w.last_hb
        floor = self._floor
        rhythm = last is not None and last >= floor and not (self._holds and self._held(last, now) > 0.0)
        accrual = w.accrual
        accrual.heartbeat(now, sample=rhythm)
        w.last_hb = w.last_seen = now
        # _arm_silence written out: every heartbeat comes this way.
        due = (now if now >= floor else floor) + min(accrual.silence_for(self.config.phi_threshold), w.backstop_s)
        w.due = due
        if due < self._next_check:  # noqa: PLR1730 - min() is a call more, on every heartbeat
            self._next_check = due
        self._track_progress(w, progress, busy, now)
        return None

    def on_death(self, worker_id: str, epoch: int, now: float, graceful: bool) -> Refusal | None:
        """A Last Will (``graceful`` false) or goodbye: that epoch is dead at once. An older epoch's
        death is counted and ignored; one of a worker or epoch never born here is refused
        (``unborn``): it would fence a later real birth of that worker."""
        w = self._workers.get(worker_id)
        if w is None or epoch > w.epoch:
            self._unborn += 1
            return "unborn"
        if epoch < w.epoch:
            self._stale_epoch += 1
        elif w.convicted_at is None:
            self._convict(w, now, "graceful" if graceful else "will")
        return None

    def on_connection(self, connected: bool, now: float) -> None:
        """The monitor's own broker connection went up or down."""
        if not connected:
            if self._connected:
                self._connected = False
                self._disconnected_at = now
            return
        self._connected = True
        self._disconnected_at = _NEVER
        self._floor = now
        self._grace_until = now + self.config.grace_s
        for w in self._workers.values():
            # Sequence numbers and silence restart: what happened while deaf is not evidence.
            w.last_seq = None
            if w.convicted_at is None:
                w.due = max(w.due, now + self._budget(w))

    def on_input_lag(self, lagging: bool, now: float, since: float | None = None) -> None:
        """The monitor's own input runs behind (``lagging``, behind since ``since``) or has caught
        up (at ``now``). The span in between is no one's silence; Wills still convict at once."""
        if lagging and not self.lagging:
            start = now if since is None else min(since, now)
            if self._holds and start <= self._holds[-1][1]:
                self._holds[-1][1] = _NEVER  # overlaps the previous span: reopen it
            else:
                self._holds.append([start, _NEVER])
            del self._holds[:-_MAX_HOLDS]
        elif not lagging and self.lagging:
            self._holds[-1][1] = now

    # -- operator and caller settings --------------------------------------------------------------
    def set_deadline(self, worker_id: str, seconds: float | None) -> None:
        """Stuck deadline for one worker (its stage's phase deadline); None restores the default."""
        if seconds is None:
            self._deadlines.pop(worker_id, None)
        elif seconds > 0:
            self._deadlines[worker_id] = seconds
        else:
            raise ValueError(f"a stuck deadline must be positive (got {seconds} for {worker_id!r})")
        w = self._workers.get(worker_id)
        if w is not None and w.hung_due != _NEVER:
            w.hung_due = w.stuck_since + self._deadline(worker_id)
            self._watch(w.hung_due)

    def quarantine(self, worker_id: str) -> None:
        """Show the worker quarantined (across re-births) until ``release``; it is still judged."""
        self._quarantined.add(worker_id)

    def release(self, worker_id: str) -> None:
        """End a quarantine; unknown or free workers are left as they are."""
        self._quarantined.discard(worker_id)

    # -- judgement ---------------------------------------------------------------------------------
    def tick(self, now: float) -> list[Verdict]:
        """Judge silence and stuck work at ``now``; return every verdict since the last tick
        (deaths from ``on_death`` and recoveries from heartbeats included), oldest first. Records
        idle for ``forget_after_s`` are forgotten (``take_forgotten`` says which)."""
        out = self._pending
        self._pending = []
        cutoff = now - self.config.forget_after_s
        for idle in (self._dead, self._unheard):
            while idle and next(iter(idle.values())) <= cutoff:
                self._forget(next(iter(idle)))
        if not self._connected or now < self._next_check:
            return out
        judge_silence = now >= self._grace_until
        floor = self._floor
        check = _NEVER
        for w in self._workers.values():
            if w.convicted_at is not None:
                continue
            if judge_silence and w.due <= now:
                self._judge_silence(w, now)
                if w.convicted_at is not None:
                    continue
            if w.hung_since is None:
                if w.hung_due <= now and w.last_hb is not None and w.last_hb >= floor:
                    w.hung_since = now
                    self._emit(w, VerdictKind.HUNG, "stuck", now)
                elif w.hung_due < check:
                    check = w.hung_due
            check = min(check, w.due)
        self._next_check = check
        out.extend(self._pending)
        self._pending = []
        return out

    def views(self, now: float) -> list[WorkerStatus]:
        """Every known worker at ``now``, in the order first heard."""
        # Called a few times a second over every worker: _phi and _silence are written out here,
        # and the rows built positionally (a frozen dataclass's keywords cost a fifth more).
        late_phi = self.config.late_phi
        quarantined = self._quarantined
        connected = self._connected
        floor = self._floor
        heard_until = now if connected else min(now, self._disconnected_at)
        holds = self._holds
        out: list[WorkerStatus] = []
        append = out.append
        for w in self._workers.values():
            seen, convicted, last_hb = w.last_seen, w.convicted_at, w.last_hb
            if convicted is not None or seen is None:
                phi = 0.0
            else:
                since = seen if seen >= floor else floor
                silence = heard_until - since - (self._held(since, heard_until) if holds else 0.0)
                phi = w.accrual.phi_after(silence if silence > 0.0 else 0.0)
            if w.worker_id in quarantined:
                state = WorkerState.QUARANTINED
            elif convicted is not None:
                state = WorkerState.DEAD
            elif not connected or seen is None or seen < floor:
                state = WorkerState.STALE
            elif w.hung_since is not None:
                state = WorkerState.HUNG
            elif phi >= late_phi:
                state = WorkerState.LATE
            else:
                state = WorkerState.ONLINE
            append(WorkerStatus(w.worker_id, state, w.epoch, None if last_hb is None else now - last_hb, phi,
                                w.progress, w.busy, w.last_seq, w.info, convicted, w.hung_since, w.missed))
        return out

    @property
    def counters(self) -> MonitorCounters:
        """What was counted and dropped so far."""
        return MonitorCounters(
            stale_epoch=self._stale_epoch,
            missed_heartbeats=self._missed,
            duplicate_heartbeats=self._duplicates,
            after_conviction=self._after_conviction,
            unborn=self._unborn,
            too_many_workers=self._too_many,
            forgotten=self._forgotten_count,
            workers_lost=self._lost,
        )

    def epoch_of(self, worker_id: str) -> int | None:
        """The epoch of the worker's record; None when it has none (never born here, or forgotten)."""
        w = self._workers.get(worker_id)
        return None if w is None else w.epoch

    def take_forgotten(self) -> list[str]:
        """The workers forgotten since the last call, oldest first: whatever else remembers them
        (the MQTT side's last heartbeat, a retained death it published) can forget them too."""
        out, self._forgotten = self._forgotten, []
        return out

    @property
    def lagging(self) -> bool:
        """Whether the monitor's input runs behind now (its last lag span is still open)."""
        return bool(self._holds) and self._holds[-1][1] == _NEVER

    @property
    def connected(self) -> bool:
        """Whether the monitor believes its own broker connection is up."""
        return self._connected

    # -- internals ---------------------------------------------------------------------------------
    def _begin(self, worker_id: str, epoch: int, now: float, interval_s: float | None, *, heard: bool) -> _Worker:
        """A new epoch of a worker (or a worker first heard): a fresh record and detector. ``heard``:
        a sign of life in this run (else a retained birth: this run's only if the worker was)."""
        cfg = self.config
        old = self._workers.get(worker_id)
        interval = interval_s if interval_s is not None and interval_s > 0 else cfg.interval_s
        # A slower promise stretches the backstop and pause with it; a faster one keeps the defaults
        # (tighter limits would convict on the broker's own jitter).
        scale = max(1.0, interval / cfg.interval_s)
        accrual = PhiAccrual(
            interval_s=interval,
            min_std_s=cfg.min_std_s,
            acceptable_pause_s=cfg.acceptable_pause_s * scale,
            window=cfg.window,
            min_samples=cfg.min_samples,
        )
        w = _Worker(worker_id, epoch, accrual, cfg.backstop_s * scale)
        self._workers[worker_id] = w
        self._dead.pop(worker_id, None)
        self._unheard.pop(worker_id, None)
        w.ours = heard or (old is not None and old.ours)
        if old is not None:
            w.lost = old.lost
            if old.ours and (old.convicted_at is not None or old.hung_since is not None):
                self._emit(w, VerdictKind.RECOVERED, "rebirth", now)
        return w

    def _make_room(self, now: float) -> bool:
        """Forget the oldest dead record for a new worker's, else the oldest known only from a
        retained birth and unheard for longer than a live worker could be (never while the input
        lags); False when every record is in use."""
        if self._dead:
            self._forget(next(iter(self._dead)))
            return True
        if self._unheard and not self.lagging:
            wid, since = next(iter(self._unheard.items()))
            if since + self.config.grace_s + self._workers[wid].backstop_s <= now:
                self._forget(wid)
                return True
        return False

    def _forget(self, worker_id: str) -> None:
        del self._workers[worker_id]
        self._dead.pop(worker_id, None)
        self._unheard.pop(worker_id, None)
        self._forgotten.append(worker_id)
        self._forgotten_count += 1

    def _budget(self, w: _Worker) -> float:
        """Silence after which the worker is convicted unless it is heard: phi's or the backstop's."""
        return min(w.accrual.silence_for(self.config.phi_threshold), w.backstop_s)

    def _arm_silence(self, w: _Worker, now: float) -> None:
        w.due = max(now, self._floor) + self._budget(w)
        self._watch(w.due)

    def _watch(self, deadline: float) -> None:
        """A deadline was set: ``tick`` must look no later than it."""
        self._next_check = min(self._next_check, deadline)

    def _silence(self, w: _Worker, now: float) -> float | None:
        """Silence as the monitor could hear it: from the reconnection at the earliest, and frozen
        at the moment of a disconnection."""
        if w.last_seen is None:
            return None
        if not self._connected:
            now = min(now, self._disconnected_at)
        since = max(w.last_seen, self._floor)
        held = self._held(since, now) if self._holds else 0.0
        return max(now - since - held, 0.0)

    def _held(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which the input lagged."""
        total = 0.0
        for start, end in reversed(self._holds):
            if end <= t0:
                break
            total += max(min(end, t1) - max(start, t0), 0.0)
        return total

    def _phi(self, w: _Worker, now: float) -> float:
        silence = self._silence(w, now)
        return 0.0 if silence is None or w.convicted_at is not None else w.accrual.phi_after(silence)

    def _judge_silence(self, w: _Worker, now: float) -> None:
        silence = self._silence(w, now)
        if silence is None:
            return
        phi = w.accrual.phi_after(silence)
        # ``due`` is a prefilter computed from the inverse of phi; the decision is the comparison
        # itself, so rounding at the boundary only delays a conviction to the next tick.
        if phi >= self.config.phi_threshold or silence >= w.backstop_s:
            self._convict(w, now, "silent", phi=phi, silence=silence)
        else:
            # Silence grows no faster than the clock: look again when the budget could be spent
            # (later than its deadline when some of the silence was the monitor's own input lag).
            w.due = now + max(self._budget(w) - silence, 0.0)

    def _convict(
        self, w: _Worker, now: float, reason: VerdictReason, *, phi: float | None = None, silence: float | None = None
    ) -> None:
        if silence is None:
            silence = self._silence(w, now)
        if phi is None:
            phi = 0.0 if silence is None else w.accrual.phi_after(silence)
        w.convicted_at = now
        w.due = w.hung_due = _NEVER
        w.hung_since = None
        self._unheard.pop(w.worker_id, None)
        self._dead[w.worker_id] = now
        if not w.ours:  # known only from the broker's memory: no loss of this run, no verdict
            return
        if not w.lost:
            w.lost = True
            self._lost += 1
        self._pending.append(Verdict(w.worker_id, w.epoch, VerdictKind.DEAD, reason, now, phi, silence))

    def _deadline(self, worker_id: str) -> float:
        return self._deadlines.get(worker_id, self.config.stuck_after_s)

    def _track_progress(self, w: _Worker, progress: int, busy: bool, now: float) -> None:
        moved = w.progress is not None and progress != w.progress
        if busy and (moved or not w.busy or w.progress is None):
            # A stuck clock starts when work is taken up or progress moves, not when it last moved.
            w.stuck_since = now
            w.hung_due = now + self._deadline(w.worker_id)
            self._watch(w.hung_due)
        elif not busy:
            w.hung_due = _NEVER
        if w.hung_since is not None and (moved or not busy):
            w.hung_since = None
            self._emit(w, VerdictKind.RECOVERED, "progress" if moved else "idle", now)
        w.progress = progress
        w.busy = busy

    def _emit(self, w: _Worker, kind: VerdictKind, reason: VerdictReason, now: float) -> None:
        silence = self._silence(w, now)
        phi = 0.0 if silence is None else w.accrual.phi_after(silence)
        self._pending.append(Verdict(w.worker_id, w.epoch, kind, reason, now, phi, silence))
