"""A run's metrics for Prometheus: an OpenMetrics endpoint (``warpdeck run SPEC --metrics HOST:PORT``).

The decisions this module protects:
- The exporter never slows the run and never stops it. On the engine's loop it only bumps counters
  (``on_event``) and, at the snapshot rate, freezes them beside the newest snapshot into one
  immutable ``_Scrape`` (``on_snapshot``); a scrape, on the HTTP server's thread, reads that one
  attribute and builds the metric families from immutable data only. Nothing is shared that either
  side changes, so there is no lock. Event counters lag the events by at most one snapshot.
- Each exporter has its own ``CollectorRegistry`` and server (several engines in one process, as in
  the tests, never see each other's series); prometheus_client's WSGI server runs on its daemon
  thread and answers OpenMetrics to a scraper that asks for it (Prometheus does), text otherwise.
- Label sets are bounded: pipeline, state, phase, reason, lane, direction, verb, cause, never a task
  key or a batch id. A conviction's cause is free text (``ray: <why>``): it is classed into will,
  silent, hung, ray or other. Bounded label values are exported at zero before they happen, so
  ``increase()`` and alert rules see a series from the first scrape (command verbs come from the
  command union).
- Counters never go down. What the snapshot counts (finished tasks, the control plane's refusals
  and drops) can (a retried failure leaves ``failed``; a control plane counts afresh): the counters
  add up its increases only.
- Bytes moved: a batch record's ``nbytes`` (its inputs) count as h2d once its h2d ended, its
  ``out_nbytes`` (its outputs) as d2h once its d2h ended (engine/run/lanes.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import get_args
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from warpdeck.engine.state.commands import Command
from warpdeck.engine.state.part_views import WorkerState
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.run_events import BatchFinished, CommandEvent, RunEvent, StallEvent, WorkerConvicted
from warpdeck.engine.state.snapshot import ControlView, EngineSnapshot, EngineStatus
from warpdeck.engine.state.task_states import RUN_PHASES, Phase, StallReason

__all__ = ["CONVICTION_CAUSES", "MetricsBindError", "MetricsExporter", "conviction_cause"]

CONVICTION_CAUSES = ("will", "silent", "hung", "ray", "other")
"""The classes a conviction's cause is put in (``conviction_cause``)."""
_PHASES: tuple[str, ...] = tuple(p.label for p in RUN_PHASES)
_STALLS: tuple[str, ...] = tuple(r.label for r in StallReason if r)
_FINISHED = ("done", "failed", "cancelled")
_VERBS: tuple[str, ...] = tuple(cls.model_fields["kind"].default for cls in get_args(get_args(Command)[0]))
"""Every command's verb (its ``kind``), from the command union."""
_STATUSES: tuple[EngineStatus, ...] = get_args(EngineStatus)
_H2D, _D2H = Phase.H2D - 1, Phase.D2H - 1
_JOIN_S = 5.0
"""How long ``close`` waits for the server's thread (it stops within its 0.5 s poll)."""

Rows = Iterable[tuple[Sequence[str], float]]
"""A label set's values, and a sample's value."""


def conviction_cause(cause: str) -> str:
    """A ``WorkerConvicted.cause`` in one of ``CONVICTION_CAUSES``: its Will (or a goodbye), silence,
    a hang, Ray's report of a dead actor, or other."""
    head = cause.strip().lower()
    if head.startswith("ray"):
        return "ray"
    if head in ("will", "graceful"):
        return "will"
    if head == "silent":
        return "silent"
    if head in ("stuck", "hung"):
        return "hung"
    return "other"


class MetricsBindError(OSError):
    """The metrics endpoint could not listen on ``host``:``port`` (in use, not an address here);
    ``errno`` and ``strerror`` are the socket's."""

    def __init__(self, host: str, port: int, errno: int | None, reason: str) -> None:
        super().__init__(errno, reason)
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return f"cannot serve metrics on {self.host}:{self.port}: {self.strerror}"


@dataclass(frozen=True, slots=True)
class _Tallies:
    """What the events (and the snapshots' own counts) added up to, frozen for a scrape."""

    batches: Mapping[tuple[str, str], int] = field(default_factory=dict)
    busy_s: Mapping[tuple[str, str], float] = field(default_factory=dict)
    moved: Mapping[str, int] = field(default_factory=dict)
    stalls: Mapping[str, int] = field(default_factory=dict)
    stall_s: Mapping[str, float] = field(default_factory=dict)
    convictions: Mapping[str, int] = field(default_factory=dict)
    applied: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, int] = field(default_factory=dict)
    finished: Mapping[str, int] = field(default_factory=dict)
    wire_refused: Mapping[str, int] = field(default_factory=dict)
    dropped: Mapping[str, int] = field(default_factory=dict)
    reconnects: int = 0


@dataclass(frozen=True, slots=True)
class _Scrape:
    """What one scrape reads: the newest snapshot (None before the first) and the tallies with it."""

    snap: EngineSnapshot | None
    tallies: _Tallies


class _Increases:
    """A counter made of a count that may go down: the sum of its increases, by name."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.total = dict.fromkeys(names, 0)
        self._last: dict[str, int] = {}

    def see(self, counts: Mapping[str, int]) -> None:
        for name, n in counts.items():
            self.total[name] = self.total.get(name, 0) + max(0, n - self._last.get(name, 0))
            self._last[name] = n


class _Counters:
    """The loop's side: counters the events and snapshots bump (only ever on the engine's loop)."""

    def __init__(self) -> None:
        self.batches: dict[tuple[str, str], int] = {}
        self.busy_s: dict[tuple[str, str], float] = {}
        self.moved = dict.fromkeys(("h2d", "d2h"), 0)
        self.stalls = dict.fromkeys(_STALLS, 0)
        self.stall_s = dict.fromkeys(_STALLS, 0.0)
        self.convictions = dict.fromkeys(CONVICTION_CAUSES, 0)
        self.applied = dict.fromkeys(_VERBS, 0)
        self.refused = dict.fromkeys(_VERBS, 0)
        self.finished = _Increases(_FINISHED)
        self.wire_refused = _Increases()
        self.dropped = _Increases()
        self.reconnects = _Increases()
        self._queue_stall_since: dict[str, float] = {}

    def batch(self, rec: BatchRecord) -> None:
        lane = str(rec.lane)
        key = (lane, "ok" if rec.ok else "failed")
        self.batches[key] = self.batches.get(key, 0) + 1
        for name, (t0, t1) in zip(_PHASES, rec.phases, strict=False):
            if t0 and t1 > t0:
                self.busy_s[lane, name] = self.busy_s.get((lane, name), 0.0) + (t1 - t0)
        if rec.phases[_H2D][1]:
            self.moved["h2d"] += rec.nbytes
        if rec.phases[_D2H][1]:
            self.moved["d2h"] += rec.out_nbytes

    def stall(self, ev: StallEvent) -> None:
        if ev.began:
            self.stalls[ev.reason] = self.stalls.get(ev.reason, 0) + 1
            if ev.batch < 0:
                self._queue_stall_since[ev.reason] = ev.t
            return
        lasted = ev.lasted_s
        since = self._queue_stall_since.pop(ev.reason, None) if ev.batch < 0 else None
        if not lasted and since is not None:  # a resume ends a pause's stall without its length
            lasted = max(0.0, ev.t - since)
        self.stall_s[ev.reason] = self.stall_s.get(ev.reason, 0.0) + lasted

    def command(self, ev: CommandEvent) -> None:
        into = self.applied if ev.applied else self.refused
        into[ev.verb] = into.get(ev.verb, 0) + 1

    def snapshot(self, snap: EngineSnapshot) -> None:
        c = snap.counts
        self.finished.see({"done": c.done, "failed": c.failed, "cancelled": c.cancelled})
        if snap.control is not None:
            self.wire_refused.see(snap.control.commands_refused)
            self.dropped.see(snap.control.dropped)
            self.reconnects.see({"": snap.control.reconnects})

    def freeze(self) -> _Tallies:
        return _Tallies(
            batches=dict(self.batches), busy_s=dict(self.busy_s), moved=dict(self.moved),
            stalls=dict(self.stalls), stall_s=dict(self.stall_s), convictions=dict(self.convictions),
            applied=dict(self.applied), refused=dict(self.refused), finished=dict(self.finished.total),
            wire_refused=dict(self.wire_refused.total), dropped=dict(self.dropped.total),
            reconnects=self.reconnects.total.get("", 0))


class MetricsExporter:
    """Serves one run's metrics at ``url`` from the moment it is made until ``close``.

    Subscribe it to the run: ``engine.events.subscribe(x.on_event)`` and
    ``engine.publisher.subscribe(x.on_snapshot)``; both are called on the engine's loop and return
    at once. ``port`` 0 takes a free port. Raises ``MetricsBindError`` when it cannot listen."""

    def __init__(self, host: str, port: int, pipeline: str) -> None:
        self.pipeline = pipeline
        self._counters = _Counters()
        self._scrape = _Scrape(None, self._counters.freeze())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_RunCollector(pipeline, lambda: self._scrape))
        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise MetricsBindError(host, port, exc.errno, exc.strerror or str(exc)) from exc
        thread.name = f"warpdeck-metrics-{pipeline}"
        self._server: WSGIServer | None = server
        self._thread: threading.Thread | None = thread
        self._host = host
        self._port = int(server.server_address[1])

    @property
    def url(self) -> str:
        """Where Prometheus scrapes: ``http://HOST:PORT/metrics``, with the port actually bound."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}/metrics"

    @property
    def port(self) -> int:
        """The port the endpoint listens on."""
        return self._port

    def on_event(self, event: RunEvent) -> None:
        """Count one run event (on the engine's loop)."""
        c = self._counters
        if isinstance(event, BatchFinished):
            c.batch(event.record)
        elif isinstance(event, StallEvent):
            c.stall(event)
        elif isinstance(event, CommandEvent):
            c.command(event)
        elif isinstance(event, WorkerConvicted):
            cause = conviction_cause(event.cause)
            c.convictions[cause] += 1

    def on_snapshot(self, snap: EngineSnapshot) -> None:
        """Take the newest snapshot and freeze the counters beside it for the next scrapes."""
        self._counters.snapshot(snap)
        self._scrape = _Scrape(snap, self._counters.freeze())

    def close(self, last: EngineSnapshot | None = None) -> None:
        """Take the final snapshot (when given), then stop serving (waits for the server's thread)."""
        if last is not None:
            self.on_snapshot(last)
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        thread.join(_JOIN_S)


class _RunCollector(Collector):
    """Builds every family at scrape time from the newest ``_Scrape`` (on the server's thread)."""

    def __init__(self, pipeline: str, latest: Callable[[], _Scrape]) -> None:
        self._pipeline = pipeline
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        scrape = self._latest()  # one read of one immutable object: all this scrape sees
        if scrape.snap is not None:
            yield from _snapshot_families(self._pipeline, scrape.snap)
        yield from _counter_families(self._pipeline, scrape.tallies)
        if scrape.snap is not None and scrape.snap.control is not None:
            yield from _control_families(self._pipeline, scrape.snap.control, scrape.tallies)


def _gauge(p: str, name: str, doc: str, labels: Sequence[str], rows: Rows, unit: str = "") -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=("pipeline", *labels), unit=unit)
    for values, v in rows:
        fam.add_metric((p, *values), v)
    return fam


def _counter(p: str, name: str, doc: str, labels: Sequence[str], rows: Rows, unit: str = "") -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=("pipeline", *labels), unit=unit)
    for values, v in rows:
        fam.add_metric((p, *values), v)
    return fam


def _by(named: Mapping[str, float]) -> list[tuple[Sequence[str], float]]:
    return [((name,), float(v)) for name, v in sorted(named.items())]


def _snapshot_families(p: str, s: EngineSnapshot) -> Iterable[Metric]:
    """Gauges: what the run is now."""
    info = InfoMetricFamily("warpdeck_run", "The run: its pipeline, backend and device.",
                            labels=("pipeline", "backend", "device"))
    info.add_metric((p, s.backend, s.device), {})
    yield info
    yield _gauge(p, "warpdeck_run_status", "1 for the run's status, 0 for the others.", ("status",),
                 [((st,), float(st == s.status)) for st in _STATUSES])
    yield _gauge(p, "warpdeck_run_elapsed_seconds", "Seconds since the engine started.", (), [((), s.t)],
                 unit="seconds")
    c = s.counts
    yield _gauge(p, "warpdeck_tasks", "Tasks by state (admitted ones; stalled tasks count in their state).",
                 ("state",), _by({"queued": c.queued, "running": c.running_total, "done": c.done,
                                  "failed": c.failed, "cancelled": c.cancelled}))
    if c.expected is not None:
        yield _gauge(p, "warpdeck_tasks_expected", "Tasks the source will yield in all.", (), [((), c.expected)])
    yield _gauge(p, "warpdeck_tasks_running", "Running tasks by phase.", ("phase",),
                 _by({ph: c.running.get(ph, 0) for ph in _PHASES}))
    yield _gauge(p, "warpdeck_tasks_stalled", "Stalled tasks by reason.", ("reason",),
                 _by({r: c.stalled.get(r, 0) for r in _STALLS}))
    yield _gauge(p, "warpdeck_feeder_ready_tasks", "Admitted tasks waiting for a batch.", (), [((), s.feeder.ready)])
    f = s.figures
    yield _gauge(p, "warpdeck_throughput_tasks_per_second",
                 "Done tasks per second: over the run (run), once the pipeline was full (steady), lately (recent).",
                 ("window",), [(("run",), f.throughput_tasks_s), (("steady",), f.steady_tasks_s),
                               (("recent",), f.recent_tasks_s)])
    yield _gauge(p, "warpdeck_device_busy_ratio",
                 "Share of wall time the compute phase ran, first compute to now, over all lanes.", (),
                 [((), f.device_busy)], unit="ratio")
    yield _gauge(p, "warpdeck_lane_device_busy_ratio", "Share of wall time each lane's compute phase ran.",
                 ("lane",), _by(f.device_busy_by_lane), unit="ratio")
    yield _gauge(p, "warpdeck_lane_phase_busy_ratio",
                 "Each lane's busy time per phase over wall time (a host phase on n threads: up to n).",
                 ("lane", "phase"), [((str(lane), ph), v) for lane, by_phase in sorted(f.occupancy.items())
                                     for ph, v in by_phase.items()], unit="ratio")
    lanes = sorted(s.lanes, key=lambda ln: ln.id)
    yield _gauge(p, "warpdeck_lane_slots", "Each lane's slot depth (batches in flight).", ("lane",),
                 [((str(ln.id),), ln.depth) for ln in lanes])
    yield _gauge(p, "warpdeck_lane_host_threads", "Each lane's threads loading inputs (fill), writing outputs (sink).",
                 ("lane", "phase"), [row for ln in lanes for row in (((str(ln.id), "fill"), ln.fill_workers),
                                                                    ((str(ln.id), "sink"), ln.sink_workers))])
    yield _gauge(p, "warpdeck_lane_buffer_bytes", "Bytes of each lane's slot buffers.", ("lane",),
                 [((str(ln.id),), ln.nbytes) for ln in lanes], unit="bytes")
    states = {st.value: 0 for st in WorkerState}
    for w in s.workers:
        states[w.state.value] += 1
    yield _gauge(p, "warpdeck_workers", "Workers by state.", ("state",), _by(states))


def _counter_families(p: str, t: _Tallies) -> Iterable[Metric]:
    """Counters: what the run has done so far."""
    yield _counter(p, "warpdeck_tasks_finished", "Tasks that finished, by how.", ("state",), _by(t.finished))
    yield _counter(p, "warpdeck_batches", "Batches that left their lane, by lane and outcome.", ("lane", "outcome"),
                   [(k, v) for k, v in sorted(t.batches.items())])
    yield _counter(p, "warpdeck_phase_busy_seconds", "Seconds each lane's phases ran, summed over batches.",
                   ("lane", "phase"), [(k, v) for k, v in sorted(t.busy_s.items())], unit="seconds")
    yield _counter(p, "warpdeck_transfer_bytes", "Bytes copied host-to-device (h2d) and device-to-host (d2h).",
                   ("direction",), _by(t.moved), unit="bytes")
    yield _counter(p, "warpdeck_stalls", "Stalls that began (a batch's, or the queue's), by reason.", ("reason",),
                   _by(t.stalls))
    yield _counter(p, "warpdeck_stall_seconds", "Seconds stalls lasted (each batch's or the queue's), by reason.",
                   ("reason",), _by(t.stall_s), unit="seconds")
    yield _counter(p, "warpdeck_worker_convictions", "Workers convicted dead, by cause.", ("cause",),
                   _by(t.convictions))
    yield _counter(p, "warpdeck_commands_applied", "Operator commands the engine applied, by verb.", ("verb",),
                   _by(t.applied))
    yield _counter(p, "warpdeck_commands_refused", "Operator commands the engine refused, by verb.", ("verb",),
                   _by(t.refused))


def _control_families(p: str, control: ControlView, t: _Tallies) -> Iterable[Metric]:
    """The control plane's (a run without one has none of these)."""
    yield _gauge(p, "warpdeck_control_connected", "1 while the control plane is connected to its broker.", (),
                 [((), float(control.connected))])
    yield _counter(p, "warpdeck_control_refused", "Commands the control plane refused at the socket, by reason.",
                   ("reason",), _by(t.wire_refused))
    yield _counter(p, "warpdeck_control_dropped", "Messages the control plane dropped at the socket, by reason.",
                   ("reason",), _by(t.dropped))
    yield _counter(p, "warpdeck_control_reconnects", "Times the control plane reconnected to its broker.", (),
                   [((), t.reconnects)])
