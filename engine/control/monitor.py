"""The worker monitor's verdicts: which workers are dead, hung, or back.

The decisions this module protects (DESIGN.md section 5):
- **Dead**: a Last Will or a goodbye convicts at once; a silent worker is convicted when its
  phi-accrual detector reaches the threshold or its silence reaches a fixed backstop, whichever
  comes first. Each epoch of a worker is convicted at most once.
- **Epochs fence**: a birth, heartbeat or death from an older epoch than the newest one known is
  counted and ignored; a birth with a newer epoch starts the worker afresh, even from the dead.
  A death of an epoch never born here fences nothing: it is refused (``unborn``).
- **Records are bounded**: only a birth makes a record (a heartbeat or death of an unknown worker
  is refused as ``unborn``); the dead are forgotten, and a birth past ``max_workers`` for which no
  room can be made is refused (``too_many_workers``): engine/control/worker_records.py says which
  records go and when.
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

import math
from collections.abc import Mapping
from types import MappingProxyType

from warpdeck.engine.state.part_views import WorkerState

# Relative, so that `mypy engine/control/monitor.py` (which names the file engine.control.monitor,
# not warpdeck.engine.control.monitor) resolves them as well as `mypy -p warpdeck.engine` does.
from .lag import LagSpans
from .monitor_types import (
    MonitorConfig,
    MonitorCounters,
    Refusal,
    Verdict,
    VerdictKind,
    VerdictReason,
    WorkerStatus,
)
from .phi import PhiAccrual
from .worker_records import WorkerRecord, WorkerRecords

# The monitor's vocabulary (its config, verdicts, counters) is in monitor_types.
__all__ = ["WorkerMonitor"]

_SEQ_MOD = 256
_NEVER = math.inf


class WorkerMonitor:
    """Judges every worker from the events fed to it; ``tick`` returns the verdicts.

    Call ``on_connection(True, now)`` on every successful connection to the broker, the first
    included, and pass ``retained=True`` for the retained births the broker then hands over: those
    of workers long gone make stale records, convicted never and forgotten in time.
    """

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self._records = WorkerRecords(self.config.max_workers, self.config.forget_after_s, self.config.grace_s)
        self._workers = self._records.by_id
        """The records by worker id (the records' own dict: every heartbeat looks a worker up here)."""
        self._pending: list[Verdict] = []
        self._deadlines: dict[str, float] = {}
        self._quarantined: set[str] = set()
        self._connected = True
        self._lag = LagSpans()
        """When the input lagged: nobody's silence. ``_holds`` is its list of spans, tested per heartbeat."""
        self._holds = self._lag.spans
        self._disconnected_at = _NEVER
        self._floor = -_NEVER
        """Silence is counted from no earlier than this: the last reconnection."""
        self._grace_until = -_NEVER
        self._stale_epoch = 0
        self._missed = 0
        self._duplicates = 0
        self._after_conviction = 0
        self._unborn = 0
        self._too_many = 0
        self._lost = 0
        self._next_check = -_NEVER
        """No live worker's silence or stuck deadline falls before this (a lower bound: a deadline set earlier lowers
        it; ``tick`` sets it exactly after each scan)."""

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
        if w is None and not self._records.has_room(now, lagging=self.lagging):
            self._too_many += 1
            return "too_many_workers"
        w = self._begin(worker_id, epoch, now, interval_s, heard=not retained)
        if info:
            w.info = MappingProxyType(dict(info))
        if w.ours:
            w.last_seen = now
            self._arm_silence(w, now)
        else:
            self._records.unheard_since(worker_id, now)
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
            self._records.heard(worker_id)
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
        rhythm = last is not None and last >= floor and not (self._holds and self._lag.held(last, now) > 0.0)
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
            self._lag.begin(now if since is None else min(since, now))
        elif not lagging and self.lagging:
            self._lag.end(now)

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
        self._records.forget_idle(now)
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
        # Called a few times a second over every worker: _silence and phi are written out here,
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
                silence = heard_until - since - (self._lag.held(since, heard_until) if holds else 0.0)
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
            forgotten=self._records.forgotten,
            workers_lost=self._lost,
        )

    def epoch_of(self, worker_id: str) -> int | None:
        """The epoch of the worker's record; None when it has none (never born here, or forgotten)."""
        w = self._workers.get(worker_id)
        return None if w is None else w.epoch

    def take_forgotten(self) -> list[str]:
        """The workers forgotten since the last call, oldest first: whatever else remembers them
        (the MQTT side's last heartbeat, a retained death it published) can forget them too."""
        return self._records.take_forgotten()

    @property
    def lagging(self) -> bool:
        """Whether the monitor's input runs behind now (its last lag span is still open)."""
        return self._lag.lagging

    @property
    def connected(self) -> bool:
        """Whether the monitor believes its own broker connection is up."""
        return self._connected

    # -- internals ---------------------------------------------------------------------------------
    def _begin(self, worker_id: str, epoch: int, now: float, interval_s: float | None, *,
               heard: bool) -> WorkerRecord:
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
        w = WorkerRecord(worker_id, epoch, accrual, cfg.backstop_s * scale)
        self._records.put(w)
        w.ours = heard or (old is not None and old.ours)
        if old is not None:
            w.lost = old.lost
            if old.ours and (old.convicted_at is not None or old.hung_since is not None):
                self._emit(w, VerdictKind.RECOVERED, "rebirth", now)
        return w

    def _budget(self, w: WorkerRecord) -> float:
        """Silence after which the worker is convicted unless it is heard: phi's or the backstop's."""
        return min(w.accrual.silence_for(self.config.phi_threshold), w.backstop_s)

    def _arm_silence(self, w: WorkerRecord, now: float) -> None:
        w.due = max(now, self._floor) + self._budget(w)
        self._watch(w.due)

    def _watch(self, deadline: float) -> None:
        """A deadline was set: ``tick`` must look no later than it."""
        self._next_check = min(self._next_check, deadline)

    def _silence(self, w: WorkerRecord, now: float) -> float | None:
        """Silence as the monitor could hear it: from the reconnection at the earliest, and frozen
        at the moment of a disconnection."""
        if w.last_seen is None:
            return None
        if not self._connected:
            now = min(now, self._disconnected_at)
        since = max(w.last_seen, self._floor)
        held = self._lag.held(since, now) if self._holds else 0.0
        return max(now - since - held, 0.0)

    def _judge_silence(self, w: WorkerRecord, now: float) -> None:
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

    def _convict(self, w: WorkerRecord, now: float, reason: VerdictReason, *,
                 phi: float | None = None, silence: float | None = None) -> None:
        if silence is None:
            silence = self._silence(w, now)
        if phi is None:
            phi = 0.0 if silence is None else w.accrual.phi_after(silence)
        w.convicted_at = now
        w.due = w.hung_due = _NEVER
        w.hung_since = None
        self._records.died(w.worker_id, now)
        if not w.ours:  # known only from the broker's memory: no loss of this run, no verdict
            return
        if not w.lost:
            w.lost = True
            self._lost += 1
        self._pending.append(Verdict(w.worker_id, w.epoch, VerdictKind.DEAD, reason, now, phi, silence))

    def _deadline(self, worker_id: str) -> float:
        return self._deadlines.get(worker_id, self.config.stuck_after_s)

    def _track_progress(self, w: WorkerRecord, progress: int, busy: bool, now: float) -> None:
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

    def _emit(self, w: WorkerRecord, kind: VerdictKind, reason: VerdictReason, now: float) -> None:
        silence = self._silence(w, now)
        phi = 0.0 if silence is None else w.accrual.phi_after(silence)
        self._pending.append(Verdict(w.worker_id, w.epoch, kind, reason, now, phi, silence))
