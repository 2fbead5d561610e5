"""The Trace Event Format export (engine/edges/trace_export.py): a real run's trace checked field by
field against the format, every batch once per phase it reached, commands, counters, named threads;
a trace cut by SIGKILL still loads; a replayed recording; the size bound; a full disk."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from wd_control import wait_for
from wd_wait import until

from warpdeck.engine.api import (
    BatchFinished,
    CommandEvent,
    Engine,
    ExportSettings,
    Pause,
    Resume,
    RunEvent,
    StallEvent,
    exporting,
    load_spec,
    parse_spec,
)
from warpdeck.engine.control.recording_trace import trace_recording
from warpdeck.engine.control.telemetry import summarize
from warpdeck.engine.control.wire import encode
from warpdeck.engine.edges import trace_export
from warpdeck.engine.edges.trace_export import TraceWriter
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.snapshot import EngineSnapshot
from warpdeck.engine.state.task_states import RUN_PHASES

SUPPORT = Path(__file__).resolve().parents[1] / "support"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PHASES = [p.label for p in RUN_PHASES]
KNOWN_PH = set("BEXiICbneSTpFsftPNODMVvRc()")
"""Every phase the format defines (duration, complete, instant, counter, async, flow, sample, object, metadata, memory
dump, mark, clock sync, context)."""
META_ARGS = {"process_name": "name", "process_labels": "labels", "process_sort_index": "sort_index",
             "thread_name": "name", "thread_sort_index": "sort_index"}
"""The metadata names the format documents, with the arg each one carries."""


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def validate(events: list[dict[str, Any]]) -> None:
    """Every event as the Trace Event Format defines it, and as Perfetto needs it: named processes
    and threads, no overlapping complete events on a thread."""
    assert isinstance(events, list) and events
    named_pids = {e["pid"] for e in events if e.get("name") == "process_name" and e.get("ph") == "M"}
    named_tids = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name" and e.get("ph") == "M"}
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        assert isinstance(e, dict), e
        ph = e["ph"]
        assert ph in KNOWN_PH and ph in "XiCM", e  # the format's phases; this writer uses four
        assert isinstance(e["name"], str) and e["name"], e
        assert type(e["pid"]) is int and type(e["tid"]) is int, e
        assert e["pid"] in named_pids, e
        assert isinstance(e.get("args", {}), dict), e
        if ph == "M":
            assert e["name"] in META_ARGS, e
            arg = e["args"][META_ARGS[e["name"]]]
            assert type(arg) is int if META_ARGS[e["name"]] == "sort_index" else isinstance(arg, str), e
            continue
        assert _number(e["ts"]) and e["ts"] >= 0, e
        if "cat" in e:
            assert isinstance(e["cat"], str), e
        if ph == "X":
            assert _number(e["dur"]) and e["dur"] >= 0, e
            assert (e["pid"], e["tid"]) in named_tids, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif ph == "i":
            assert e.get("s", "t") in {"g", "p", "t"}, e
            if e.get("s", "t") == "t":
                assert (e["pid"], e["tid"]) in named_tids, e
        elif ph == "C":
            assert e["args"] and all(_number(v) for v in e["args"].values()), e
    for where, spans in slices.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-3, f"overlapping slices on {where}"


def load(path: Path) -> list[dict[str, Any]]:
    """A trace as its loaders read it: a missing ``]`` added, a line cut by a kill dropped."""
    text = path.read_text(encoding="utf-8")
    if not text.rstrip().endswith("]"):
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        text += "]"
    events = json.loads(text)
    assert isinstance(events, list)
    return events


def _spec(count: int, fn: str = "wd_stages:sleep_10ms", lanes: int = 2) -> Any:
    return parse_spec({
        "name": "traced", "batch_size": 16, "lanes": lanes, "backend": "numpy",
        "source": {"kind": "synthetic", "count": count, "shape": [32], "dtype": "float32"},
        "sink": {"kind": "null"}, "stages": [{"fn": fn}],
    }, "<test>")


@dataclass
class Traced:
    heard: list[RunEvent]
    events: list[dict[str, Any]]
    t0: float
    done: int


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """One real run, traced, with a pause and a resume while tasks wait."""
    path = tmp_path_factory.mktemp("trace") / "run.json"

    async def run() -> Traced:
        heard: list[RunEvent] = []
        writer = TraceWriter(path, "traced")
        async with Engine(_spec(1600)) as engine:
            engine.events.subscribe(heard.append)
            engine.events.subscribe(writer.on_event)
            engine.publisher.subscribe(writer.on_snapshot)
            await until(lambda: any(isinstance(e, BatchFinished) for e in heard), 30, "a batch")
            await engine.command(Pause())
            await until(lambda: engine.publisher.latest is not None and engine.publisher.latest.counts.queued > 0,
                        30, "tasks waiting")
            await engine.command(Resume())
            report = await engine.wait()
        writer.close(engine.publisher.latest)
        latest = engine.publisher.latest
        assert latest is not None
        return Traced(heard, load(path), latest.t0, report.counts.done)

    return asyncio.run(run())


def test_a_runs_trace_is_valid_trace_event_format(traced: Traced) -> None:
    validate(traced.events)
    first = traced.events[0]
    assert first["ph"] == "M" and first["name"] == "process_name" and first["pid"] == 0
    assert first["args"]["trace"]["whole_batches"] == trace_export.WHOLE_BATCHES


def test_every_batch_appears_once_per_phase_it_reached(traced: Traced) -> None:
    assert traced.done == 1600
    batches = [e for e in traced.heard if isinstance(e, BatchFinished)]
    slices = [e for e in traced.events if e["ph"] == "X" and e["cat"] == "batch"]
    seen = Counter((e["args"]["batch"], e["name"]) for e in slices)
    assert set(seen.values()) == {1}
    by_id = {(e["args"]["batch"], e["name"]): e for e in slices}
    reached = 0
    for b in batches:
        rec = b.record
        for name, (t0, t1) in zip(PHASES, rec.phases, strict=True):
            if not t0:
                continue
            reached += 1
            e = by_id[(rec.batch, name)]
            assert e["args"]["tasks"] == rec.tasks and e["args"]["epoch"] == b.epoch
            assert e["args"]["ok"] is rec.ok and e["args"]["key"] == rec.key
            assert e["ts"] == pytest.approx((t0 - traced.t0) * 1e6, abs=1e-2)
            assert e["dur"] == pytest.approx((t1 - t0) * 1e6, abs=1e-2)
    assert reached == len(slices) and sum(e["args"]["tasks"] for e in slices if e["name"] == "compute") == 1600


def test_lanes_and_phases_are_named_threads_in_pipeline_order(traced: Traced) -> None:
    threads = {(e["pid"], e["args"]["name"]): e["tid"] for e in traced.events if e["name"] == "thread_name"}
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in traced.events if e["name"] == "thread_sort_index"}
    workers = {e["pid"]: e["args"]["name"] for e in traced.events if e["name"] == "process_name" and e["pid"] > 0}
    assert list(workers.values()) == [f"worker {w}" for w in {b.worker for b in traced.heard
                                                               if isinstance(b, BatchFinished)}]
    (pid,) = workers
    for lane in (0, 1):
        tids = [threads[(pid, f"lane {lane} · {name}")] for name in [*PHASES, "stalls"]]
        assert [order[(pid, t)] for t in tids] == sorted(order[(pid, t)] for t in tids)
    slices = {(e["pid"], e["tid"], e["name"]) for e in traced.events if e["ph"] == "X" and e["cat"] == "batch"}
    names = {(p, t): n for (p, n), t in threads.items()}
    assert all(names[(p, t)].split(" · ")[1].split(" #")[0] == n for p, t, n in slices)


def test_pause_and_resume_are_global_instants_and_the_wait_a_queue_stall(traced: Traced) -> None:
    cmds = [e for e in traced.events if e.get("cat") == "command"]
    assert [(e["name"], e["s"], e["pid"], e["args"]["applied"]) for e in cmds] == [
        ("pause", "g", 0, True), ("resume", "g", 0, True)]
    paused = next(e for e in traced.heard if isinstance(e, StallEvent) and e.began)
    began = [e for e in traced.events if e.get("cat") == "stall" and e["ph"] == "i" and e["s"] == "p"]
    assert [(e["name"], e["args"]["tasks"], e["args"]["note"]) for e in began] == [("control", paused.tasks, "paused")]
    (span,) = [e for e in traced.events if e.get("cat") == "stall" and e["ph"] == "X" and e["pid"] == 0]
    assert span["ts"] == pytest.approx(began[0]["ts"], abs=1.0) and span["dur"] > 0
    heard = [e.verb for e in traced.heard if isinstance(e, CommandEvent)]
    assert heard == ["pause", "resume"]


def test_counters_follow_the_queue_the_slots_and_the_device_at_most_4_hz(traced: Traced) -> None:
    counters: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in traced.events:
        if e["ph"] == "C":
            counters[e["name"]].append(e)
    assert {"queued", "ready", "device busy", "slot depth · lane 0", "slot depth · lane 1"} <= set(counters)
    assert max(e["args"]["tasks"] for e in counters["queued"]) > 0
    assert counters["device busy"][-1]["args"]["percent"] > 0
    for series in counters.values():
        ts = [e["ts"] for e in series[:-1]]  # the last is the close's, whenever it came
        assert all(b - a >= 250_000 - 1 for a, b in itertools.pairwise(ts))


def test_a_trace_cut_by_sigkill_still_loads(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "killed"\nbackend = "numpy"\nbatch_size = 4\n[source]\nkind = "synthetic"\n'
                    'count = 4000\nshape = [8]\ndtype = "float32"\n[sink]\nkind = "null"\n'
                    '[[stages]]\nfn = "wd_stages:sleep_10ms"\n')
    trace = tmp_path / "run.json"
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    proc = subprocess.Popen([sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--broker", "none",
                             "--run-dir", str(tmp_path / "rd"), "--trace", str(trace)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: trace.exists() and trace.read_text(encoding="utf-8").count('"cat":"batch"') >= 50, 60,
                 "batches in the trace")
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    text = trace.read_text(encoding="utf-8")
    assert text.startswith("[\n") and not text.rstrip().endswith("]")
    events = load(trace)
    validate(events)
    batches = Counter(e["args"]["batch"] for e in events if e["ph"] == "X" and e["cat"] == "batch")
    assert len(batches) >= 10 and set(batches.values()) == {len(PHASES)}


async def test_a_recording_replays_as_a_trace(tmp_path: Path) -> None:
    recording, out = tmp_path / "run.rec", tmp_path / "replay.json"
    heard: list[RunEvent] = []
    since = 0.0

    def record(snap: EngineSnapshot) -> None:  # what the control plane publishes, as --record keeps it
        nonlocal since
        tel = summarize(snap, since)
        since = max((r.end for r in snap.timeline), default=since)
        with recording.open("a", encoding="utf-8") as f:
            f.write(encode(tel).decode() + "\n")

    async with Engine(_spec(800)) as engine:
        engine.events.subscribe(heard.append)
        engine.publisher.subscribe(record)
        await engine.wait()
    n = trace_recording(recording, out)
    events = json.loads(out.read_text(encoding="utf-8"))
    validate(events)
    assert n == len(events)
    records = {e.record.batch: e.record for e in heard if isinstance(e, BatchFinished)}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["args"]["batch"] for e in slices} == set(records)
    assert len(slices) == sum(1 for r in records.values() for t0, _ in r.phases if t0)
    latest = engine.publisher.latest
    assert latest is not None
    for e in slices:  # on the run's clock, to the microsecond the telemetry keeps
        rec = records[e["args"]["batch"]]
        assert e["ts"] / 1e6 == pytest.approx(rec.phases[PHASES.index(e["name"])][0] - latest.t0, abs=2e-6)
    assert {"queued", "ready", "device busy"} <= {e["name"] for e in events if e["ph"] == "C"}


def test_a_file_with_no_telemetry_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.rec"
    junk.write_text("not telemetry\n")
    with pytest.raises(ValueError, match="no telemetry"):
        trace_recording(junk, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


def _feed(writer: TraceWriter, first: int, n: int) -> None:
    for b in range(first, first + n):
        t = 1.0 + b * 1e-3
        phases = tuple((t + i * 1e-4, t + (i + 1) * 1e-4) for i in range(len(PHASES)))
        writer.on_event(BatchFinished(BatchRecord(b, b % 2, 0, 1, "k", t, phases, True, 8), "w", 1))


def test_large_runs_are_sampled_and_the_trace_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_export, "WHOLE_BATCHES", 200)
    monkeypatch.setattr(trace_export, "SAMPLED_BATCHES", 100)
    path = tmp_path / "big.json"
    writer = TraceWriter(path, "big")
    _feed(writer, 0, 3000)
    at_3000 = writer.batches_written
    _feed(writer, 3000, 9000)
    writer.close(None)
    events = load(path)
    validate(events)
    written = {e["args"]["batch"] for e in events if e["ph"] == "X"}
    assert written == set(range(200)) | {b for b in written if b >= 200}  # the first ones whole
    assert {b % 2 for b in written if b >= 3000} == {0, 1}  # sampling favours no lane
    notes = [e for e in events if e["name"].startswith("trace sampled")]
    assert [n["name"] for n in notes] == [f"trace sampled: 1 batch in {2**k}" for k in range(1, len(notes) + 1)]
    assert all(n["s"] == "g" for n in notes)
    (end,) = [e for e in events if e["name"] == "trace end"]
    assert end["args"]["batches_seen"] == 12000 and end["args"]["batches_written"] == len(written)
    assert end["args"]["stride"] == 2 ** len(notes)
    # Four times the batches, two more strides: the trace grows with the log of the run.
    assert 150 <= len(written) - at_3000 <= 250


def test_past_the_byte_cap_nothing_more_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_export, "MAX_BYTES", 64 * 1024)
    monkeypatch.setattr(trace_export, "FLUSH_LINES", 50)
    path = tmp_path / "capped.json"
    writer = TraceWriter(path, "capped")
    _feed(writer, 0, 2000)
    writer.close(None)
    assert path.stat().st_size <= 64 * 1024 + 60 * 250
    events = load(path)
    validate(events)
    assert any(e["name"] == "trace full: nothing more is written" for e in events)
    assert max(e["args"]["batch"] for e in events if e["ph"] == "X") < 200


async def test_a_full_disk_is_logged_once_and_the_run_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_export, "FLUSH_S", 0.0)  # every event is written at once: the disk fills mid-run
    writer = TraceWriter(tmp_path / "run.json", "full")
    assert writer._file is not None
    writer._file.close()
    writer._file = Path("/dev/full").open("w", encoding="utf-8")  # noqa: SIM115, ASYNC230 - every write fails: ENOSPC
    with caplog.at_level(logging.ERROR, logger=trace_export.__name__):
        async with Engine(_spec(600, "wd_stages:double")) as engine:
            engine.events.subscribe(writer.on_event)
            engine.publisher.subscribe(writer.on_snapshot)
            report = await engine.wait()
        writer.close(engine.publisher.latest)
    assert report.counts.done == 600
    errors = [r for r in caplog.records if r.name == trace_export.__name__]
    assert len(errors) == 1 and "No space left" in errors[0].getMessage()


def test_a_path_that_cannot_be_opened_is_refused_at_once(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        TraceWriter(tmp_path / "no-such-dir" / "run.json", "x")
    with pytest.raises(OSError):
        TraceWriter(Path("/dev/full"), "x")


@pytest.mark.parametrize("example", ["dense", "conv2d", "spectrogram"])
async def test_each_examples_trace_is_valid(example: str, tmp_path: Path) -> None:
    # The examples' own stages, sources and sinks (fewer tasks), written through the same wiring
    # as --trace (``exporting``): valid, and every task in a compute slice once.
    spec = load_spec(EXAMPLES / f"{example}-synthetic.toml")
    spec = spec.model_copy(update={"backend": "numpy",
                                   "source": spec.source.model_copy(update={"count": 4 * spec.batch_size + 3})})
    path = tmp_path / f"{example}.trace.json"
    engine = Engine(spec, tmp_path / "run", journal=False)
    with exporting(ExportSettings(trace=path), engine.events, engine.publisher, spec.name):
        async with engine:
            report = await engine.wait()
    assert report.status == "finished"
    events = load(path)
    validate(events)
    compute = [e for e in events if e["ph"] == "X" and e["name"] == "compute"]
    assert sum(e["args"]["tasks"] for e in compute) == report.counts.done == 4 * spec.batch_size + 3


def test_a_workers_loss_wait_and_return_are_global_instants(tmp_path: Path) -> None:
    """Issue 19: a conviction says what it took back; a worker back, waiting for room or gone is an
    instant too, with its fields as args."""
    from warpdeck.engine.api import WorkerConvicted, WorkerGone, WorkerReborn, WorkerWaiting

    path = tmp_path / "workers.json"
    writer = TraceWriter(path, "workers")
    _feed(writer, 0, 4)
    for ev in (WorkerConvicted(1.01, "ray-1", 7, "will", 2, 16), WorkerWaiting(1.02, "ray-1", "restarting: waiting "
               "for 1 GPU"), WorkerReborn(1.03, "ray-1", 9, 4321), WorkerGone(1.04, "ray-0", "restarts spent")):
        writer.on_event(ev)
    writer.close(None)
    events = load(path)
    validate(events)
    shown = {e["name"]: e["args"] for e in events if e.get("cat") == "worker"}
    assert shown["worker ray-1 convicted"] == {"worker": "ray-1", "epoch": 7, "cause": "will", "batches": 2,
                                               "tasks": 16}
    assert shown["worker ray-1 waiting"] == {"worker": "ray-1", "note": "restarting: waiting for 1 GPU"}
    assert shown["worker ray-1 back"] == {"worker": "ray-1", "epoch": 9, "pid": 4321}
    assert shown["worker ray-0 gone"] == {"worker": "ray-0", "reason": "restarts spent"}
