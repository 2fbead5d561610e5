"""The Prometheus endpoint (engine/edges/metrics_export.py) on a real run: a scrape agrees with the
engine's own snapshot, in Prometheus text or OpenMetrics as the scraper asks; promtool finds no lint
problem; a real Prometheus scrapes it; the shipped alert rules pass promtool's unit tests, and they
and the Grafana dashboard use only metrics the exporter serves."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.samples import Sample
from wd_prometheus import Prometheus, promtool
from wd_wait import until

from warpdeck.engine.api import (
    BatchFinished,
    Cancel,
    Engine,
    EngineSnapshot,
    Pause,
    Resume,
    RunEvent,
    StallEvent,
    WorkerConvicted,
    parse_spec,
)
from warpdeck.engine.edges.metrics_export import MetricsBindError, MetricsExporter, conviction_cause
from warpdeck.engine.state.snapshot import ControlView

DEPLOY = Path(__file__).parents[2] / "deploy"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
IN_BYTES, OUT_BYTES = 128, 256
"""The tasks' input: 32 float32 (128 bytes); their output: 32 float64 (256 bytes)."""


def _spec(count: int, stage: str = "wd_stages:sleep_100ms") -> object:
    return parse_spec({
        "name": "metrics", "batch_size": 8, "lanes": 2,
        "source": {"kind": "synthetic", "count": count, "shape": [32], "dtype": "float32"},
        "sink": {"kind": "null"}, "stages": [{"fn": stage, "out_dtype": "float64"}],
    }, "<test>")


@dataclasses.dataclass
class _Run:
    engine: Engine
    exporter: MetricsExporter
    heard: list[RunEvent]

    @property
    def snap(self) -> EngineSnapshot:
        latest = self.engine.publisher.latest
        assert latest is not None
        return latest


@contextlib.asynccontextmanager
async def _serve(count: int, stage: str = "wd_stages:sleep_100ms") -> AsyncIterator[_Run]:
    exporter = MetricsExporter("127.0.0.1", 0, "metrics")
    try:
        async with Engine(_spec(count, stage)) as engine:  # type: ignore[arg-type]
            heard: list[RunEvent] = []
            engine.events.subscribe(heard.append)
            engine.events.subscribe(exporter.on_event)
            engine.publisher.subscribe(exporter.on_snapshot)
            yield _Run(engine, exporter, heard)
    finally:
        exporter.close(None)


@pytest.fixture
async def slow_run() -> AsyncIterator[_Run]:
    """A run of 100 ms batches that lasts seconds (cancelled when the test leaves)."""
    async with _serve(400) as run:
        yield run


@pytest.fixture
async def quick_run() -> AsyncIterator[_Run]:
    """A run of quick batches (the test waits for its end; the exporter serves on after it)."""
    async with _serve(200, "wd_stages:double") as run:
        yield run


def _scrape(url: str, accept: str | None = None) -> tuple[str, str]:
    """GET ``url``: its Content-Type and body."""
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.headers["Content-Type"], r.read().decode()


def _values(families: Iterable[Any]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples: Iterable[Sample] = (s for f in families for s in f.samples)
    return {(s.name, frozenset((k, v) for k, v in s.labels.items() if k != "pipeline")): s.value for s in samples}


def _value(values: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return values[name, frozenset(labels.items())]


async def _quiescent(run: _Run) -> EngineSnapshot:
    """Pause the run and wait until nothing runs and the counts stay put for a few snapshots."""
    await until(lambda: run.snap.counts.done >= 16, 30, "16 tasks done")
    assert (await run.engine.command(Pause())).ok
    await until(lambda: run.snap.counts.running_total == 0, 30, "the running batches finished")
    while True:  # the feeder may still admit up to its high watermark
        seen = run.snap
        await until(lambda s=seen.seq: run.snap.seq >= s + 3, 10, "three more snapshots")
        if run.snap.counts == seen.counts:
            break
    assert run.snap.status == "running"  # still going: the scrape sees a live run
    return seen


async def test_a_scrape_agrees_with_the_engine_snapshot(slow_run: _Run) -> None:
    snap = await _quiescent(slow_run)
    kind, text = await asyncio.to_thread(_scrape, slow_run.exporter.url)
    assert slow_run.snap.counts == snap.counts  # nothing moved while it scraped
    assert kind.startswith("text/plain")
    got = _values(parse_text(text))
    c = snap.counts
    for state, n in {"queued": c.queued, "running": 0, "done": c.done, "failed": 0, "cancelled": 0}.items():
        assert _value(got, "warpdeck_tasks", state=state) == n, state
    assert _value(got, "warpdeck_tasks_finished_total", state="done") == c.done
    for reason, n in c.stalled.items():
        if reason != "none":
            assert _value(got, "warpdeck_tasks_stalled", reason=reason) == n, reason
    assert _value(got, "warpdeck_commands_applied_total", verb="pause") == 1
    batches = [e for e in slow_run.heard if isinstance(e, BatchFinished)]
    assert sum(v for (name, _), v in got.items() if name == "warpdeck_batches_total") == len(batches)
    assert _value(got, "warpdeck_transfer_bytes_total", direction="h2d") == IN_BYTES * c.done
    assert _value(got, "warpdeck_transfer_bytes_total", direction="d2h") == OUT_BYTES * c.done
    assert _value(got, "warpdeck_run_info", backend=snap.backend, device=snap.device) == 1
    assert _value(got, "warpdeck_run_status", status="running") == 1
    assert _value(got, "warpdeck_workers", state="online") == len(snap.workers)
    for lane in snap.lanes:
        assert _value(got, "warpdeck_lane_slots", lane=str(lane.id)) == lane.depth
        assert _value(got, "warpdeck_lane_host_threads", lane=str(lane.id), phase="fill") == lane.fill_workers
    assert 0 < _value(got, "warpdeck_device_busy_ratio") <= 1


async def test_openmetrics_to_a_scraper_that_asks_and_text_otherwise(slow_run: _Run) -> None:
    await until(lambda: slow_run.snap.counts.done >= 8, 30, "8 tasks done")
    kind, text = await asyncio.to_thread(_scrape, slow_run.exporter.url, OPENMETRICS)
    assert kind.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in parse_openmetrics(text)}
    assert families["warpdeck_run"].type == "info"
    assert (families["warpdeck_transfer_bytes"].type, families["warpdeck_transfer_bytes"].unit) == ("counter", "bytes")
    assert families["warpdeck_device_busy_ratio"].unit == "ratio"
    done = _values([families["warpdeck_tasks_finished"]])[("warpdeck_tasks_finished_total",
                                                            frozenset({("state", "done")}))]
    assert done >= 8
    kind, text = await asyncio.to_thread(_scrape, slow_run.exporter.url)
    assert kind.startswith("text/plain; version=0.0.4")
    assert "# EOF" not in text
    assert "warpdeck_tasks_finished_total" in text


async def test_commands_are_counted_by_verb_applied_or_refused(slow_run: _Run) -> None:
    engine = slow_run.engine
    assert (await engine.command(Pause())).ok
    assert not (await engine.command(Cancel(keys=["no-such-task"]))).ok
    assert (await engine.command(Resume())).ok

    async def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        while True:
            got = _values(parse_text((await asyncio.to_thread(_scrape, slow_run.exporter.url))[1]))
            if _value(got, "warpdeck_commands_refused_total", verb="cancel"):
                return got
            await asyncio.sleep(0.05)

    got = await asyncio.wait_for(counted(), 10)
    assert _value(got, "warpdeck_commands_applied_total", verb="pause") == 1
    assert _value(got, "warpdeck_commands_applied_total", verb="resume") == 1
    assert _value(got, "warpdeck_commands_refused_total", verb="cancel") == 1
    assert _value(got, "warpdeck_commands_refused_total", verb="pause") == 0  # every verb, from the start


def _everything(exporter: MetricsExporter, snap: EngineSnapshot) -> None:
    """Feed the exporter what a run with a control plane and a lost worker would."""
    exporter.on_event(WorkerConvicted(0.0, "w1", 1, "silent"))
    exporter.on_event(WorkerConvicted(0.0, "w2", 1, "ray: actor died"))
    control = ControlView("mqtt://127.0.0.1:1883", True, 3, {"bad_signature": 2}, {"oversized": 1}, 1)
    exporter.on_snapshot(dataclasses.replace(snap, control=control))


async def test_promtool_finds_no_lint_problem(slow_run: _Run) -> None:
    await _quiescent(slow_run)
    _everything(slow_run.exporter, slow_run.snap)
    _, text = await asyncio.to_thread(_scrape, slow_run.exporter.url)
    assert "warpdeck_control_refused_total" in text
    assert 'cause="ray"' in text
    checked = promtool("check", "metrics", stdin=text.encode())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == ""
    assert checked.stderr.strip() == ""


async def test_a_real_prometheus_scrapes_the_run(quick_run: _Run, tmp_path: Path) -> None:
    report = await quick_run.engine.wait()
    target = quick_run.exporter.url.removeprefix("http://").removesuffix("/metrics")
    prom = Prometheus(tmp_path, [target])
    try:
        await asyncio.to_thread(prom.start)
        # The run is over: nothing on this loop needs it, so the checks may block it a moment.
        await until(prom.targets_up, 30, "the exporter scraped by Prometheus")
        await until(lambda: prom.query('warpdeck_tasks{state="done"}'), 30, "warpdeck_tasks in Prometheus")
        [(labels, value)] = prom.query('warpdeck_tasks{state="done"}')
        assert value == report.counts.done == 200
        assert labels["pipeline"] == "metrics"
        assert labels["job"] == "warpdeck"
        [(_, finished)] = prom.query('warpdeck_tasks_finished_total{state="done"}')
        assert finished == 200
        [(info, _)] = prom.query("warpdeck_run_info")
        assert info["backend"] == quick_run.snap.backend
        # Prometheus asked for OpenMetrics and got it: only that format carries a metric's unit.
        meta = prom.get("/api/v1/metadata", metric="warpdeck_transfer_bytes")
        assert [(m["type"], m["unit"]) for m in meta["warpdeck_transfer_bytes"]] == [("counter", "bytes")]
    finally:
        await asyncio.to_thread(prom.stop)


def test_the_alert_rules_check_and_pass_their_unit_tests() -> None:
    checked = promtool("check", "rules", "warpdeck-alerts.yml", cwd=DEPLOY / "prometheus")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 2 rules found" in checked.stdout
    tested = promtool("test", "rules", "warpdeck-alerts.test.yml", cwd=DEPLOY / "prometheus")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _names_in(exprs: Iterable[str]) -> set[str]:
    return {m for e in exprs for m in re.findall(r"\bwarpdeck_[a-z0-9_]+", e)}


async def test_the_dashboard_and_alerts_use_only_served_metrics(quick_run: _Run) -> None:
    await quick_run.engine.wait()
    _everything(quick_run.exporter, quick_run.snap)
    _, text = await asyncio.to_thread(_scrape, quick_run.exporter.url)
    served = {s.name for f in parse_text(text) for s in f.samples}
    board = json.loads((DEPLOY / "grafana" / "warpdeck-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    used = _names_in(exprs)
    assert used >= {"warpdeck_tasks", "warpdeck_device_busy_ratio", "warpdeck_lane_device_busy_ratio",
                    "warpdeck_tasks_stalled", "warpdeck_workers", "warpdeck_commands_applied_total",
                    "warpdeck_control_dropped_total"}
    assert used <= served, used - served
    rules = (DEPLOY / "prometheus" / "warpdeck-alerts.yml").read_text()
    assert _names_in(re.findall(r"expr: \|\n((?:\s{10}.*\n)+)", rules)) <= served


async def test_counters_add_up_increases_of_counts_that_go_down(quick_run: _Run) -> None:
    await quick_run.engine.wait()
    final = quick_run.snap
    x = quick_run.exporter
    for failed in (3, 0, 2):  # three failures, retried (back to queued), then two fail again
        x.on_snapshot(dataclasses.replace(final, counts=dataclasses.replace(final.counts, failed=failed)))
    got = _values(parse_text((await asyncio.to_thread(_scrape, x.url))[1]))
    assert _value(got, "warpdeck_tasks_finished_total", state="failed") == 5
    assert _value(got, "warpdeck_tasks", state="failed") == 2


async def test_stall_seconds_come_from_the_stalls_endings() -> None:
    x = MetricsExporter("127.0.0.1", 0, "p")
    try:
        x.on_event(StallEvent(1.0, "control", 40, True, note="paused"))  # the queue's, from a pause
        x.on_event(StallEvent(3.5, "control", 40, False))  # a resume: the ending carries no length
        x.on_event(StallEvent(4.0, "memory", 8, True, batch=7, lane=1))
        x.on_event(StallEvent(4.25, "memory", 8, False, batch=7, lane=1, lasted_s=0.25))
        got = _values(parse_text((await asyncio.to_thread(_scrape, x.url))[1]))
        # Counted, but a scrape sees the counters as frozen at the last snapshot (none yet).
        assert _value(got, "warpdeck_stall_seconds_total", reason="control") == 0
        x.on_snapshot(await _one_snapshot())
        got = _values(parse_text((await asyncio.to_thread(_scrape, x.url))[1]))
    finally:
        x.close(None)
    assert _value(got, "warpdeck_stall_seconds_total", reason="control") == 2.5
    assert _value(got, "warpdeck_stall_seconds_total", reason="memory") == 0.25
    assert _value(got, "warpdeck_stalls_total", reason="control") == 1
    assert _value(got, "warpdeck_stalls_total", reason="hung") == 0


async def _one_snapshot() -> EngineSnapshot:
    async with Engine(_spec(16, "wd_stages:double")) as engine:  # type: ignore[arg-type]
        await engine.wait()
    latest = engine.publisher.latest
    assert latest is not None
    return latest


def test_a_conviction_cause_is_one_of_five() -> None:
    assert [conviction_cause(c) for c in ("will", "graceful", "silent", "stuck", "ray: actor died", "rebirth")] == [
        "will", "will", "silent", "hung", "ray", "other"]


async def test_close_stops_serving_and_a_taken_port_is_refused() -> None:
    x = MetricsExporter("127.0.0.1", 0, "p")
    assert re.fullmatch(rf"http://127\.0\.0\.1:{x.port}/metrics", x.url)
    assert x.port != 0
    _, text = await asyncio.to_thread(_scrape, x.url)
    assert "warpdeck_tasks_finished_total" in text  # counters exist before the first snapshot
    with pytest.raises(MetricsBindError) as err:
        MetricsExporter("127.0.0.1", x.port, "q")
    assert (err.value.port, err.value.errno) == (x.port, errno.EADDRINUSE)
    assert str(err.value) == f"cannot serve metrics on 127.0.0.1:{x.port}: {os.strerror(errno.EADDRINUSE)}"
    x.close(None)
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(_scrape, x.url)
    with socket.socket() as s:  # nothing listens there any more (a closed connection may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", x.port))
