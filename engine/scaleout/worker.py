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
from dataclasses import replace
from pathlib import Path

from warpdeck.engine.backends.select import select_backend
from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.heartbeat import Heartbeater, WorkerInfo, WorkerProbe
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.sinks import StagingSink
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.run.lanes import Lane
from warpdeck.engine.run.torch_stages import stage_fns
from warpdeck.engine.scaleout.actor_host import ActorHost, ArrivedSource, KeepingSink
from warpdeck.engine.scaleout.jobs import BatchJob, BatchOutcome, WorkerHello
from warpdeck.engine.scaleout.shared_data import SharedData, stage_outputs
from warpdeck.engine.state.batches import BatchKey
from warpdeck.engine.state.records import StagePlan, format_exception, plan_stages
from warpdeck.engine.state.task_states import Phase

__all__ = ["LaneWorker"]

HOLD_AFTER_STAGE_ENV = "WARPDECK_FAULT_HOLD_AFTER_STAGE"
"""Fault injection for tests (set through ``runtime_env.env_vars``), ``WORKER:SECONDS:MARKER``: worker WORKER, after
staging a batch, waits SECONDS before answering, once (it creates the file MARKER, and never waits while it exists), so
a test can kill it between writing its temp files and the engine's commit."""

_CONNECT_WAIT_S = 10.0
"""How long ``hello`` waits for the heartbeat's first connection before answering without it."""


def _version() -> str:
    try:
        return importlib.metadata.version("warpdeck")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "0+unknown"


def _fault_hold(worker_id: str, tag: str, staged: tuple[str, ...]) -> float:
    """Seconds to wait under ``HOLD_AFTER_STAGE_ENV`` (0: not this worker, or held once already)."""
    worker, seconds, marker = [*os.environ.get(HOLD_AFTER_STAGE_ENV, "").split(":", 2), "", "", ""][:3]
    if worker != worker_id or not marker or Path(marker).exists():
        return 0.0
    Path(marker).write_text(f"{os.getpid()} {tag} {' '.join(staged)}")
    return float(seconds)


class LaneWorker:
    """``spec.lanes`` lanes on this process's device, fed batch by batch by the engine."""

    def __init__(self, spec: PipelineSpec, worker_id: str, broker: BrokerAddress | None,
                 heartbeat_s: float = 0.5, secret: bytes | None = None, shared: SharedData | None = None) -> None:
        self.spec = spec
        self.worker_id = worker_id
        self.backend = select_backend(spec.backend)
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.device = f"{self.backend.device_name} (ray gpu {gpu})" if gpu else self.backend.device_name
        """What the birth and the control room show: the backend's device and Ray's GPU for it."""
        self._fns = stage_fns(spec.stages, self.backend.torch_stream)
        self._plans: dict[BatchKey, StagePlan] = {}
        self._broker = broker
        self._heartbeat_s = heartbeat_s
        self._secret = secret
        self._epoch = 0
        self.host = ActorHost(spec.lanes, self.epoch)
        # Shared data: the actor's own source (its lanes load with it) and the sink it stages into.
        source: Source = ArrivedSource()
        self._stage_sink: StagingSink | None = None
        if shared is not None:
            source, self._stage_sink = shared.open()
        self._hold = bool(os.environ.get(HOLD_AFTER_STAGE_ENV))
        pins = spec.host
        self.lanes = [Lane(i, self.backend, spec.slot_depth, self.host, source, KeepingSink(self.host.pending),
                           self._plan_for, spec.batch_size, pins.fill_workers or 1, pins.sink_workers or 1)
                      for i in range(spec.lanes)]
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
        """Run one batch on lane ``job.lane``; its outputs come back in the outcome, or (shared
        data) are staged, and only the temp files' names come back."""
        self._ensure_running()
        outcome = await self.host.submit(job)
        if self._stage_sink is None or outcome.outputs is None:
            return outcome
        failed = {j for j, _ in outcome.fill_errors}
        rows = [j for j in range(len(job)) if j not in failed]
        tag = f"{self.worker_id}-e{outcome.epoch}-b{job.batch}"
        t0 = time.perf_counter()
        try:
            keys, staged, errors = await asyncio.to_thread(stage_outputs, self._stage_sink,
                                                           [job.items[j].key for j in rows], rows, outcome.outputs,
                                                           self.spec.nonfinite, tag)
        except Exception as exc:  # noqa: BLE001 - the batch fails in its sink phase, the engine judges
            return replace(outcome, outputs=None, failure=("sink", f"{type(exc).__name__}: {exc}",
                                                           format_exception(exc)))
        phases = list(outcome.phases)
        phases[Phase.SINK - 1] = (t0, time.perf_counter())
        if self._hold:  # fault injection (tests)
            await asyncio.sleep(await asyncio.to_thread(_fault_hold, self.worker_id, tag, staged))
        return replace(outcome, outputs=None, phases=tuple(phases), staged_keys=keys, staged=staged,
                       sink_errors=errors)

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
