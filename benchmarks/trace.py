"""The size of a ``--trace`` file at a million tasks, against its bound: ``trace_export.MAX_BYTES``
(128 MiB), which is also the target that a 1 M-task trace loads in Perfetto's UI (<= 128 MiB).

Two parts, in one run:

synthetic   ``TraceWriter`` fed ``BatchFinished`` events directly, as the engine's loop would: 1 M
            tasks in batches of 64, 16 and 1 (and 10 M in batches of 1 unless --quick), two lanes.
            Phase times follow a real run's means (dense, batch 64, NumPy: fill 1.6, h2d 0.18,
            compute 0.8, d2h 0.07, sink 0.4 ms), each a fixed part plus a part per task, with seeded
            lognormal jitter, on a clock that starts at ``perf_counter`` and moves as the lanes
            would: a lane's device phases one at a time, its fills on two threads (so fills overlap
            and get a second track), its sinks on one. Printed per case: batches seen and written
            (the stride the writer ended at), the file's size beside the bound, bytes per written
            batch (the whole file over the batches in it), the writer's CPU per event
            (``time.thread_time`` around ``on_event`` only; the events are built outside the timed
            span), over the whole case and over the first batches, all written; and three checks:
            ``json.loads`` of the whole file, the first event stating the bound (``args.trace``),
            the last ``trace end`` agreeing with the writer's counts.
real        ``python -m warpdeck.cli run SPEC --headless --broker none`` in a subprocess, with and
            without ``--trace FILE``: 1 M tasks (--quick: 100 k), batches of 64, 2 lanes, NumPy,
            ``warpdeck.examples.dense:stage`` on synthetic [512] float32, a null sink. The run with
            the trace goes first. Printed: each run's wall time (launch to exit) and the report's
            ``elapsed_s``, their ratio, the trace's size and the same three checks. BLAS is held to
            one thread per call in both (unless the environment sets it): two lanes already keep two
            cores busy, and OpenBLAS's own threads beside them made 50 k-task runs 1.7 to 3.4 times
            slower on the 2-core VM (their compute phase 6 to 14 times). Timings are noisy on a small
            or shared machine: printed, not judged. The load average before and after is printed.

    python benchmarks/trace.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import print_table, verdict, write_json

from warpdeck.engine.edges.trace_export import MAX_BYTES, WHOLE_BATCHES, TraceWriter
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.run_events import BatchFinished

TASKS = 1_000_000
QUICK_REAL_TASKS = 100_000
BIG_TASKS = 10_000_000
LOAD_BYTES = 128 * 2**20  # the target: a 1 M-task trace loads in Perfetto's UI
LANES = 2
FILL_THREADS = 2
CHUNK = 4096  # events built, then fed under the timer (divides WHOLE_BATCHES: whole chunks stay whole)
REAL_BATCH = 64
SHARED_LOAD = 1.5  # load average above which the figures are marked as taken on a shared machine
PHASE_S = ((50e-6, 24e-6), (20e-6, 2.5e-6), (30e-6, 12e-6), (10e-6, 1e-6), (30e-6, 6e-6))
"""Per phase, in RUN_PHASES order: seconds per batch, seconds per task (64 tasks: the real means)."""
GAP_S = 20e-6  # the loop's hand-over between two phases of a batch
JITTER = 0.25  # sigma of the lognormal factor on each phase (mean 1)
KEY = "synthetic[512]:float32"  # the key a real run's records carry (str(BatchKey))

SPEC = """\
name = "bench-trace"
batch_size = {batch}
lanes = {lanes}
backend = "numpy"

[source]
kind = "synthetic"
count = {count}
shape = [512]
dtype = "float32"
seed = 0

[sink]
kind = "null"

[[stages]]
fn = "warpdeck.examples.dense:stage"
"""


@dataclass
class _Lane:
    """When a lane's fill threads, its device and its sink are next free, on the synthetic clock."""

    fills: list[float]
    dev: float
    sink: float


def _batches(tasks: int, batch: int, t0: float, seed: int) -> Iterator[list[BatchFinished]]:
    """The run's ``BatchFinished`` events, CHUNK at a time, in the order the lanes finish them."""
    rng = np.random.default_rng(seed)
    base = np.array([fixed + per * batch for fixed, per in PHASE_S])
    lanes = [_Lane([t0] * FILL_THREADS, t0, t0) for _ in range(LANES)]
    n = -(-tasks // batch)
    for first in range(0, n, CHUNK):
        count = min(CHUNK, n - first)
        durs = (base * rng.lognormal(-JITTER**2 / 2, JITTER, (count, len(PHASE_S)))).tolist()
        out: list[BatchFinished] = []
        for i, (fill, h2d, comp, d2h, sink) in enumerate(durs):
            b = first + i
            size = min(batch, tasks - b * batch)
            lane = lanes[b % LANES]
            k = min(range(FILL_THREADS), key=lane.fills.__getitem__)
            f0 = max(lane.fills[k], lane.dev - fill)  # a free fill thread, in time for the next slot
            f1 = lane.fills[k] = f0 + fill
            h0 = max(f1, lane.dev) + GAP_S
            c0 = h0 + h2d + GAP_S
            x0 = c0 + comp + GAP_S
            x1 = lane.dev = x0 + d2h
            s0 = max(x1, lane.sink) + GAP_S
            s1 = lane.sink = s0 + sink
            phases = ((f0, f1), (h0, h0 + h2d), (c0, c0 + comp), (x0, x1), (s0, s1))
            rec = BatchRecord(b, b % LANES, b // LANES % 2, size, KEY, f0 - GAP_S, phases, True, size * 2048)
            out.append(BatchFinished(rec, "vm.cpu", 0))
        yield out


def _checks(path: Path) -> dict[str, Any]:
    """The whole file as one JSON document; its first event's bound; its ``trace end``."""
    try:
        events = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return {"parses": False, "error": str(exc), "states_bound": False, "end": None, "events": 0}
    bound = events[0].get("args", {}).get("trace", {}) if events else {}
    ends = [e["args"] for e in events if e.get("name") == "trace end"]
    return {"parses": isinstance(events, list), "events": len(events), "end": ends[-1] if ends else None,
            "states_bound": bound.get("max_bytes") == MAX_BYTES and bound.get("whole_batches") == WHOLE_BATCHES}


def synthetic(tmp: Path, tasks: int, batch: int) -> dict[str, Any]:
    """One case of the synthetic part: every batch of ``tasks`` through a ``TraceWriter``."""
    path = tmp / f"synthetic-{tasks}-{batch}.json"
    writer = TraceWriter(path, "bench-trace")
    t0 = time.perf_counter() + 0.05  # the run's first fill, just after the writer was made
    cpu = cpu_whole = 0.0
    events = events_whole = 0
    for chunk in _batches(tasks, batch, t0, seed=batch):
        c0 = time.thread_time()
        for ev in chunk:
            writer.on_event(ev)
        spent = time.thread_time() - c0
        cpu += spent
        events += len(chunk)
        if writer.batches_written == writer.batches_seen:  # every batch of the chunk written whole
            cpu_whole += spent
            events_whole += len(chunk)
    c0 = time.thread_time()
    writer.close(None)
    cpu += time.thread_time() - c0
    size = path.stat().st_size
    res = {"tasks": tasks, "batch": batch, "batches_seen": writer.batches_seen,
           "batches_written": writer.batches_written, "stride": writer.stride, "bytes": size,
           "bytes_per_written_batch": size / max(writer.batches_written, 1),
           "cpu_us_per_event": cpu / events * 1e6,
           "cpu_us_per_event_whole": cpu_whole / events_whole * 1e6 if events_whole else None}
    res.update(_checks(path))
    end = res["end"] or {}
    res["end_agrees"] = (end.get("batches_seen") == writer.batches_seen
                         and end.get("batches_written") == writer.batches_written)
    path.unlink()
    return res


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def real_run(tmp: Path, tasks: int, trace: bool) -> dict[str, Any]:
    """One headless ``warpdeck run`` in a subprocess, traced or not."""
    name = "traced" if trace else "untraced"
    spec = tmp / "trace.toml"
    spec.write_text(SPEC.format(batch=REAL_BATCH, lanes=LANES, count=tasks), encoding="utf-8")
    report, out = tmp / f"{name}-report.json", tmp / f"{name}-trace.json"
    cmd = [sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--broker", "none",
           "--json", str(report), "--run-dir", str(tmp / f"{name}-run")] + (["--trace", str(out)] if trace else [])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"warpdeck run failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    rep = json.loads(report.read_text(encoding="utf-8"))
    if rep["counts"]["done"] != tasks:
        raise RuntimeError(f"{name} run: {rep['counts']['done']} of {tasks} tasks done")
    res: dict[str, Any] = {"wall_s": wall, "elapsed_s": rep["elapsed_s"], "steady_tasks_s": rep["steady_tasks_s"]}
    if trace:
        res["bytes"] = out.stat().st_size
        res.update(_checks(out))
        end = res["end"] or {}
        res["end_agrees"] = end.get("batches_seen") == -(-tasks // REAL_BATCH)
    return res


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _synthetic_rows(r: dict[str, Any]) -> list[list[str]]:
    whole = r["cpu_us_per_event_whole"]
    return [
        [f"synthetic: {r['tasks']:,} tasks, batches of {r['batch']}", "", "", ""],
        ["  batches seen / written (stride at the end)",
         f"{r['batches_seen']:,} / {r['batches_written']:,} (1 in {r['stride']})", "", verdict(None)],
        ["  file", f"{_mb(r['bytes'])} ({r['bytes'] / 2**20:.1f} MiB)", f"<= {MAX_BYTES // 2**20} MiB (MAX_BYTES)",
         verdict(r["bytes"] <= MAX_BYTES)],
        ["  bytes per written batch (whole file)", f"{r['bytes_per_written_batch']:,.0f} B", "", verdict(None)],
        ["  writer CPU per event: all / while whole",
         f"{r['cpu_us_per_event']:.2f} / " + (f"{whole:.2f} µs" if whole is not None else "- µs"), "",
         verdict(None)],
        [f"  json.loads of the whole file ({r['events']:,} events)", "yes" if r["parses"] else "no", "parses",
         verdict(r["parses"])],
        ["  first event states the bound; trace end agrees", f"{r['states_bound']}; {r['end_agrees']}",
         "True; True", verdict(r["states_bound"] and r["end_agrees"])],
    ]


def _real_rows(tasks: int, on: dict[str, Any], off: dict[str, Any]) -> list[list[str]]:
    end = on["end"] or {}
    return [
        [f"real: warpdeck run --headless, {tasks:,} tasks, batches of {REAL_BATCH}, {LANES} lanes", "", "", ""],
        ["  wall, launch to exit: with / without --trace", f"{on['wall_s']:.1f} / {off['wall_s']:.1f} s", "",
         verdict(None)],
        ["  report elapsed_s: with / without (ratio)",
         f"{on['elapsed_s']:.1f} / {off['elapsed_s']:.1f} s ({on['elapsed_s'] / off['elapsed_s']:.3f})", "",
         verdict(None)],
        ["  steady tasks/s: with / without", f"{on['steady_tasks_s']:,.0f} / {off['steady_tasks_s']:,.0f}", "",
         verdict(None)],
        ["  trace file", f"{_mb(on['bytes'])} ({on['bytes'] / 2**20:.1f} MiB)",
         f"<= {LOAD_BYTES // 2**20} MiB (loads in Perfetto)", verdict(on["bytes"] <= LOAD_BYTES)],
        ["  batches seen / written", f"{end.get('batches_seen', 0):,} / {end.get('batches_written', 0):,}", "",
         verdict(None)],
        [f"  json.loads of the whole file ({on['events']:,} events)", "yes" if on["parses"] else "no", "parses",
         verdict(on["parses"])],
        ["  first event states the bound; trace end agrees", f"{on['states_bound']}; {on['end_agrees']}",
         "True; True", verdict(on["states_bound"] and on["end_agrees"])],
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"no 10 M-task case; the real runs {QUICK_REAL_TASKS:,} tasks instead of {TASKS:,}")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    cases = [(TASKS, 64), (TASKS, 16), (TASKS, 1)] + ([] if args.quick else [(BIG_TASKS, 1)])
    real_tasks = QUICK_REAL_TASKS if args.quick else TASKS
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    figures: dict[str, Any] = {"synthetic": [], "max_bytes": MAX_BYTES}
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="wd-bench-trace-") as tmp:
        for tasks, batch in cases:
            r = synthetic(Path(tmp), tasks, batch)
            figures["synthetic"].append(r)
            rows += _synthetic_rows(r)
            print(f"synthetic {tasks:,} tasks, batch {batch}: {_mb(r['bytes'])}", file=sys.stderr, flush=True)
        on = real_run(Path(tmp), real_tasks, trace=True)
        off = real_run(Path(tmp), real_tasks, trace=False)
    figures["real"] = {"tasks": real_tasks, "batch": REAL_BATCH, "traced": on, "untraced": off}
    rows += _real_rows(real_tasks, on, off)
    load_after = os.getloadavg()[0]
    figures["load_average"] = [load_before, load_after]
    print_table(f"trace: the --trace file against MAX_BYTES ({MAX_BYTES // 2**20} MiB); "
                f"whole for the first {WHOLE_BATCHES:,} batches, then sampled",
                ["figure", "measured", "bound", "result"], rows, right=[False, True, True, False])
    shared = max(load_before, load_after) > SHARED_LOAD
    print(f"load average {load_before:.2f} before, {load_after:.2f} after; {time.perf_counter() - t_start:.0f} s"
          + (f" (shared machine: load average above {SHARED_LOAD})" if shared else ""))
    write_json(args.json, "trace", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
