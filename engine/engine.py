"""The engine: one run of a pipeline spec, wired from its parts and owned from start to report.

The decisions this module protects:
- The engine only wires and owns the run. The lanes' host is the dispatcher (``dispatcher.py``),
  commands go to the command handler (``command_handler.py``), snapshots come from the snapshot
  builder (``snapshot_builder.py``); they share one ``RunState``. Outages and journal failures are
  the fault watch's (``fault_watch.py``).
- The engine is an async context manager owning a TaskGroup of named tasks (feeder, lanes,
  publisher, fault watch); leaving it stops and awaits every one of them; nothing is
  fire-and-forget. The control plane runs on a thread of its own and joins after the run starts,
  so the first batch never waits for it.
- Every ending leaves a report, built from the final snapshot and the run's facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.backends.numpy_backend import NumpyBackend
from warpdeck.engine.backends.select import select_backend
from warpdeck.engine.control.heartbeat import NvmlSampler, WorkerInfo, WorkerProbe
from warpdeck.engine.control.monitor_types import Verdict
from warpdeck.engine.control.plane import ControlPlane, ControlSettings
from warpdeck.engine.control.topics import Topics
from warpdeck.engine.control.views import local_worker_id
from warpdeck.engine.edges.config import ParquetSink, PipelineSpec
from warpdeck.engine.edges.journal import Journal, JournalError, ResumeState, spec_identity
from warpdeck.engine.edges.journaled_table import JournaledTable
from warpdeck.engine.edges.outage import HeldSink, Outage, sink_dir
from warpdeck.engine.edges.resume import ResumingSource
from warpdeck.engine.edges.sinks import DurableSink, Sink, open_sink, settle
from warpdeck.engine.edges.sources import Source, open_source, row_loader
from warpdeck.engine.run.autotune import Autotuner
from warpdeck.engine.run.batching import ReadyQueue
from warpdeck.engine.run.command_handler import CommandHandler
from warpdeck.engine.run.dispatcher import Dispatcher
from warpdeck.engine.run.fault_watch import FaultWatch
from warpdeck.engine.run.feeder import Feeder, feeder_watermarks
from warpdeck.engine.run.lane_protocols import LaneLike
from warpdeck.engine.run.lanes import Lane
from warpdeck.engine.run.process_fill import ProcessFill
from warpdeck.engine.run.process_sink import ProcessSink
from warpdeck.engine.run.reporting import RunFacts, make_report
from warpdeck.engine.run.run_state import RunState
from warpdeck.engine.run.snapshot_builder import HOST, SnapshotBuilder
from warpdeck.engine.run.task_keys import TaskKeys
from warpdeck.engine.run.torch_stages import Params, stage_fns
from warpdeck.engine.state.batches import BatchKey, TaskInput
from warpdeck.engine.state.commands import Command, CommandResult
from warpdeck.engine.state.leases import LeaseBook
from warpdeck.engine.state.metrics import MetricsAccumulator
from warpdeck.engine.state.records import BatchRecord, StagePlan, plan_stages
from warpdeck.engine.state.report import RunReport
from warpdeck.engine.state.snapshot import EngineSnapshot, EngineStatus, SnapshotPublisher, TaskDetail
from warpdeck.engine.state.task_states import State

if TYPE_CHECKING:
    from warpdeck.engine.scaleout.executor import RayExecutor

__all__ = ["Engine"]

_FAULT_TICK_S = 0.1
"""How often outages and the journal's health are looked at (a journal failure stops the run within it)."""


class Engine:
    """Runs one pipeline spec. Use ``async with Engine(spec) as eng: report = await eng.wait()``."""

    def __init__(self, spec: PipelineSpec, run_dir: Path | str | None = None, *,
                 backend: Backend | None = None, source: Source | None = None, sink: Sink | None = None,
                 snapshot_interval: float = 0.1, journal: bool | None = None, retry_failed: bool = False,
                 control: ControlSettings | None = None, workers: int = 1, params: Params | None = None) -> None:
        if spec.steps:
            raise ValueError(f"{spec.name}: a spec with steps runs step by step (engine/steps/runner.py: run_steps), "
                             "not in one engine")
        self.spec = spec
        self._params = params
        """The results of the reduces before this step (``fn(xp, inp, out, params)``), None outside a step."""
        self.run_dir = Path(run_dir) if run_dir is not None else Path(".warpdeck") / spec.name
        # executor = "ray": the actors that run the batches (None: lanes in this process).
        self.executor, workers, backend = _scale_out(spec, self._kick, workers, backend, self.run_dir, control)
        self.backend = backend if backend is not None else select_backend(spec.backend)
        if sink is not None and spec.host.sink_pool == "processes":
            raise ValueError("host.sink_pool = 'processes' writes through the spec's sink, opened in each worker "
                             "process; a sink object given here writes in this process: use threads")
        self.sink = sink if sink is not None else open_sink(spec.sink, self.run_dir)
        # A run given a run directory is durable by default: journaled there, resumed from there.
        # Without one (library calls, most tests) nothing is written unless journal=True.
        durable = run_dir is not None if journal is None else journal
        local = spec.executor.kind == "local"
        processes = spec.host.fill_pool == "processes" and local
        raw_source = source if source is not None else open_source(spec.source, processes=processes)
        self._row_loader = row_loader(raw_source) if processes else None
        """Loads one task into its row in a fill worker process (``[host] fill_pool``): always with "processes"; with
        "auto" where the source can, for the tuner to move the fill there."""
        if spec.host.fill_pool == "auto" and local:
            with contextlib.suppress(ValueError):  # a source that loads in the engine's process only
                self._row_loader = row_loader(raw_source)
        self.resume = ResumingSource(raw_source, self.sink) if durable else None
        self.source: Source = self.resume if self.resume is not None else raw_source
        self.retry_failed = retry_failed
        self.journal: Journal | None = None
        self.temps_cleaned = 0
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.state = self._make_state(workers)
        self.dispatcher = Dispatcher(self.state, self.executor.convicted if self.executor is not None else None)
        """The lanes' host: hands out batches, hears their progress, retries or fails."""
        self.commands = CommandHandler(self.state, known_workers=self._known_workers, quarantine=self._quarantine)
        self.faults = FaultWatch(spec.faults.outage_timeout_s, self.state.events)
        """Outages (a full, read-only or failing disk) and journal failures, and when to stop."""
        self.state.lanes = self._make_lanes()
        self.publisher = SnapshotPublisher()
        self.events = self.state.events  # every batch, stall, command, conviction: for the exporters
        self.control: ControlPlane | None = None
        self._control_settings = control
        self._snapshots = SnapshotBuilder(self.state, backend=self.backend, source=self.source, outage=self.outage,
                                          executor=self.executor, control=lambda: self.control,
                                          epoch_of=self._epoch_of)
        self._snapshot_interval = snapshot_interval
        self._status: EngineStatus = "starting"
        self._main: asyncio.Task[None] | None = None
        self.report: RunReport | None = None

    def _make_state(self, workers: int) -> RunState:
        spec = self.spec
        nl = spec.lanes * workers  # in-process workers: each a group of spec.lanes lanes with its own heartbeat
        table = JournaledTable()
        ready = ReadyQueue(spec.batch_size, spec.batch_timeout_s)
        low, high = feeder_watermarks(spec, nl)
        feeder = Feeder(self.source, table, ready, low, high, on_admit=self._on_admit,
                        prepare=self._prepare if self.resume is not None else None)
        worker_ids = _worker_ids(local_worker_id(HOST, self.backend.device_name), workers, self.executor)
        return RunState(
            spec=spec, table=table, ready=ready, feeder=feeder, leases=LeaseBook(self._epoch_of),
            metrics=MetricsAccumulator(nl), task_keys=TaskKeys(table, ready, feeder, self.source, self.resume),
            tuner=Autotuner.for_spec(spec),
            worker_ids=worker_ids, lane_worker=[worker_ids[i // spec.lanes] for i in range(nl)],
            auto_depth=spec.feeder.auto_depth)

    # The parts are made after the callbacks they are given: these look them up when called.
    def _kick(self) -> None:
        self.state.kick()

    def _on_admit(self) -> None:
        self.dispatcher.on_admit()

    def _make_lanes(self) -> Sequence[LaneLike]:
        self._fns = stage_fns(self.spec.stages, self.backend.torch_stream, self._params)
        self._plans: dict[BatchKey, StagePlan] = {}
        # Environment errors hold a lane's writes (an outage) instead of failing its tasks.
        where = sink_dir(self.sink, self.run_dir)
        sink = HeldSink(self.task_keys.guard(self.sink), self.outage, where)
        if self.executor is not None:
            return self.executor.lanes(self.dispatcher, self.source, sink, self._plan_for, self.sink)
        host = self.spec.host
        auto = host.fill_pool == "auto" and self._row_loader is not None
        self.state.tuner.fill_auto = auto
        lanes = []
        lanes_n = len(self.state.lane_worker)
        tuner = self.state.tuner
        first_fill = tuner.first_fill(lanes_n, None if self.spec.feeder.auto_depth else self.spec.slot_depth)
        fits = None if host.fill_workers or first_fill == 1 else tuner.first_fill_fits(lanes_n, first_fill)
        for i in range(lanes_n):
            writers = self._sink_processes(i) if host.sink_pool == "processes" else None
            lanes.append(Lane(
                i, self.backend, self.spec.slot_depth, self.dispatcher, self.source,
                sink if writers is None else HeldSink(self.task_keys.guard(writers), self.outage, where),
                self._plan_for, self.spec.batch_size, host.fill_workers or first_fill,
                host.sink_workers or 1,
                self._fill_processes(i) if host.fill_pool == "processes" else None,
                functools.partial(self._fill_processes, i) if auto else None, writers,
                fits))
        return lanes

    def _sink_processes(self, lane: int) -> ProcessSink:
        host, spec = self.spec.host, self.spec.sink
        assert not isinstance(spec, ParquetSink)  # the spec refuses sink_pool = "processes" for it
        return ProcessSink(self.backend, spec, self.run_dir, self.sink, host.sink_workers or 1, host.process_deadline_s,
                           f"{self.spec.name}-lane{lane}")

    def _fill_processes(self, lane: int) -> ProcessFill | None:
        if self._row_loader is None:
            return None
        host = self.spec.host
        return ProcessFill(self.backend, self._row_loader, host.fill_workers or 1, host.process_deadline_s,
                           f"{self.spec.name}-lane{lane}")

    # -- what the run is made of (read-only views for the CLI, the TUI link and tests) ---------------
    @property
    def table(self) -> JournaledTable:
        t = self.state.table
        assert isinstance(t, JournaledTable)
        return t

    @property
    def feeder(self) -> Feeder:
        return self.state.feeder

    @property
    def leases(self) -> LeaseBook:
        return self.state.leases

    @property
    def metrics(self) -> MetricsAccumulator:
        return self.state.metrics

    @property
    def task_keys(self) -> TaskKeys:
        """Cancel, retry and detail by key (tasks not admitted yet included)."""
        return self.state.task_keys

    @property
    def lanes(self) -> Sequence[LaneLike]:
        return self.state.lanes

    @property
    def worker_ids(self) -> list[str]:
        """The workers' ids: the in-process ones, or the actors."""
        return self.state.worker_ids

    @property
    def worker_id(self) -> str:
        return self.state.worker_ids[0]

    @property
    def quarantined(self) -> set[str]:
        """Workers an operator quarantined; the local one among them gets no new batches."""
        return self.state.quarantined

    @property
    def timeline(self) -> tuple[BatchRecord, ...]:
        """The last batch records (at most 2048), oldest first; a snapshot carries the last 512."""
        return tuple(self.state.timeline)

    @property
    def first_batch_s(self) -> float | None:
        return self.dispatcher.first_batch_s

    @property
    def outage(self) -> Outage:
        """Writes held by a full, read-only or failing disk (outputs or journal)."""
        return self.faults.outage

    @property
    def stopped_by(self) -> str:
        """Why the engine stopped itself before the end: ``outage`` or ``journal``, or ``source`` (it
        raised part way: the run admitted no more) ("" otherwise)."""
        return self.faults.stopped_by or ("source" if self.feeder.source_error else "")

    # -- lifecycle --------------------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        if self.resume is not None:
            journal, state = await asyncio.to_thread(self._open_journal)
            self.journal = journal
            journal.outage = self.outage
            self.table.attach(journal)
            self.resume.begin(state, journal, self.retry_failed)
            self.task_keys.attach(journal, state.cancels)
        self.dispatcher.t0 = time.perf_counter()
        self.outage.set_origin(self.dispatcher.t0)
        self._status = "running"
        self._main = asyncio.create_task(self._run(), name=f"warpdeck-engine-{self.spec.name}")
        if self._control_settings is not None:
            self._start_control(self._control_settings)
        return self

    async def __aexit__(self, *exc: object) -> None:
        failed: Exception | None = None  # the run's own error, raised once everything is closed
        if self._main is not None:
            if not self._main.done():
                # A stop: held writes give up now (a resume writes them), not wait for the disk.
                self.outage.abandon()
            self._main.cancel()  # nothing, where it has ended
            try:
                await self._main
            except asyncio.CancelledError:
                pass
            except Exception as err:  # noqa: BLE001 - raised below, after the closing
                failed = err
        try:
            if self.executor is not None:
                await self.executor.close()
            if self.control is not None:
                # The last telemetry (the final snapshot) goes out before the goodbye.
                await asyncio.to_thread(self.control.stop)
            self.outage.abandon()  # nothing still held may keep the journal from closing
            settled = self.journal is None  # nothing resumes from a run without a journal
            if self.journal is not None:
                try:
                    await asyncio.to_thread(self.journal.close)
                except JournalError as err:  # what the run did is in the report; the journal lost some
                    if self.report is None:
                        raise
                    self.report = self.report.model_copy(update={"journal_error": str(err)})
                else:
                    # Every output a finished run landed is journaled done: no resume needs its checksum.
                    settled = self.report is not None and self.report.status in ("finished", "drained")
            if settled:
                await asyncio.to_thread(settle, self.sink)
        finally:
            self.backend.close()
        if failed is not None:
            raise failed

    async def wait(self) -> RunReport:
        """Wait for the run to end and return its report."""
        assert self._main is not None, "use the engine inside 'async with'"
        await asyncio.shield(self._main)
        assert self.report is not None
        return self.report

    async def _run(self) -> None:
        try:
            if self.executor is not None:  # before the task group: a failure to start is raised as is
                self.publisher.publish(self.snapshot())
                await self._start_executor(self.executor)
            async with asyncio.TaskGroup() as tg:
                helpers = [tg.create_task(self.feeder.run(), name="warpdeck-feeder"),
                           tg.create_task(self._publish_loop(), name="warpdeck-snapshots"),
                           tg.create_task(self._watch_faults(), name="warpdeck-faults")]
                lanes = [tg.create_task(lane.run(), name=f"warpdeck-lane{lane.id}") for lane in self.lanes]
                stop = tg.create_task(self.faults.stop.wait(), name="warpdeck-stop")
                running = set(lanes)
                while running:
                    done, _ = await asyncio.wait([*running, stop], return_when=asyncio.FIRST_COMPLETED)
                    running -= done
                    for task in done - {stop}:
                        task.result()  # a lane's own error is raised here
                    if stop.done() and running:  # the engine stops itself: what is in flight stays for a resume
                        for task in running:
                            task.cancel()
                        await asyncio.wait(running)
                        break
                if self.journal is not None and not stop.done():
                    # The last records commit while the fault watch still runs, so a journal outage
                    # now holds the run (and times out) as one mid-run does, not fail the close.
                    flushed = tg.create_task(asyncio.to_thread(self.journal.flush), name="warpdeck-flush")
                    await asyncio.wait([flushed, stop], return_when=asyncio.FIRST_COMPLETED)
                # An outage that ended since the fault watch's last tick is told now: a run that
                # finished within a tick of its end left the exporters a stall that never ended.
                self._fault_tick()
                for task in (*helpers, stop):
                    task.cancel()
        finally:
            self.outage.abandon()
            self._status = self._final_status()
            self.report = make_report(self.snapshot(), self._facts())
            self.publisher.publish(self.snapshot())
            self.publisher.close()

    def _final_status(self) -> EngineStatus:
        """Stopped (work left: tasks queued or running, or a source not exhausted nor drained) beats
        cancelled beats drained beats finished."""
        counts = self.table.counts()
        unfinished = counts[State.QUEUED].sum() + counts[State.RUNNING].sum()
        if unfinished or not (self.feeder.exhausted or self.feeder.draining):
            return "stopped"
        if self.state.cancelled_all:
            return "cancelled"
        return "drained" if self.feeder.draining else "finished"

    def _facts(self) -> RunFacts:
        """What the report needs beyond the final snapshot."""
        t = self.table
        unfinished = np.flatnonzero(t.state[: len(t)] >= State.FAILED)
        return RunFacts(
            batch_size=self.spec.batch_size, first_batch_s=self.first_batch_s,
            failures=[(t.keys[r], t.error(r), int(t.attempt[r])) for r in unfinished.tolist()],
            flags=[(t.keys[r], note) for r, note in sorted(t.flags().items())],
            resume=self.resume, journal=self.journal, temps_cleaned=self.temps_cleaned, control=self.control,
            outage=self.outage, stopped_by=self.stopped_by, source_error=self.feeder.source_error,
            source_traceback=self.feeder.source_traceback, executor=self.executor.describe() if self.executor else "",
            phase_clocks=dict(self.backend.phase_clocks),
            tuning=[f"lane {d.lane}: {d.reason} (depth {d.depth})" for d in self.state.tuner.decisions[-20:]])

    async def _publish_loop(self) -> None:
        while True:
            self.publisher.publish(self.snapshot())
            await asyncio.sleep(self._snapshot_interval)

    async def _watch_faults(self) -> None:
        while True:
            self._fault_tick()
            await asyncio.sleep(_FAULT_TICK_S)

    def _fault_tick(self) -> None:
        journal_failed = self.journal is not None and self.journal.error is not None
        if self.faults.check(self.table, self.feeder, self.dispatcher.t0, journal_failed):
            self.state.kick()
            self.feeder.poke()

    def _open_journal(self) -> tuple[Journal, ResumeState]:
        """Lock the run directory, open its journal, clear a killed run's temp files (a thread)."""
        journal, state = Journal.open(self.run_dir, spec_identity(self.spec))
        if isinstance(self.sink, DurableSink):
            try:
                self.temps_cleaned = self.sink.clean_temps()
            except BaseException:
                journal.close()
                raise
        return journal, state

    def _prepare(self, rows: npt.NDArray[np.int64], items: list[TaskInput]) -> None:
        assert self.resume is not None
        self.resume.restore(self.table, rows, items)

    def _plan_for(self, key: BatchKey) -> StagePlan:
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_stages(self._fns, self.spec.stages, key, self.spec.nonfinite)
        return plan

    # -- commands and questions ---------------------------------------------------------------------
    async def command(self, cmd: Command) -> CommandResult:
        """Apply an operator command; the answer says what it did."""
        result = self.commands.apply(cmd)
        self.state.kick()
        self.feeder.poke()
        return result

    def task_detail(self, key: str) -> TaskDetail | None:
        """Everything known about one task (admitted, still to come, or finished by an earlier run),
        or None for a key the engine does not know. On the engine's loop while the run lasts; from
        any thread once it has ended (the table no longer changes)."""
        return self.task_keys.detail(key)

    def snapshot(self) -> EngineSnapshot:
        """The engine as of now (cheap enough to call at 10 Hz with a million tasks)."""
        return self._snapshots.build(self._status, self.dispatcher.t0)

    # -- the control plane --------------------------------------------------------------------------
    def _start_control(self, settings: ControlSettings) -> None:
        """Join the control plane (a thread of its own); the first batch never waits for it."""
        # Device load through NVML where the device is a GPU and nvidia-ml-py is installed.
        # (NVML index 0: the CuPy backend drives device 0; CUDA_VISIBLE_DEVICES may renumber it.)
        nvml = NvmlSampler(0) if self.backend.name == "cupy" else None
        local = []
        for wid in self.worker_ids if self.executor is None else ():  # actors heartbeat for themselves
            lanes = [ln for ln in self.lanes if self.state.lane_worker[ln.id] == wid]
            local.append((wid, WorkerInfo(device=self.backend.device_name, lanes=len(lanes), version=_version()),
                          _probe(lanes, nvml)))
        self.control = ControlPlane(settings, Topics(self.spec.name), workers=local,
                                    latest=lambda: self.publisher.latest, command=self.command,
                                    on_verdict=self._on_verdict, run_events=self.events)
        self.control.start()

    async def _start_executor(self, executor: RayExecutor) -> None:
        """Start the actors once the control plane has a broker to give them (none: no heartbeats)."""
        plane, broker, interval, secret = self.control, None, 0.5, None
        if plane is not None:
            await asyncio.to_thread(plane.connected.wait, 30)
            broker, interval, secret = plane.address, plane.settings.heartbeat_s, plane.settings.secret
        await executor.start(broker, interval, secret, self.events)

    def _epoch_of(self, worker: str) -> int:
        """The epoch ``worker`` heartbeats under now (0 without a control plane)."""
        if self.executor is not None:
            remote = self.executor.epoch_of(worker)
            if remote is not None:
                return remote
        plane = self.control
        return plane.epoch_of(worker) if plane is not None else 0

    def _on_verdict(self, verdict: Verdict) -> None:
        """The monitor convicted a worker: take back every batch it held (on the engine's loop)."""
        if verdict.kind == "dead" and verdict.worker_id in self.worker_ids:
            asked = self.executor is not None and self.executor.asked_for(verdict.reason)  # the run's end: no news
            self.dispatcher.reclaim(verdict.worker_id, verdict.epoch, verdict.reason, told=not asked)

    def _known_workers(self) -> list[str]:
        return [w.id for w in latest.workers] if (latest := self.publisher.latest) is not None else []

    def _quarantine(self, worker: str, on: bool) -> None:
        if self.control is not None:
            self.control.quarantine(worker, on)


def _version() -> str:
    try:
        return importlib.metadata.version("warpdeck")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "0+unknown"


def _probe(lanes: list[LaneLike], nvml: NvmlSampler | None) -> WorkerProbe:
    """What one in-process worker's heartbeat reports, read from the heartbeat's thread."""
    return WorkerProbe(progress=lambda: sum(lane.batches_done for lane in lanes),
                       lanes_busy=lambda: sum(1 for lane in lanes if lane.inflight_ids()),
                       leased=lambda: tuple(b for lane in lanes for b in lane.inflight_ids()),
                       device_stats=nvml if nvml is not None and nvml.available else None)


def _scale_out(spec: PipelineSpec, on_change: Callable[[], None], workers: int, backend: Backend | None,
               run_dir: Path, control: ControlSettings | None) -> tuple[RayExecutor | None, int, Backend | None]:
    """For ``executor = "ray"``: the actors (joining the cluster, Ray's lines to run_dir's ray.log), one
    worker per actor, and a NumPy backend for the engine itself (it computes nothing). Else what was given."""
    if spec.executor.kind != "ray":
        return None, workers, backend
    from warpdeck.engine.scaleout.executor import RayExecutor  # noqa: PLC0415 - only a Ray run loads it

    executor = RayExecutor(spec, on_change, run_dir=run_dir, control=control)
    return executor, len(executor.workers), backend or NumpyBackend("executor = ray: stages run on the actors")


def _worker_ids(base: str, workers: int, executor: RayExecutor | None) -> list[str]:
    if executor is not None:
        return executor.worker_ids
    return [base] if workers == 1 else [f"{base}.w{k}" for k in range(workers)]
