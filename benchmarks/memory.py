"""Memory of a million queued tasks, and the cost of snapshotting their state.

In a fresh subprocess (so nothing else's allocations count): import the engine, read the resident
set size, build a ``warpdeck.engine.state.tasks.TaskTable`` and add 1 000 000 queued tasks (keys
``task-00000000``..., 4096 input bytes each) in chunks of 10 000, and read the RSS again. The key
strings are created by the loop and kept only by the table, so they count: they are part of what
a million queued tasks cost.

Figures:
  RSS growth           /proc/self/statm resident pages after - before (the target's figure)
  peak RSS growth      ru_maxrss after - RSS before (includes the transient copies of a column grow)
  column copy          state, phase, stall and attempt columns copied (``col[:n].copy()``), as
                       ``Engine.snapshot`` does for its TaskView; median of 50, microseconds
  engine.snapshot()    a whole ``Engine.snapshot()`` of an idle engine holding that table (the
                       TUI's 10 Hz call): median of 10, milliseconds
  batch log            then, in the same process, a ``BatchLog`` (engine/state/batch_log.py: a task's
                       story) given one batch per task, the worst case (batch size 1), each started
                       and finished through its public calls: RSS growth and its columns' bytes
  table + batch log    the two growths together: what a million tasks cost with their stories

Target (DESIGN.md): <= 300 MB for 1 000 000 queued tasks. The snapshot budget shown is 100 ms
(10 Hz); the column copy is shown against 1 ms (tasks.py: "copy the state columns in microseconds").

    python benchmarks/memory.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import print_table, verdict, write_json

MB = 1 << 20
RSS_TARGET_MB = 300.0
COPY_TARGET_US = 1000.0
SNAPSHOT_BUDGET_MS = 100.0
CHUNK = 10_000


def _rss_bytes() -> int:
    with Path("/proc/self/statm").open() as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(n: int) -> dict[str, Any]:
    """Runs in the fresh subprocess; returns the figures."""
    import numpy as np  # noqa: PLC0415

    from warpdeck.engine.api import Engine, IterableSource, parse_spec  # noqa: PLC0415
    from warpdeck.engine.state.tasks import TaskTable  # noqa: PLC0415

    before = _rss_bytes()
    t0 = time.perf_counter()
    table = TaskTable()
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        table.add([f"task-{i:08d}" for i in range(lo, hi)], 4096)
    build_s = time.perf_counter() - t0
    after = _rss_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    assert len(table) == n and int(table.counts()[0].sum()) == n

    cols = ("state", "phase", "stall", "attempt")
    times = []
    for _ in range(50):
        c0 = time.perf_counter()
        copies = [getattr(table, c)[:n].copy() for c in cols]
        times.append(time.perf_counter() - c0)
    del copies
    copy_us = float(np.median(times)) * 1e6
    column_bytes = sum(a.nbytes for a in (table.state, table.phase, table.stall, table.stall_since, table.attempt,
                                          table.batch, table.t_queued, table.t_end, table.nbytes_in))

    spec = parse_spec({"name": "bench-memory", "backend": "numpy", "source": {"kind": "synthetic", "count": 1,
                       "shape": [1]}, "sink": {"kind": "null"}, "stages": [{"fn": "_stages:noop"}]})
    eng = Engine(spec, "/nonexistent-unused", source=IterableSource([]))
    eng.state.table = table  # the snapshot builder reads the run state's table
    snap_times = []
    for _ in range(10):
        c0 = time.perf_counter()
        snap = eng.snapshot()
        snap_times.append(time.perf_counter() - c0)
    assert snap.counts.queued == n
    del snap, eng
    log_mb, log_bytes, log_s = _batch_log(n, table)
    return {
        "tasks": n, "rss_before_mb": before / MB, "rss_after_mb": after / MB, "rss_growth_mb": (after - before) / MB,
        "peak_growth_mb": max(0, peak - before) / MB, "bytes_per_task": (after - before) / n,
        "column_bytes_mb": column_bytes / MB, "capacity": len(table.state), "build_s": build_s,
        "column_copy_us": copy_us, "snapshot_ms": float(np.median(snap_times)) * 1e3,
        "batch_log_growth_mb": log_mb, "batch_log_column_mb": log_bytes / MB, "batch_log_fill_s": log_s,
        "total_growth_mb": (after - before) / MB + log_mb,
        "peak_total_growth_mb": max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before) / MB,
    }


def _batch_log(n: int, table: Any) -> tuple[float, int, float]:
    """RSS growth (MB), column bytes and fill time of a batch log holding ``n`` batches of one task."""
    import numpy as np  # noqa: PLC0415

    from warpdeck.engine.state.batch_log import BatchLog  # noqa: PLC0415
    from warpdeck.engine.state.batches import Batch, BatchKey  # noqa: PLC0415
    from warpdeck.engine.state.records import BatchRecord  # noqa: PLC0415

    before = _rss_bytes()
    t0 = time.perf_counter()
    log = BatchLog()
    key = BatchKey("bench", (1024,), "float32")
    formed, p = time.monotonic(), time.perf_counter()
    phases = tuple((p + k * 1e-3, p + k * 1e-3 + 5e-4) for k in range(5))
    for i in range(n):
        row = np.array([i], np.int64)
        log.started(Batch(i, key, row, [], formed, lane=0, slot=i % 2), "bench/cpu", 1, table)
        log.finished(BatchRecord(i, 0, i % 2, 1, str(key), formed, phases, True, 4096))
    fill_s = time.perf_counter() - t0
    assert log.get(n - 1) is not None
    return (_rss_bytes() - before) / MB, log.nbytes, fill_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 000 tasks (target scaled to 60 MB)")
    ap.add_argument("--tasks", type=int, help="tasks to queue (overrides --quick)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    n = args.tasks or (200_000 if args.quick else 1_000_000)
    target_mb = RSS_TARGET_MB * n / 1_000_000
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(n)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return 1
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = [
        ["RSS growth (statm)", f"{r['rss_growth_mb']:.1f} MB", f"<= {target_mb:g} MB",
         verdict(r["rss_growth_mb"] <= target_mb)],
        ["  per task", f"{r['bytes_per_task']:.0f} B", "", verdict(None)],
        ["  of which table columns", f"{r['column_bytes_mb']:.1f} MB", f"(capacity {r['capacity']:,} rows)",
         verdict(None)],
        ["peak RSS growth (ru_maxrss)", f"{r['peak_growth_mb']:.1f} MB", f"<= {target_mb:g} MB",
         verdict(r["peak_growth_mb"] <= target_mb)],
        ["build time (add in chunks of 10 000)", f"{r['build_s'] * 1e3:.0f} ms", "", verdict(None)],
        ["copy state/phase/stall/attempt columns", f"{r['column_copy_us']:.0f} us", f"<= {COPY_TARGET_US:g} us",
         verdict(r["column_copy_us"] <= COPY_TARGET_US)],
        ["Engine.snapshot() holding the table", f"{r['snapshot_ms']:.1f} ms", f"<= {SNAPSHOT_BUDGET_MS:g} ms",
         verdict(r["snapshot_ms"] <= SNAPSHOT_BUDGET_MS)],
        [f"batch log, {n:,} batches of one task (RSS)", f"{r['batch_log_growth_mb']:.1f} MB",
         f"columns {r['batch_log_column_mb']:.1f} MB", verdict(None)],
        ["  fill time (started + finished per batch)", f"{r['batch_log_fill_s'] * 1e3:.0f} ms", "", verdict(None)],
        ["table + batch log (RSS growth)", f"{r['total_growth_mb']:.1f} MB", f"<= {target_mb:g} MB",
         verdict(r["total_growth_mb"] <= target_mb)],
        ["  peak (ru_maxrss)", f"{r['peak_total_growth_mb']:.1f} MB", f"<= {target_mb:g} MB",
         verdict(r["peak_total_growth_mb"] <= target_mb)],
    ]
    print_table(f"memory: TaskTable with {n:,} queued tasks (fresh subprocess; RSS before "
                f"{r['rss_before_mb']:.1f} MB)", ["figure", "measured", "target", "result"], rows,
                right=[False, True, True, False])
    write_json(args.json, "memory", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
