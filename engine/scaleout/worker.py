"""The body of one Ray actor: a worker with its own device, lanes, slot rings and heartbeat.

The decisions this module protects:
- One actor is one worker in the control plane's sense (DESIGN.md section 2): it heartbeats over
  its own MQTT connection (the same ``Heartbeater`` as every worker: birth with host, pid and
  device, heartbeats, a Last Will), so the control room lists it like any other, and a SIGKILLed
  actor is convicted by its Will.
- Every (re)start of the actor process is a new epoch (a new heartbeat connection), and the engine
  asks the actor its epoch before giving it work; batches are leased under it.
- A worker the engine convicted while it lived (frozen, cut off) must be re-born to work again:
  ``hello(convicted)`` restarts its heartbeat under a newer epoch when its own is not newer.
- Nothing here imports Ray: Ray wraps this class into an actor (``raylink.spawn``), and the class
  runs as well in a test or a plain process.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import socket
import time

from warpdeck.engine.backends import select_backend
from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.heartbeat import Heartbeater, WorkerInfo, WorkerProbe
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.sources import BatchKey
from warpdeck.engine.run.lanes import Lane
from warpdeck.engine.run.torch_stages import stage_fns
from warpdeck.engine.scaleout.actor_host import ActorHost, ArrivedSource, KeepingSink
from warpdeck.engine.scaleout.jobs import BatchJob, BatchOutcome, WorkerHello
from warpdeck.engine.state.records import StagePlan, plan_stages

__all__ = ["LaneWorker"]

#: How long ``hello`` waits for the heartbeat's first connection before answering without it.
_CONNECT_WAIT_S = 10.0


def _version() -> str:
    try:
        return importlib.metadata.version("warpdeck")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "0+unknown"


class LaneWorker:
    """``spec.lanes`` lanes on this process's device, fed batch by batch by the engine."""

    def __init__(self, spec: PipelineSpec, worker_id: str, broker: BrokerAddress | None,
                 heartbeat_s: float = 0.5, secret: bytes | None = None) -> None:
        self.spec = spec
        self.worker_id = worker_id
        self.backend = select_backend(spec.backend)
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        #: What the birth and the control room show: the backend's device and Ray's GPU for it.
        self.device = f"{self.backend.device_name} (ray gpu {gpu})" if gpu else self.backend.device_name
        self._fns = stage_fns(spec.stages, self.backend.torch_stream)
        self._plans: dict[BatchKey, StagePlan] = {}
        self._broker = broker
        self._heartbeat_s = heartbeat_s
        self._secret = secret
        self._epoch = 0
        self.host = ActorHost(spec.lanes, self.epoch)
        self.lanes = [Lane(i, self.backend, spec.slot_depth, self.host, ArrivedSource(), KeepingSink(self.host.pending),
                           self._plan_for, spec.batch_size) for i in range(spec.lanes)]
        self._running: asyncio.Task[None] | None = None
        self.heart: Heartbeater | None = None
        self._rebirth()

    # -- epochs and the heartbeat ---------------------------------------------------------------
    def epoch(self) -> int:
        """The epoch this worker works under now (its heartbeat's, or its own without a broker)."""
        return self.heart.epoch if self.heart is not None else self._epoch

    def _rebirth(self) -> None:
        """Start a heartbeat (a new connection: a new, larger epoch), saying goodbye to the old one."""
        if self.heart is not None:
            self.heart.stop("re-born after conviction")
        self._epoch = max(self._epoch + 1, time.time_ns() // 1000)
        if self._broker is None:
            self.heart = None
            return
        lanes = self.lanes
        probe = WorkerProbe(progress=lambda: sum(ln.batches_done for ln in lanes),
                            lanes_busy=lambda: sum(1 for ln in lanes if ln.inflight_ids()),
                            leased=lambda: tuple(b for ln in lanes for b in ln.inflight_ids()))
        info = WorkerInfo(device=self.device, lanes=len(lanes), version=_version())
        self.heart = Heartbeater(self._broker, Topics(self.spec.name), self.worker_id, probe=probe, info=info,
                                 interval_s=self._heartbeat_s, secret=self._secret)
        self.heart.start()

    async def hello(self, convicted: int = 0) -> WorkerHello:
        """Who this worker is and its epoch, once its heartbeat is connected; re-born first when
        ``convicted`` (the engine's newest conviction of it) is not older than its epoch."""
        self._ensure_running()
        if self.heart is not None and self.epoch() <= convicted:
            await asyncio.to_thread(self._rebirth)
        heart = self.heart
        if heart is not None:
            await asyncio.to_thread(heart.connected.wait, _CONNECT_WAIT_S)
        return WorkerHello(self.worker_id, self.epoch(), socket.gethostname(), os.getpid(), self.device,
                           self.backend.name, len(self.lanes), heart is not None and heart.connected.is_set())

    # -- batches --------------------------------------------------------------------------------
    async def run(self, job: BatchJob) -> BatchOutcome:
        """Run one batch on lane ``job.lane``; its outputs come back in the outcome."""
        self._ensure_running()
        return await self.host.submit(job)

    def _ensure_running(self) -> None:
        if self._running is None:
            self._running = asyncio.get_running_loop().create_task(self._lanes(), name=f"{self.worker_id}-lanes")

    async def _lanes(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for lane in self.lanes:
                tg.create_task(lane.run(), name=f"{self.worker_id}-lane{lane.id}")

    def _plan_for(self, key: BatchKey) -> StagePlan:
        plan = self._plans.get(key)
        if plan is None:
            # "allow": the engine applies the spec's nonfinite policy when it commits the outputs.
            plan = self._plans[key] = plan_stages(self._fns, self.spec.stages, key, "allow")
        return plan

    async def stop(self) -> None:
        """Finish the batches in hand, stop the lanes, say goodbye on the broker."""
        self.host.close()
        if self._running is not None:
            with contextlib.suppress(Exception):
                await self._running
        if self.heart is not None:
            await asyncio.to_thread(self.heart.stop, "shutdown")
        self.backend.close()
