"""The sink in worker processes (issue 31, item 2): outputs written by a user's pure-Python ``target``
that holds the GIL, on the sink threads against in warm worker processes.

Each batch is 32 tasks of float32 (256,); its compute sleeps 10 ms (the device); writing each output
spins a pure-Python loop (``_stages.gil_write``, the GIL held throughout: an encoder written in Python),
30 ms of CPU per batch, 3x the device's time. On threads the writes take turns holding one GIL;
in processes each worker has its own, so they scale with the cores.

Runs (one engine each, 1 lane, the spec's defaults but for the sink's pool):
  threads     [host] sink_pool = "threads" (the default), sink threads tuned
  processes   [host] sink_pool = "processes", as many worker processes as the tuner gives threads
  pinned      processes, sink_workers = the cores (diagnostic)

Bound: the core-aware bound, min(1 / compute, cores / write CPU seconds per batch), the write's CPU
measured here first with ``time.thread_time`` (the median of 9 batches). Rate: the report's steady
rate. Targets: processes >= 0.85 of the bound (as the GIL-bound fill's), and ahead of threads.

    python benchmarks/sink_processes.py [--batches N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from typing import Any

import _stages
import numpy as np
from _common import print_table, verdict, write_json
from _stages import PyBurn

from warpdeck.engine.api import Engine, parse_spec

BATCH = 32
SHAPE = (256,)
COMPUTE_S = 0.010
WRITE_S = 0.030
"""CPU seconds the writes of one batch spend, all holding the GIL."""
RATE_TARGET = 0.85


def write_cpu_s(iters: int, rounds: int = 9) -> float:
    """CPU seconds one batch's writes take on this thread (the median of ``rounds``)."""
    os.environ["WD_BENCH_WRITE_ITERS"] = str(iters)
    out = np.zeros(SHAPE, np.float32)
    spent = []
    for _ in range(rounds):
        c = time.thread_time()
        for j in range(BATCH):
            _stages.gil_write(f"t{j}", out)
        spent.append(time.thread_time() - c)
    return float(np.median(spent))


async def _run(n: int, host: dict[str, Any], run_dir: str) -> Any:
    spec = parse_spec({
        "name": "bench-sink-processes", "backend": "numpy", "batch_size": BATCH,
        "source": {"kind": "items", "items": "_stages:gil_items", "load": "_stages:gil_load", "shape": list(SHAPE),
                   "options": {"count": n * BATCH, "iters": 1}},
        "sink": {"kind": "callable", "target": "_stages:gil_write"},
        "stages": [{"fn": "_stages:compute_sleep"}], "host": host})
    async with Engine(spec, run_dir) as eng:
        return await eng.wait()


def run(n: int, host: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="wd-bench-") as run_dir:
        t0, c0 = time.perf_counter(), time.process_time()
        k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        report = asyncio.run(_run(n, host, run_dir))
        wall, engine_cpu = time.perf_counter() - t0, time.process_time() - c0
        k1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker processes, once they ended
    workers_cpu = (k1.ru_utime + k1.ru_stime) - (k0.ru_utime + k0.ru_stime)
    if report.status != "finished" or report.counts.done != n * BATCH:
        raise RuntimeError(f"the run did not finish: {report.status} {report.counts}")
    return {"batches_s": report.steady_tasks_s / BATCH, "wall_s": wall, "device_busy": report.device_busy,
            "sink": report.host_threads["0"]["sink"], "sink_processes": report.sink_processes.get("0", []),
            "engine_cpu_ms_per_batch": engine_cpu / n * 1e3, "workers_cpu_ms_per_batch": workers_cpu / n * 1e3,
            "bottleneck": report.bottleneck, "tuning": list(report.tuning), "cpu_phase_s": report.cpu_phase_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=600, help="batches per run (default 600)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    _stages.COMPUTE_S = COMPUTE_S
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    iters = PyBurn().iters(WRITE_S / BATCH)
    cpu = write_cpu_s(iters)
    bound = min(1 / COMPUTE_S, cores / cpu)
    runs = {
        "threads": run(args.batches, {}),
        "processes": run(args.batches, {"sink_pool": "processes"}),
        f"processes, {cores} pinned (diagnostic)": run(args.batches, {"sink_pool": "processes", "sink_workers": cores}),
    }
    threads, procs = runs["threads"]["batches_s"], runs["processes"]["batches_s"]
    rows = []
    for name, r in runs.items():
        judged: tuple[str, str, str, bool | None] = ("", "", "", None)
        frac = r["batches_s"] / bound
        if name == "processes":
            judged = ("of bound", f"{frac:.3f}", f">= {RATE_TARGET}", frac >= RATE_TARGET)
        rows.append([name, r["sink"], f"{r['batches_s']:.1f}", f"{bound:.1f}", f"{frac:.3f}",
                     f"{r['device_busy']:.3f}", *judged[:3], verdict(judged[3])])
    rows.append(["", "", "", "", "", "", "/ threads", f"{procs / threads:.2f}x", "> 1.00", verdict(procs > threads)])
    print_table(
        f"sink in processes: {args.batches} batches x {BATCH} tasks, compute {COMPUTE_S * 1e3:g} ms, writes "
        f"{cpu * 1e3:.1f} ms of GIL-held CPU per batch, {cores} cores; bound = min(1 / compute, cores / write CPU)",
        ["run", "sink", "batches/s", "bound", "of bound", "busy", "judged", "measured", "target", "result"], rows,
        right=[False, True, True, True, True, True, False, True, False, False])
    for name, r in runs.items():
        spent = (r["engine_cpu_ms_per_batch"] + r["workers_cpu_ms_per_batch"]) / 1e3
        print(f"  {name}: CPU per batch {r['engine_cpu_ms_per_batch']:.1f} ms in the engine's process, "
              f"{r['workers_cpu_ms_per_batch']:.1f} ms in worker processes (their starts included); the cores "
              f"allow {cores / spent:.1f} batches/s at that cost, reached {r['batches_s'] * spent / cores:.3f}; "
              f"wall {r['wall_s']:.1f} s")
        print(f"    {r['bottleneck'] or '(no bottleneck reported)'}")
        for t in r["tuning"][-3:]:
            print(f"    tuner: {t}")
    load_after = os.getloadavg()[0]
    print(f"load average {load_before:.2f} before, {load_after:.2f} after")
    write_json(args.json, "sink_processes", {"batches": args.batches, "cores": cores, "write_cpu_s": cpu,
                                             "bound_batches_s": bound, "runs": runs,
                                             "load_average": [load_before, load_after]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
