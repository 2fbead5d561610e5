"""``warpdeck advise SPEC``: a short calibration, then the settings to run the spec with.

The decisions this module protects: advise never runs the pipeline for real; its calibration
runs keep no journal and write into a scratch directory they remove (engine/calibrate.py),
so a run directory is never touched. Everything is printed in one table, a column per backend,
and ``--json`` writes every figure the table is made from. Exit status 0 with advice, 1 when the
calibration could not finish a batch, 2 for bad usage or a bad spec (as ``run``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from warpdeck.engine.api import Advice, BackendAdvice, BackendError, ExitStatus, SpecError, advise, load_spec

__all__ = ["add_advise_parser", "advice_table", "run_advise"]

_PHASES = ("fill", "h2d", "compute", "d2h", "sink")


def add_advise_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``advise`` subcommand and its flags."""
    p = sub.add_parser("advise", help="calibrate a spec for a few seconds and recommend its batch size, host "
                       "threads and slot depth")
    p.add_argument("spec", type=Path)
    p.add_argument("--json", type=Path, metavar="ADVICE.json", help="write every figure as JSON")
    p.add_argument("--backend", choices=("numpy", "cupy"),
                   help="calibrate this backend only (default: both where CuPy can run, else NumPy)")
    p.add_argument("--budget", type=float, default=10.0, metavar="SECONDS",
                   help="calibration time per backend (default 10)")
    p.add_argument("--scratch", type=Path, metavar="DIR",
                   help="where calibration outputs go, removed after (default: the system's temporary "
                   "directory; put it on the disk your outputs go to)")


def run_advise(args: argparse.Namespace, err: Console) -> int:
    """Calibrate, print the table, write the JSON; the exit status."""
    if not args.budget > 0:
        err.print("error: --budget must be a positive number of seconds", markup=False, highlight=False)
        return ExitStatus.USAGE
    try:
        spec = load_spec(args.spec)
        if spec.steps:
            err.print(f"error: {args.spec}: advise calibrates one engine's stages; a spec with steps is not "
                      "calibrated yet (run it: each step's report names its bottleneck)", markup=False,
                      highlight=False)
            return ExitStatus.USAGE
        result = asyncio.run(advise(spec, backend=args.backend, budget_s=args.budget, scratch=args.scratch))
    except (SpecError, BackendError) as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return ExitStatus.USAGE
    except RuntimeError as exc:  # no batch finished: the spec's own run says why
        err.print(f"error: {exc}", markup=False, highlight=False)
        return ExitStatus.FAILED
    Console().print(advice_table(result))
    if args.json is not None:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
        except OSError as exc:
            err.print(f"error: cannot write {args.json}: {exc.strerror or exc}", markup=False, highlight=False)
            return ExitStatus.FAILED
    return ExitStatus.FINISHED


def advice_table(advice: Advice) -> Table:
    """Fitted costs, then the recommendation, a column per backend calibrated."""
    first = advice.results[0]
    t = Table(title=f"warpdeck advise: {advice.pipeline} ({first.limits.cores:g} cores, {first.limits.lanes} "
              f"lane{'s' if first.limits.lanes > 1 else ''}; spec batch_size {advice.batch_size})",
              title_justify="left", caption=_verdict(advice), caption_justify="left")
    t.add_column("per batch of n", style="dim")
    for r in advice.results:
        t.add_column(escape(f"{r.backend} ({r.device})"))
    for p in _PHASES:
        t.add_row(p, *(_phase(r, p) for r in advice.results))
    t.add_row("process CPU", *(f"{r.model.process_cpu.a * 1e3:.2f} ms + {r.model.process_cpu.b * 1e6:.1f} µs/item"
                               for r in advice.results), end_section=True)
    plans = [r.plan for r in advice.results]
    t.add_row("batch_size", *(str(p.batch_size) for p in plans))
    t.add_row(escape("[host] fill_workers"), *(str(p.fill_workers) for p in plans))
    t.add_row(escape("[host] sink_workers"), *(str(p.sink_workers) for p in plans))
    t.add_row("slot_depth", *(str(p.slot_depth) for p in plans))
    t.add_row("predicted", *(f"{p.tasks_s:,.0f} tasks/s" for p in plans))
    t.add_row("device busy", *(f"{p.device_busy:.0%}" for p in plans))
    t.add_row("bottleneck", *(p.bottleneck for p in plans))
    t.add_row("slot memory", *(f"{p.memory_bytes / 2**20:,.1f} MiB" for p in plans))
    t.add_row("calibration", *(f"{len(r.samples) + len(r.checks)} runs, {r.calibration_s:.1f} s, efficiency "
                               f"{r.model.efficiency:.2f}, anchored x {r.model.scale:.2f}" for r in advice.results))
    if any(r.note for r in advice.results):
        t.add_row("note", *(escape(r.note) for r in advice.results))
    return t


def _phase(r: BackendAdvice, phase: str) -> str:
    """A phase's fitted cost per batch, and its CPU share at the recommended size."""
    f = next(f for f in r.model.phases if f.phase == phase)
    n = r.plan.batch_size
    wall = f.wall.at(n)
    share = f"  CPU {min(1.0, f.cpu.at(n) / wall):.0%}" if wall > 0 else ""
    return f"{f.wall.a * 1e3:.2f} ms + {f.wall.b * 1e6:.1f} µs/item{share}"


def _verdict(advice: Advice) -> str:
    if advice.gpu_speedup is None:
        return ""
    if advice.gpu_speedup > 1:
        return f"GPU pays off: x {advice.gpu_speedup:.1f}"
    return f"GPU does not pay off (x {advice.gpu_speedup:.2f})"
