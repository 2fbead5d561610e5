"""Engine overhead: no-op work pushed through every phase, per task and per second.

The stage does nothing, the source's load returns at once without touching its rows, the sink is
the spec's null sink; 1 lane, NumPy backend, defaults otherwise (auto depth on). What is left is
the engine: enumeration, admission, batching, the task table, five executor hops per batch, the
watcher coroutines, metrics and the 10 Hz snapshots.

Figures per batch size (1 and 256):
  wall us/task, tasks/s   perf_counter around the whole run (engine start to report), over tasks
  loop-thread CPU us/task time.thread_time() of the thread running the event loop: the engine's
                          on-loop CPU (executor threads and the feeder's to_thread pulls excluded)
  process CPU us/task     time.process_time() of the whole process (every thread), over tasks
  first batch             report.first_batch_s (engine start to the first batch sunk)

Targets (DESIGN.md): <= 20 us per task and >= 50 k no-op tasks/s at batch 256 (one core);
(issue 16) <= 250 us per batch at batch 1.

    python benchmarks/overhead.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from typing import Any

from _common import print_table, verdict, write_json
from _stages import InstantSource

from warpdeck.engine.api import Engine, RunReport, parse_spec

US_TARGET = 20.0
RATE_TARGET = 50_000.0
BATCH1_US_TARGET = 250.0
"""Issue 16: a batch of one task must not be a trap: the engine's own cost per batch."""


async def _run(count: int, batch: int, run_dir: str) -> RunReport:
    spec = parse_spec({
        "name": "bench-overhead", "backend": "numpy", "batch_size": batch, "slot_depth": 2, "lanes": 1,
        "source": {"kind": "synthetic", "count": count, "shape": [1]},  # replaced by InstantSource
        "sink": {"kind": "null"},
        "stages": [{"fn": "_stages:noop"}],
    })
    async with Engine(spec, run_dir, source=InstantSource(count)) as eng:
        return await eng.wait()


def measure(count: int, batch: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wd-bench-") as run_dir:
        w0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        report = asyncio.run(_run(count, batch, run_dir))
        w1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
    if report.status != "finished" or report.counts.done != count:
        raise RuntimeError(f"run did not finish: {report.status} {report.counts}")
    wall = w1 - w0
    return {
        "tasks": count, "batch_size": batch, "wall_s": wall, "tasks_s": count / wall,
        "wall_us_per_task": wall / count * 1e6,
        "loop_cpu_us_per_task": (c1 - c0) / count * 1e6, "process_cpu_us_per_task": (p1 - p0) / count * 1e6,
        "steady_tasks_s": report.steady_tasks_s, "first_batch_s": report.first_batch_s,
        "elapsed_s": report.elapsed_s, "slot_depth": report.slot_depth, "mean_phase_s": report.mean_phase_s,
        "stall_s": report.stall_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 000 tasks at batch 1, 50 000 at batch 256")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    plan = [(2_000, 1), (50_000, 256)] if args.quick else [(20_000, 1), (500_000, 256)]
    measure(2_000, 256)  # warm-up: imports, first allocations
    results = {str(b): measure(n, b) for n, b in plan}

    rows: list[list[Any]] = []
    for n, b in plan:
        r = results[str(b)]
        big = b == 256
        target = US_TARGET if big else BATCH1_US_TARGET if b == 1 else None
        rows.append([b, n, "wall time per task" if b != 1 else "wall time per batch (of one task)",
                     f"{r['wall_us_per_task']:.2f} us", f"<= {target:g} us" if target else "",
                     verdict(r["wall_us_per_task"] <= target if target else None)])
        rows.append([b, n, "tasks/s (whole run)", f"{r['tasks_s']:,.0f}",
                     f">= {RATE_TARGET:,.0f}" if big else "", verdict(r["tasks_s"] >= RATE_TARGET if big else None)])
        rows.append([b, n, "tasks/s (engine steady state)", f"{r['steady_tasks_s']:,.0f}", "", verdict(None)])
        rows.append([b, n, "loop-thread CPU per task (on-loop)", f"{r['loop_cpu_us_per_task']:.2f} us",
                     f"<= {US_TARGET:g} us" if big else "",
                     verdict(r["loop_cpu_us_per_task"] <= US_TARGET if big else None)])
        rows.append([b, n, "process CPU per task (all threads)", f"{r['process_cpu_us_per_task']:.2f} us", "",
                     verdict(None)])
        fb = r["first_batch_s"]
        rows.append([b, n, "first batch (report.first_batch_s)", f"{fb * 1e3:.1f} ms" if fb is not None else "n/a",
                     "", verdict(None)])
    print_table("overhead: no-op stage, instant source, null sink; 1 lane, NumPy backend",
                ["batch", "tasks", "figure", "measured", "target", "result"], rows,
                right=[True, True, False, True, True, False])
    write_json(args.json, "overhead", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
