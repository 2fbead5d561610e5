"""``executor = "ray"``: the engine's workers are Ray actors, one per GPU, each with its lanes.

The decisions this module protects:
- The engine stays the one scheduler: it forms batches, leases them to actors under their epochs,
  requeues them when an actor is convicted, and commits results. Ray places the actors on GPUs
  (``num_gpus``), restarts them when they die (``max_restarts``), and moves the arrays.
- Actors join the engine's control plane as workers of their own (their own MQTT connection and
  Last Will), so the monitor convicts a killed actor by its Will, usually before Ray reports the
  death; whichever comes first convicts, the other finds nothing left to take back.
- The actors start when the run does, once the control plane has a broker to give them; an actor
  that does not answer within ``start_timeout_s`` (a cluster without enough GPUs) fails the run
  with a message that says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.monitor_types import WorkerState
from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.sinks import Sink
from warpdeck.engine.edges.sources import BatchKey, Source
from warpdeck.engine.scaleout import raylink
from warpdeck.engine.scaleout.dispatch import DispatchHost, RayLane
from warpdeck.engine.scaleout.remote import RemoteWorker
from warpdeck.engine.scaleout.worker import LaneWorker
from warpdeck.engine.state.records import StagePlan
from warpdeck.engine.state.snapshot import WorkerView

__all__ = ["Conviction", "RayExecutor", "WorkersDidNotStart"]


@dataclass(frozen=True, slots=True)
class Conviction:
    """One conviction of an actor's epoch and what caused it (``will``, ``silent``… from the
    monitor, ``ray: …`` from Ray's actor-death error); the first per epoch is the one that acted."""

    worker: str
    epoch: int
    why: str
    #: ``time.monotonic()`` when the engine acted on it.
    at: float


class WorkersDidNotStart(raylink.RayUnavailable):
    """Actors that did not answer in time; ``waiting`` names them."""

    def __init__(self, waiting: list[str], timeout_s: float, gpus: float) -> None:
        self.waiting = waiting
        super().__init__(f"actors {', '.join(waiting)} did not start within {timeout_s:g} s "
                         f"(each needs {gpus:g} GPU; does the cluster have that many free?)")


class RayExecutor:
    """The actors of one run and the engine's lanes that feed them."""

    def __init__(self, spec: PipelineSpec, on_change: Callable[[], None], start_timeout_s: float = 120.0) -> None:
        ex = spec.executor
        raylink.connect(ex.address)
        gpus = raylink.cluster_gpus()
        if ex.gpus_per_worker > 0 and gpus == 0:
            raise raylink.RayUnavailable("the Ray cluster has no GPUs: add GPU nodes, or set [executor] "
                                         "gpus_per_worker = 0 to run the actors on CPUs")
        count = ex.workers if ex.workers is not None else max(1, int(gpus // ex.gpus_per_worker) if ex.gpus_per_worker
                                                              else 1)
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self.workers = [RemoteWorker(f"ray-{k}", k, on_change) for k in range(count)]
        self._by_id = {w.id: w for w in self.workers}
        #: Every conviction of an actor, in order (both paths: the second for an epoch finds nothing).
        self.convictions: list[Conviction] = []
        self._lanes: list[RayLane] = []

    @property
    def worker_ids(self) -> list[str]:
        return [w.id for w in self.workers]

    def lanes(self, host: DispatchHost, source: Source, sink: Sink,
              plan_for: Callable[[BatchKey], StagePlan]) -> list[RayLane]:
        """``spec.lanes`` engine-side lanes per actor, numbered actor by actor."""
        per = self.spec.lanes
        self._lanes = [RayLane(w.index * per + j, w, j, self.spec.slot_depth, host, source, sink, plan_for,
                               self.spec.nonfinite) for w in self.workers for j in range(per)]
        return self._lanes

    def epoch_of(self, worker: str) -> int | None:
        """The epoch ``worker`` works under (None: not one of these actors)."""
        w = self._by_id.get(worker)
        return None if w is None else w.epoch

    def convicted(self, worker: str, epoch: int, why: str) -> None:
        """``worker`` was convicted (its batches fenced): stop waiting for them, and learn its next
        epoch (a restarted or re-born actor)."""
        w = self._by_id.get(worker)
        if w is not None:
            self.convictions.append(Conviction(worker, epoch, why, time.monotonic()))
            for lane in self._lanes:
                if lane.worker is w:
                    lane.abandon_fenced()
            w.convicted(epoch)

    async def start(self, broker: BrokerAddress | None, heartbeat_s: float, secret: bytes | None = None) -> None:
        """Start every actor and wait until each has said who it is (its epoch); with ``secret``
        each signs its births, heartbeats and deaths."""
        ex = self.spec.executor
        handles = raylink.spawn(LaneWorker, len(self.workers), lambda k: (self.spec, self.workers[k].id, broker,
                                                                           heartbeat_s, secret),
                                gpus=ex.gpus_per_worker, max_restarts=ex.max_restarts)
        for w, h in zip(self.workers, handles, strict=True):
            w.handle = h
        greetings = [asyncio.ensure_future(w.greet()) for w in self.workers]
        done, waiting = await asyncio.wait(greetings, timeout=self.start_timeout_s)
        for g in waiting:
            g.cancel()
        if waiting:
            late = [w.id for w, g in zip(self.workers, greetings, strict=True) if g in waiting]
            raise WorkersDidNotStart(late, self.start_timeout_s, ex.gpus_per_worker)
        for g in done:
            g.result()  # an actor whose constructor raised: its error, now

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop every actor (goodbye on the broker), then end them."""
        await asyncio.gather(*(w.close(timeout_s) for w in self.workers))

    def view(self, worker: str, state: WorkerState, lanes: int, lanes_busy: int, done: int, failed: int) -> WorkerView:
        """An actor's row before the monitor adds what it heard (state, heartbeat age, phi)."""
        w = self._by_id[worker]
        h = w.hello
        if w.gone.is_set():
            state = WorkerState.DEAD
        return WorkerView(id=w.id, state=state, host=h.host if h else "", pid=h.pid if h else 0,
                          device=h.device if h else "", epoch=w.epoch, lanes=lanes, lanes_busy=lanes_busy,
                          progress=w.batches_done, tasks_done=done, tasks_failed=failed)
