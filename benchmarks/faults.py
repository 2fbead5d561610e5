"""Faults from outside: how fast the run stops when its journal fails, and how fast it carries on
when an outage ends, in one run.

  journal stop    a run whose journal's next commit fails for a reason other than its disk (a
                  corrupt page: ``sqlite3.DatabaseError``, injected at the journal's commit); from
                  the failing commit to ``Engine.wait()`` returning its report. Target (issue 14):
                  under 1 s.
  outage end      a run whose sink refuses every write with ENOSPC (injected in a callable sink)
                  until it is told the disk has room again; from that moment to the next task
                  done. It bounds how long a run sits idle after its disk came back: the held
                  write's backoff (at most 2 s) plus a fault tick.

Each is measured ``--trials`` times; the figures are the median and the worst, against the bound.

    python benchmarks/faults.py [--quick] [--trials N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import print_table, verdict, write_json

from warpdeck.engine.api import Drain, Engine, IterableSource, parse_spec
from warpdeck.engine.edges.journal import Journal

JOURNAL_STOP_S = 1.0
OUTAGE_END_S = 2.0 + 0.1 + 0.5  # the backoff's longest wait, a fault tick, a batch


def _spec(sink: dict[str, Any]) -> Any:
    return parse_spec({"name": "faults", "backend": "numpy", "batch_size": 4,
                       "source": {"kind": "synthetic", "count": 1, "shape": [8]},
                       "sink": sink, "stages": [{"fn": "_stages:compute_sleep"}]}, "<bench>")


def _items(n: int) -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:05d}", np.full(8, float(i))) for i in range(n)]


async def journal_stop(tmp: Path) -> float:
    """Seconds from the journal's failing commit to the run's report."""
    real = Journal._apply_ops
    broke: dict[str, float] = {}

    def breaking(self: Journal, ops: list[Any]) -> None:
        if any(op[0] == "done" for op in ops) and "at" not in broke:
            broke["at"] = time.perf_counter()
            raise sqlite3.DatabaseError("database disk image is malformed")
        real(self, ops)

    Journal._apply_ops = breaking  # type: ignore[method-assign]
    try:
        spec = _spec({"kind": "npy_dir", "path": str(tmp / "out")})
        async with Engine(spec, tmp / "run", source=IterableSource(_items(4000))) as eng:
            report = await eng.wait()
            ended = time.perf_counter()
    finally:
        Journal._apply_ops = real  # type: ignore[method-assign]
    assert report.stopped_by == "journal", report.stopped_by
    return ended - broke["at"]


FULL = threading.Event()


async def _until(cond: Callable[[], bool], step: float = 0.005, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(step)


def refusing_sink(key: str, out: Any) -> None:
    if FULL.is_set():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"/data/{key}.npy")


async def outage_end() -> float:
    """Seconds from the disk having room again to the next task done."""
    FULL.clear()
    spec = _spec({"kind": "callable", "target": "faults:refusing_sink"})
    async with Engine(spec, source=IterableSource(_items(4000))) as eng:
        await _until(lambda: eng.snapshot().counts.done >= 8)
        FULL.set()
        await _until(lambda: eng.outage.view() is not None)
        await asyncio.sleep(1.0)  # let the backoff grow as a real outage would
        done = eng.snapshot().counts.done
        FULL.clear()
        t0 = time.perf_counter()
        await _until(lambda: eng.snapshot().counts.done > done, step=0.002)
        back = time.perf_counter() - t0
        await eng.command(Drain())
        await eng.wait()
    return back


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 trials")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    trials = 3 if args.quick else args.trials
    sys.modules.setdefault("faults", sys.modules[__name__])
    stops, ends = [], []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as d:
            stops.append(asyncio.run(journal_stop(Path(d))))
        ends.append(asyncio.run(outage_end()))
    rows = [
        ("journal failure -> run stopped", f"{statistics.median(stops) * 1e3:.0f} ms", f"{max(stops) * 1e3:.0f} ms",
         f"< {JOURNAL_STOP_S * 1e3:.0f} ms", verdict(max(stops) < JOURNAL_STOP_S)),
        ("disk back -> next task done", f"{statistics.median(ends) * 1e3:.0f} ms", f"{max(ends) * 1e3:.0f} ms",
         f"< {OUTAGE_END_S * 1e3:.0f} ms", verdict(max(ends) < OUTAGE_END_S)),
    ]
    print_table(f"faults ({trials} trials each)", ["figure", "median", "worst", "bound", ""], rows,
                right=[False, True, True, True, False])
    write_json(args.json, "faults", {"journal_stop_s": stops, "outage_end_s": ends})
    return 0


if __name__ == "__main__":
    sys.exit(main())
