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
  with a message that says so; one whose constructor cannot import a stage module fails it at once,
  naming the module and the fix (install it on every node, or ``runtime_env.py_modules``).
- Each actor reserves what ``[executor]`` says (CPUs, GPUs, custom resources), is placed as it
  says (``spread``/``pack``) and gets its ``runtime_env``; ``raylink`` turns that into Ray's options.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.plane import ControlSettings
from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.sinks import Sink, StagingSink
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.scaleout import raylink
from warpdeck.engine.scaleout.dispatch import DispatchHost, RayLane
from warpdeck.engine.scaleout.remote import RemoteWorker
from warpdeck.engine.scaleout.shared_data import SharedData, data_mode, opened_from_spec, shared_data
from warpdeck.engine.scaleout.worker import LaneWorker
from warpdeck.engine.state.batches import BatchKey
from warpdeck.engine.state.part_views import WorkerState
from warpdeck.engine.state.records import StagePlan
from warpdeck.engine.state.run_events import RunEvents
from warpdeck.engine.state.snapshot import WorkerView
from warpdeck.engine.state.task_states import Phase

__all__ = ["Conviction", "RayExecutor", "StageModuleMissing", "WorkersDidNotStart"]


@dataclass(frozen=True, slots=True)
class Conviction:
    """One conviction of an actor's epoch and what caused it (``will``, ``silent``… from the
    monitor, ``ray: …`` from Ray's actor-death error); the first per epoch is the one that acted."""

    worker: str
    epoch: int
    why: str
    at: float
    """``time.monotonic()`` when the engine acted on it."""


class WorkersDidNotStart(raylink.RayUnavailable):
    """Actors that did not answer in time; ``waiting`` names them."""

    def __init__(self, waiting: list[str], timeout_s: float, gpus: float, why: str = "") -> None:
        self.waiting = waiting
        super().__init__(f"actors {', '.join(waiting)} did not start within {timeout_s:g} s "
                         + (f"({why})" if why else f"(each needs {gpus:g} GPU; does the cluster have that many free?)"))


class StageModuleMissing(raylink.RayUnavailable):
    """An actor could not import a module the spec names (not installed on its node)."""

    def __init__(self, worker: str, module: str) -> None:
        self.module = module
        top = module.partition(".")[0]
        super().__init__(f"actor {worker} cannot import module {module!r}: install it on every Ray node, or ship it "
                         f'with the spec: [executor] runtime_env = {{ py_modules = ["path/to/{top}"] }}')


class RayExecutor:
    """The actors of one run and the engine's lanes that feed them."""

    def __init__(self, spec: PipelineSpec, on_change: Callable[[], None], start_timeout_s: float = 120.0,
                 run_dir: Path | None = None, control: ControlSettings | None = None) -> None:
        ex = spec.executor
        # Within connect_timeout_s, Ray's lines to run_dir/ray.log; a loopback plane refuses other hosts.
        raylink.connect(ex.address, ex.connect_timeout_s, run_dir, plane=control)
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
        self.convictions: list[Conviction] = []
        """Every conviction of an actor, in order (both paths: the second for an epoch finds nothing)."""
        self._lanes: list[RayLane] = []
        self.shared: SharedData | None = None
        """Shared data: what each actor opens to load and stage on its own (None: arrays are shipped)."""
        self._own_sink: Sink | None = None
        self.data_mode = ("ship", "")
        self.closing = False
        """Set as ``close`` begins: the actors' goodbyes from then on are the ones it asked for."""

    @property
    def worker_ids(self) -> list[str]:
        return [w.id for w in self.workers]

    def lanes(self, host: DispatchHost, source: Source, sink: Sink, plan_for: Callable[[BatchKey], StagePlan],
              own_sink: Sink | None = None) -> list[RayLane]:
        """``spec.lanes`` engine-side lanes per actor, numbered actor by actor. ``own_sink``: the
        engine's sink itself (``sink`` wraps it); where it and ``source`` are the spec's own and the
        data mode is shared, the actors load and stage (``shared_data.py``)."""
        own = own_sink if own_sink is not None else sink
        self.shared = shared_data(self.spec, own) if opened_from_spec(source) and isinstance(own, StagingSink) else None
        self._own_sink = own if self.shared is not None else None
        mode, why = data_mode(self.spec)
        if mode == "shared" and self.shared is None:
            mode, why = "ship", "the run's source or sink is an object of this process, not the spec's"
        self.data_mode = (mode, why)
        """``ship`` or ``shared``, and why: the report says it."""
        per = self.spec.lanes
        self._lanes = [RayLane(w.index * per + j, w, j, self.spec.slot_depth, host, source, sink, plan_for,
                               self.spec.nonfinite, self.shared is not None) for w in self.workers for j in range(per)]
        for lane in self._lanes:  # pinned threads: the engine's for shipped data, the actor's for shared
            lane.set_workers(Phase.FILL, self.spec.host.fill_workers or 1)
            lane.set_workers(Phase.SINK, self.spec.host.sink_workers or 1)
        return self._lanes

    def describe(self) -> str:
        """The report's line: how many actors, and who loaded and wrote the data."""
        mode, why = self.data_mode
        return f"ray: {len(self.workers)} actor(s), data {mode} ({why})"

    def epoch_of(self, worker: str) -> int | None:
        """The epoch ``worker`` works under (None: not one of these actors)."""
        w = self._by_id.get(worker)
        return None if w is None else w.epoch

    def asked_for(self, why: str) -> bool:
        """Whether a conviction for ``why`` is one ``close`` asked for: an actor's goodbye as the run
        ends, no loss to tell of and no return to wait for."""
        return self.closing and why == "graceful"

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

    async def start(self, broker: BrokerAddress | None, heartbeat_s: float, secret: bytes | None = None,
                    events: RunEvents | None = None) -> None:
        """Start every actor and wait until each has said who it is (its epoch); with ``secret``
        each signs its births, heartbeats and deaths; ``events`` hears each actor's losses and returns."""
        ex = self.spec.executor
        env = ex.runtime_env.to_ray() if ex.runtime_env is not None else None
        handles = raylink.spawn(LaneWorker, len(self.workers), lambda k: (self.spec, self.workers[k].id, broker,
                                                                           heartbeat_s, secret, self.shared),
                                gpus=ex.gpus_per_worker, max_restarts=ex.max_restarts, cpus=ex.cpus_per_worker,
                                resources=ex.resources, spread=ex.placement == "spread", runtime_env=env)
        for w, h in zip(self.workers, handles, strict=True):
            w.handle = h
            if events is not None:
                w.emit = events.emit
        greetings = [asyncio.ensure_future(w.greet()) for w in self.workers]
        done, waiting = await asyncio.wait(greetings, timeout=self.start_timeout_s)
        for g in waiting:
            g.cancel()
        if waiting:
            late = [w for w, g in zip(self.workers, greetings, strict=True) if g in waiting]
            # What Ray's actor table says each waits for (``starting: waiting for 1 GPU``).
            why = [f"{w.id} {n}" for w in late if (n := await asyncio.to_thread(raylink.actor_waiting, w.handle))]
            raise WorkersDidNotStart([w.id for w in late], self.start_timeout_s, ex.gpus_per_worker, "; ".join(why))
        # An actor whose constructor raised: its error, now (each one taken, so none is left unretrieved).
        for exc in [g.exception() for g in done]:
            if isinstance(exc, raylink.WorkerDied) and exc.missing_module:
                raise StageModuleMissing(exc.worker_id, exc.missing_module) from exc
            if exc is not None:
                raise exc

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop every actor (goodbye on the broker), then end them."""
        self.closing = True
        await asyncio.gather(*(w.close(timeout_s) for w in self.workers))
        if self._own_sink is not None:  # what fenced attempts staged and nobody will commit
            clean = getattr(self._own_sink, "clean_temps", None)
            if clean is not None:
                await asyncio.to_thread(clean)

    def view(self, worker: str, state: WorkerState, lanes: int, lanes_busy: int, done: int, failed: int) -> WorkerView:
        """An actor's row before the monitor adds what it heard (state, heartbeat age, phi)."""
        w = self._by_id[worker]
        h = w.hello
        if w.gone.is_set():
            state = WorkerState.DEAD
        return WorkerView(id=w.id, state=state, host=h.host if h else "", pid=h.pid if h else 0,
                          device=h.device if h else "", epoch=w.epoch, lanes=lanes, lanes_busy=lanes_busy,
                          progress=w.batches_done, tasks_done=done, tasks_failed=failed, note=w.note)
