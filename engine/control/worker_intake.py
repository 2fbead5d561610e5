"""Worker messages into the monitor, and what the plane keeps per worker because of them.

The decisions this module protects (docs/control-plane.md, "Workers and the monitor"):
- A worker message is acted on only once it is shown to be its worker's: the worker it names must
  be its topic's (else ``wrong_topic``), and with a secret it must verify (engine/control/
  worker_auth.py). What is refused is counted by reason and makes no record.
- A Will waits ``will_hold_s`` before it convicts: a broker that shuts down sends every client's
  Will (Mosquitto does) and then drops the monitor too, and a Will followed by the plane's own
  disconnection convicts nobody (the plane drops the Wills it holds when its connection goes).
- The engine's own workers are this run's: their birth of this run is heard however it reached the
  plane, and their heartbeats, which also measure the plane's input lag (engine/control/lag.py),
  are never reported as dropped when they overtake their retained birth.
- A worker convicted for silence is told so by a retained death for that epoch on its own death
  topic: if it is alive after all, it is born again under a new epoch (engine/control/heartbeat.py).
  Only a worker heard in this run is convicted, so nothing is retained for a ghost never born or a
  worker of an earlier run; the death retained is cleared (an empty retained message) once the
  worker is born again or forgotten, so a later engine never reads it as a loss.
- Whatever is kept here per worker goes when the monitor forgets the worker (engine/control/
  worker_records.py bounds the records); at most the last 1 000 workers lost are named, and the
  monitor counts them all.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from warpdeck.engine.control.heartbeat import Heartbeater
from warpdeck.engine.control.lag import InputLag
from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import Verdict
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.wire import Birth, Death, Heartbeat, encode
from warpdeck.engine.control.worker_auth import WorkerAuth, sign_worker

__all__ = ["WorkerIntake"]

_LOST_NAMES = 1000
"""Workers lost named in the report (the latest); all of them are counted."""


class WorkerIntake:
    """Births, heartbeats and deaths into the monitor, for the plane; ``drop(reason, detail)`` counts
    what is refused. Used on the plane's loop, but for ``workers_lost`` and ``heard`` (any thread)."""

    def __init__(
        self,
        monitor: WorkerMonitor,
        lag: InputLag,
        auth: WorkerAuth,
        heartbeaters: Mapping[str, Heartbeater],
        drop: Callable[[str, str], None],
        *,
        topics: Topics,
        secret: bytes | None,
        will_hold_s: float,
    ) -> None:
        self._monitor = monitor
        self._lag = lag
        self._auth = auth
        self._heartbeaters = heartbeaters
        """The in-process workers' heartbeaters (the plane's own dict, filled as they start)."""
        self._drop = drop
        self._topics = topics
        self._secret = secret
        self._will_hold_s = will_hold_s
        self._heard: dict[str, Heartbeat] = {}
        """The newest heartbeat heard from each worker the monitor knows."""
        self._wills: dict[str, tuple[int, float]] = {}
        """Wills held for ``will_hold_s``: worker id → (epoch, when heard)."""
        self._pending_deaths: list[Verdict] = []
        """Silent convictions to tell their workers (a retained death on each one's death topic)."""
        self._retained: dict[str, int] = {}
        """Workers with a death we retained for them, by its epoch; and those to clear it for."""
        self._clears: dict[str, None] = {}
        self._lost: dict[str, None] = {}
        """Workers lost in this run, the latest last (at most _LOST_NAMES; the monitor counts all)."""

    # -- messages (the plane's loop, as they are read) -------------------------------------------
    def on_worker(self, wid: str, msg: object, *, retained: bool = False) -> None:
        """One decoded message from ``wid``'s topics (``retained``: the broker's stored copy)."""
        now = time.monotonic()
        if getattr(msg, "worker", wid) != wid:
            self._drop("wrong_topic", f"worker {getattr(msg, 'worker', '')!r} on {wid!r}'s topic")
            return
        if not isinstance(msg, Heartbeat | Birth | Death):  # decode hands out no other kind here
            return
        refused = self._auth.accept(msg)
        if refused is None:
            refused = self._to_monitor(wid, msg, now, retained)
        if refused is not None:  # never acted on, never a record
            self._drop(refused, f"{msg.kind} of {wid!r} (epoch {msg.epoch})")

    def _to_monitor(self, wid: str, msg: Heartbeat | Birth | Death, now: float, retained: bool) -> str | None:
        """Hand a verified worker message to the monitor; why it was refused, if it was."""
        refused: str | None = None
        monitor = self._monitor
        if isinstance(msg, Heartbeat):
            refused = monitor.on_heartbeat(wid, msg.epoch, msg.seq, msg.progress, now, busy=msg.lanes_busy > 0)
            if refused is None:
                self._heard[wid] = msg
            if wid in self._heartbeaters:
                # Read, if not taken: just after we subscribe, a heartbeat may overtake its retained
                # birth (sent at QoS 1, behind the broker's in-flight window). Our own worker's birth
                # is surely on its way: no drop to report.
                self._lag.on_heard(wid, msg.epoch, msg.seq)
                refused = None
        elif isinstance(msg, Birth):
            self._wills.pop(wid, None)
            # Our own worker's birth of this run is this run's, however it reached us; an earlier
            # run's (an older epoch under the same id) is not.
            heart = self._heartbeaters.get(wid)
            ours = heart is not None and msg.epoch >= heart.epoch > 0
            refused = monitor.on_birth(wid, msg.epoch, now, interval_s=msg.interval_s,
                                       retained=retained and not ours,
                                       info=msg.model_dump(exclude={"kind", "v", "worker", "epoch"}))
            if refused is None and msg.epoch > self._retained.get(wid, msg.epoch):
                del self._retained[wid]  # born again: the death we retained for it is stale
                self._clears[wid] = None
            self.forget()  # records it forgot to make room
        elif msg.graceful or retained:
            refused = monitor.on_death(wid, msg.epoch, now, graceful=msg.graceful)
        elif (known := monitor.epoch_of(wid)) is None or msg.epoch > known:
            refused = "unborn"  # a Will of an epoch never born here: not worth holding
        else:
            # A broker that shuts down sends every client's Will (Mosquitto does) just before it
            # drops us: hold a Will briefly and drop it if our own connection goes too.
            self._wills[wid] = (msg.epoch, now)
        return refused

    # -- the plane's tick and connection ---------------------------------------------------------
    def release_wills(self, now: float) -> None:
        """Hand the monitor every Will held for ``will_hold_s`` (while the plane is connected)."""
        hold = self._will_hold_s
        for wid, (epoch, heard) in list(self._wills.items()):
            if now - heard >= hold:
                del self._wills[wid]
                if self._monitor.on_death(wid, epoch, now, graceful=False) is not None:  # forgotten meanwhile
                    self._drop("unborn", f"death of {wid!r} (epoch {epoch})")

    def drop_wills(self) -> None:
        """The plane's own connection went: the Wills it holds convict nobody."""
        self._wills.clear()

    def on_dead(self, verdict: Verdict) -> None:
        """A worker was convicted: name it lost, and tell it so if it was convicted for silence."""
        wid = verdict.worker_id
        self._lost.pop(wid, None)
        self._lost[wid] = None
        if len(self._lost) > _LOST_NAMES:
            del self._lost[next(iter(self._lost))]
        if verdict.reason == "silent":
            self._pending_deaths.append(verdict)
            self._retained[wid] = verdict.epoch

    def forget(self) -> None:
        """The monitor forgot these workers since the last call: so does everything here that
        remembers them."""
        for wid in self._monitor.take_forgotten():
            self._heard.pop(wid, None)
            self._auth.forget(wid)
            if self._retained.pop(wid, None) is not None:
                self._clears[wid] = None

    async def tell(self, client: Any) -> None:
        """Publish a retained death for each worker convicted for silence since the last call, then
        clear the deaths retained for workers born again or forgotten."""
        deaths, self._pending_deaths = self._pending_deaths, []
        for v in deaths:
            # A worker convicted for silence may be alive (thawed, or starved): this tells it,
            # and it is born again under a new epoch; a monitor that attaches later learns it too.
            why = f"convicted: silent for {v.silence_s or 0:.1f} s"
            death = sign_worker(self._secret, Death(worker=v.worker_id, epoch=v.epoch, reason=why))
            await client.publish(self._topics.worker(v.worker_id, "death"), encode(death), qos=1, retain=True)
        clears, self._clears = self._clears, {}
        for wid in clears:  # after the deaths: a worker convicted and re-born at once is cleared too
            await client.publish(self._topics.worker(wid, "death"), b"", qos=1, retain=True)

    # -- any thread ------------------------------------------------------------------------------
    def workers_lost(self) -> list[str]:
        """The workers lost in this run, the latest 1 000."""
        for _ in range(3):
            with contextlib.suppress(RuntimeError):  # changed size while copied from another thread
                return list(self._lost)
        return []

    def heard(self) -> dict[str, Heartbeat]:
        """The newest heartbeat heard from each worker; a copy."""
        for _ in range(3):
            with contextlib.suppress(RuntimeError):  # changed size while copied from another thread
                return dict(self._heard)
        return {}
