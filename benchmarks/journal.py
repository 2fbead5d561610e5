"""Journal cost: the overlap benchmark's warpdeck run with the journal on and off, in one run.

The workload is overlap.py's balanced profile (batches of 32 tasks; load 10 ms, compute 10 ms,
sink 2 ms per batch), run by warpdeck with ``journal=True`` (SQLite, WAL, one writer thread)
and ``journal=False``, alternating, ``--pairs`` times. The figure is the median over pairs of
steady batches/s (on) / batches/s (off); the target (DESIGN.md section 6, issue 5): at least 0.95,
i.e. the journal costs at most 5 % of throughput.

Beside it: the journal's own write rate, measured in isolation (rows per second through the
writer thread, admitted + started + done, as a run writes them), so the margin is visible; and what
the npy sink's checksums cost (issue 28: a resume checks an output the journal never recorded
against them): its ``write`` against the same temp-file-and-rename write without the CRC and its
log line, 16 MiB of outputs each, alternating (each first in half the pairs), median of pairs.

    python benchmarks/journal.py [--quick] [--pairs N] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _stages
import numpy as np
from _common import print_table, verdict, write_json
from overlap import COMPUTE_S, load_schedule, run_warpdeck

from warpdeck.engine.edges.journal import Journal, SpecIdentity
from warpdeck.engine.edges.sinks import TMP_SUFFIX, NpyDirSinkImpl
from warpdeck.engine.state.tasks import TaskTable

TARGET = 0.95


def writer_rate(n: int, batch: int = 32) -> float:
    """Tasks/s the journal records (admit, start, done per task) with nothing else running."""
    keys = [f"t{i:08d}" for i in range(n)]
    table = TaskTable()
    table.add(keys)
    with tempfile.TemporaryDirectory(prefix="wd-bench-journal-") as d:
        journal, _ = Journal.open(Path(d), SpecIdentity("bench", "0"))
        journal.attach(table.keys)
        t0 = time.perf_counter()
        for lo in range(0, n, batch):
            rows = np.arange(lo, min(lo + batch, n), dtype=np.int64)
            journal.admitted(rows)
            journal.started(rows, lo // batch, np.zeros(len(rows), np.int16))
            journal.finished(rows)
        journal.flush()
        dt = time.perf_counter() - t0
        journal.close()
    return n / dt


class _Writes:
    """Only ``write``, as the sink hands numpy (its chunked path, errors with their errno)."""

    __slots__ = ("write",)

    def __init__(self, f: Any) -> None:
        self.write = f.write


def _plain_write(sink: NpyDirSinkImpl, key: str, out: np.ndarray) -> None:
    """The npy sink's write before issue 28: temp file, rename; no checksum, no log."""
    tmp = sink.dir / f".{key}.npy.plain{TMP_SUFFIX}"
    with tmp.open("wb") as f:
        np.lib.format.write_array(_Writes(f), np.ascontiguousarray(out), allow_pickle=False)
    tmp.replace(sink.path(key))


def checksum_cost(out_bytes: int, n: int, pairs: int) -> float:
    """Median over pairs of (npy sink write) / (plain write), seconds per output, ``n`` outputs."""
    out = np.random.default_rng(1).random((n, out_bytes // 8))
    ratios = []
    with tempfile.TemporaryDirectory(prefix="wd-bench-sums-") as d:
        for p in range(pairs):
            times = {}
            for checked in (False, True) if p % 2 else (True, False):  # each first in half the pairs
                sink = NpyDirSinkImpl(Path(d) / f"{p}-{checked}")
                sink.dir.mkdir()
                t0 = time.perf_counter()
                for j in range(n):
                    (sink.write if checked else lambda k, o, s=sink: _plain_write(s, k, o))(f"k{j:05d}", out[j])
                times[checked] = time.perf_counter() - t0
            ratios.append(times[True] / times[False])
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 batches per run and 2 pairs instead of 200 and 3")
    ap.add_argument("--pairs", type=int, help="on/off pairs (default 3, --quick 2)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    n = 60 if args.quick else 200
    pairs = args.pairs or (2 if args.quick else 3)
    _stages.COMPUTE_S = COMPUTE_S
    load_s = load_schedule("balanced", n, 7)
    on: list[float] = []
    off: list[float] = []
    for _ in range(pairs):  # alternate, so drift on a shared machine hits both alike
        off.append(run_warpdeck(load_s, journal=False)["batches_s"])
        on.append(run_warpdeck(load_s, journal=True)["batches_s"])
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    ratio = statistics.median(ratios)
    rate = writer_rate(200_000 if not args.quick else 50_000)
    sums = {size: checksum_cost(size, max(4, (16 << 20) // size), 5 if args.quick else 9)
            for size in (64 << 10, 4 << 20)}
    rows: list[list[Any]] = [
        ["journal off: steady batches/s", f"{statistics.median(off):.1f}", "", verdict(None)],
        ["journal on: steady batches/s", f"{statistics.median(on):.1f}", "", verdict(None)],
        ["on / off (median of pairs)", f"{ratio:.3f}", f">= {TARGET:.2f}", verdict(ratio >= TARGET)],
        ["on / off per pair", " ".join(f"{r:.3f}" for r in ratios), "", verdict(None)],
        ["journal writer alone: tasks/s (3 records each)", f"{rate:,.0f}", "", verdict(None)],
        *([f"npy sink write with checksums / without, {size >> 10} KiB outputs", f"{r:.2f}", "", verdict(None)]
          for size, r in sums.items()),
    ]
    print_table(f"journal cost on overlap.py's balanced profile: {n} batches x 32 tasks, {pairs} pairs",
                ["figure", "measured", "target", "result"], rows, right=[False, True, True, False])
    write_json(args.json, "journal", {"batches": n, "pairs": pairs, "on_batches_s": on, "off_batches_s": off,
                                      "ratios": ratios, "ratio": ratio, "target": TARGET,
                                      "writer_tasks_s": rate,
                                      "checksum_cost": {str(size): r for size, r in sums.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
