"""Steps: a reduce over many tasks against the all-reduce model, and what a barrier costs, in one run.

1. A reduce: ``--tasks`` synthetic tasks (default 1,000,000; ``--quick`` 100,000) of float32 (16,),
   batch 4096, reduced by the ``mean_var`` built-in in a spec of one reduce step (no stages: the runner
   gives it the identity stage), run with ``run_steps`` at 1, 2 and 4 lanes. Its wall time is split
   into (a) the engine run (``report.elapsed_s``: fill, the identity stage, and in the sink the
   per-batch ``combine`` and the partial's file write), the engine's open and close (journal, settle),
   and (b) the final merge, timed here again on the partials the run left by the calls the runner
   makes: ``ReduceSinkImpl.partials()`` (read and check every partial, then check that no task key is
   in two partials: shown apart), ``tree_merge`` and ``finish`` (median of 3). Beside it: the same job
   map-only (same source, the identity stage, null sink, through ``run_pipeline``), so the reduce's
   cost per task shows; and the all-reduce model 2(p-1)a + 2(p-1)/p b m for p = lanes, m = the
   accumulator's bytes. a and b are measured on the channel the lanes' accumulators meet through, a
   partial file: one message of m bytes is a partial written by the reduce's sink (checksum,
   ``np.savez``, rename), read back and checked (``read_partial``) and merged into another.
   a = that cost for a 1-value accumulator; b = the slope from there to a 16 MiB one. The same a and
   b price what the engine does instead, one message per batch (k partials: k (a + b m), and with b
   on the partial's file bytes, which hold the batch's task keys too).
2. The barrier: map -> reduce -> map (``--barrier-tasks``, default 200,000; ``--quick`` 20,000; float32
   (16,), batch 4096): ``first`` (x * 2 + 1) writes its outputs as .npy, ``stats`` (``mean_var``)
   reduces them, ``second`` standardises the first map's outputs with the stats (``params``), null
   sink. Run as steps with ``run_steps``, and as three separate jobs (``run_pipeline`` each: the
   first into an npy_dir sink, the reduce through the same ``ReduceSinkImpl`` plus ``tree_merge`` and
   ``finish`` by hand, the second reading the first's outputs, handed the result by a module-level
   variable). Both wall times, alternating which goes first, ``--pairs`` times (default 1; writing
   and deleting many small files makes runs minutes apart vary by 2x on a small VM, so compare the
   two within a pair, and the runner's own time, which is not noisy), the median ratio, and
   the steps' per-segment seconds and barrier waits, and the runner's own time between segments.
3. Ray (2 actors) and a straggler profile are not measured: steps refuse ``executor = "ray"``, and
   speculative backups do not exist yet; the script says so.

    python benchmarks/steps.py [--quick] [--tasks N] [--barrier-tasks N] [--pairs N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from _common import print_table, verdict, write_json

from warpdeck.engine.api import PipelineSpec, StepsReport, parse_spec, run_pipeline, run_steps
from warpdeck.engine.edges.reduce_sink import ReduceSinkImpl, read_partial
from warpdeck.engine.state.reducers import Acc, allreduce_model_s, builtin_reducer, tree_merge

if __name__ == "__main__":  # the engine resolves "steps:first": let that name this very module
    sys.modules.setdefault("steps", sys.modules[__name__])

SHAPE = (16,)
BATCH = 4096
LANES = (1, 2, 4)
IDENTITY = "warpdeck.engine.steps.plan:unchanged"
"""The stage the runner gives a reduce step without stages; the map-only job runs it too."""
BIG_VALUES = 1 << 20
"""Values per array of the large accumulator b is measured with (mean and m2: 16 MiB)."""

PARAMS: Mapping[str, Any] = {}
"""The separate jobs' hand-over: the reduce's result, set before the second job starts."""


# -- stages (resolved as steps:<name>) ---------------------------------------------------------------
def first(xp: Any, inp: Any, out: Any) -> None:
    """The first map: cheap arithmetic."""
    out[...] = inp * 2.0 + 1.0


def _standardise(xp: Any, inp: Any, out: Any, stats: Mapping[str, Any]) -> None:
    mean = xp.asarray(stats["mean"], dtype=inp.dtype)
    std = xp.asarray(stats["std"], dtype=inp.dtype)
    out[...] = (inp - mean) / xp.where(std > 0, std, 1)


def second(xp: Any, inp: Any, out: Any, params: Mapping[str, Any]) -> None:
    """The second map, as a step after the reduce: ``params["stats"]`` is its result."""
    _standardise(xp, inp, out, params["stats"])


def second_plain(xp: Any, inp: Any, out: Any) -> None:
    """The second map as a job of its own: the result from ``PARAMS``."""
    _standardise(xp, inp, out, PARAMS)


# -- helpers ----------------------------------------------------------------------------------------
def _spec(name: str, count: int, lanes: int, **more: Any) -> PipelineSpec:
    return parse_spec({"name": name, "backend": "numpy", "batch_size": BATCH, "lanes": lanes,
                       "source": {"kind": "synthetic", "count": count, "shape": list(SHAPE)},
                       "sink": {"kind": "null"}} | more)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _us(s: float) -> str:
    return f"{s * 1e6:,.1f} us"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms"


def _checked_steps(rep: StepsReport) -> StepsReport:
    bad = [s for s in rep.segments if s.status != "finished"]
    if bad:
        raise RuntimeError(f"steps did not finish: {[(s.name, s.status) for s in bad]}")
    return rep


def _checked_run(rep: Any, count: int, what: str) -> Any:
    if rep.status != "finished" or rep.counts.done != count:
        raise RuntimeError(f"{what} did not finish: {rep.status} {rep.counts}")
    return rep


def _acc_bytes(acc: Acc) -> int:
    return sum(np.asarray(v).nbytes for v in acc.values())


# -- 1. the reduce ----------------------------------------------------------------------------------
def final_merge(partials_dir: Path) -> dict[str, Any]:
    """The runner's final merge of a finished reduce, timed by part: median of 3 (the files are in
    the page cache each time, as they are when the runner merges right after the run). ``partials()``
    reads and checks every file (``read_partial``, timed alone as well) and then checks that no task
    key is in two partials: the rest of its time."""
    reducer = builtin_reducer("mean_var")
    paths = sorted(partials_dir.glob("partial-*.npz"))
    files, reads, merges, finishes = [], [], [], []
    acc: Acc | None = None
    for _ in range(3):
        files.append(_timed(lambda: [read_partial(p) for p in paths])[0])
        sink = ReduceSinkImpl(partials_dir, reducer)
        t_read, accs = _timed(sink.partials)
        t_merge, acc = _timed(lambda a=accs: tree_merge(reducer, a))
        t_finish, _ = _timed(lambda a=acc: reducer.finish(a))
        reads.append(t_read)
        merges.append(t_merge)
        finishes.append(t_finish)
    read, merge, finish = statistics.median(reads), statistics.median(merges), statistics.median(finishes)
    file_s = min(statistics.median(files), read)
    return {"partials": len(paths), "read_s": read, "files_s": file_s, "keys_s": read - file_s, "merge_s": merge,
            "finish_s": finish, "total_s": read + merge + finish,
            "acc_bytes": _acc_bytes(acc) if acc is not None else 0,
            "file_bytes": sum(p.stat().st_size for p in paths) / max(1, len(paths))}


def reduce_run(root: Path, count: int, lanes: int) -> dict[str, Any]:
    """One reduce step through ``run_steps``, its final merge timed again; the run directory removed."""
    spec = _spec(f"bench-reduce-{lanes}", count, lanes,
                 steps=[{"name": "stats", "reduce": {"builtin": "mean_var"}}])
    run_dir = root / f"reduce-{lanes}"
    wall, rep = _timed(lambda: asyncio.run(run_steps(spec, run_dir)))
    seg = _checked_steps(rep).segments[0]
    assert seg.report is not None
    _checked_run(seg.report, count, "the reduce")
    merged = final_merge(run_dir / "steps" / "stats" / "partials")
    out = {"wall_s": wall, "segment_s": seg.seconds, "engine_s": seg.report.elapsed_s,
           "open_close_s": max(0.0, seg.seconds - seg.report.elapsed_s - merged["total_s"]),
           "batches": merged["partials"], "sink_phase_s": seg.report.mean_phase_s.get("sink", 0.0),
           "sink_cpu_s": seg.report.cpu_phase_s.get("sink", 0.0),
           "merge": merged}
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def map_run(root: Path, count: int, lanes: int) -> dict[str, Any]:
    """The same job map-only: identity stage, null sink, one engine run (journaled, as a step is)."""
    spec = _spec(f"bench-map-{lanes}", count, lanes, stages=[{"fn": IDENTITY}])
    run_dir = root / f"map-{lanes}"
    wall, rep = _timed(lambda: asyncio.run(run_pipeline(spec, run_dir)))
    _checked_run(rep, count, "the map-only job")
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"wall_s": wall, "engine_s": rep.elapsed_s, "sink_phase_s": rep.mean_phase_s.get("sink", 0.0),
            "sink_cpu_s": rep.cpu_phase_s.get("sink", 0.0)}


class _Ready:
    """A 'reducer' whose combine hands back a prepared accumulator: the sink's write timed without
    any reducing (only ``combine`` is asked of a sink's reducer)."""

    def __init__(self, acc: Acc) -> None:
        self.acc = acc

    def combine(self, acc: Acc | None, batch: Any) -> Acc:
        return self.acc


def message_cost(root: Path, values: int, repeats: int) -> dict[str, float]:
    """One message of a mean_var accumulator of ``values`` per array: the partial written by the
    sink (checksum, np.savez, rename), read back and checked, and merged into another accumulator.
    Medians over ``repeats``."""
    reducer = builtin_reducer("mean_var")
    x = np.random.default_rng(3).random((2, values), dtype=np.float64).astype(np.float32)
    a, b = reducer.combine(None, x[:1]), reducer.combine(None, x[1:])
    d = root / f"msg-{values}"
    sink = ReduceSinkImpl(d, _Ready(a))
    one = np.zeros((1, 1), np.float32)
    writes, reads, merges = [], [], []
    for i in range(repeats):
        t_w, _ = _timed(lambda j=i: sink.write_batch([f"k{j}"], one))
        t_r, _ = _timed(lambda j=i: read_partial(d / f"partial-{j:05d}.npz"))
        t_m, _ = _timed(lambda: reducer.merge(a, b))
        writes.append(t_w)
        reads.append(t_r)
        merges.append(t_m)
    shutil.rmtree(d, ignore_errors=True)
    w, r, m = statistics.median(writes), statistics.median(reads), statistics.median(merges)
    return {"bytes": _acc_bytes(a), "write_s": w, "read_s": r, "merge_s": m, "total_s": w + r + m}


def sink_per_batch(root: Path, repeats: int) -> dict[str, float]:
    """What the reduce's sink does per batch of BATCH tasks: ``combine`` and the partial's write."""
    reducer = builtin_reducer("mean_var")
    batch = np.random.default_rng(4).random((BATCH, *SHAPE), dtype=np.float32)
    d = root / "sink-batch"
    sink = ReduceSinkImpl(d, reducer)
    keys = [f"syn-{i:08d}" for i in range(BATCH)]
    combines, totals = [], []
    for _ in range(repeats):
        combines.append(_timed(lambda: reducer.combine(None, batch))[0])
        totals.append(_timed(lambda: sink.write_batch(keys, batch))[0])
    shutil.rmtree(d, ignore_errors=True)
    c, t = statistics.median(combines), statistics.median(totals)
    return {"combine_s": c, "write_s": max(0.0, t - c), "total_s": t}


def ray_line() -> str:
    """What the spec says to a run of steps on Ray."""
    try:
        parse_spec({"name": "bench-ray", "executor": "ray", "source": {"kind": "synthetic", "count": 1, "shape": [1]},
                    "sink": {"kind": "null"}, "steps": [{"name": "s", "reduce": {"builtin": "sum"}}]})
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        said = next((ln.strip() for ln in str(err).splitlines() if "local lanes" in ln), str(err).splitlines()[-1])
        return f'the spec refuses it ("{said}")'
    return "the spec accepts executor = 'ray' now: measure it"


# -- 2. the barrier ---------------------------------------------------------------------------------
def barrier_steps(root: Path, count: int) -> tuple[float, StepsReport]:
    spec = _spec("bench-barrier", count, 1, steps=[
        {"name": "first", "stages": [{"fn": "steps:first"}]},
        {"name": "stats", "after": ["first"], "reduce": {"builtin": "mean_var"}},
        {"name": "second", "after": ["first", "stats"], "stages": [{"fn": "steps:second"}]},
    ])
    run_dir = root / "barrier-steps"
    wall, rep = _timed(lambda: asyncio.run(run_steps(spec, run_dir)))
    _checked_steps(rep)
    shutil.rmtree(run_dir, ignore_errors=True)
    return wall, rep


def barrier_separate(root: Path, count: int) -> tuple[float, dict[str, float], Mapping[str, Any]]:
    """The same work as three jobs, chained by hand."""
    global PARAMS  # the hand-over the separate jobs use
    d = root / "barrier-separate"
    outputs = d / "first" / "outputs"
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    spec1 = _spec("bench-sep-first", count, 1, stages=[{"fn": "steps:first"}],
                  sink={"kind": "npy_dir", "path": str(outputs)})
    times["first"], rep = _timed(lambda: asyncio.run(run_pipeline(spec1, d / "first")))
    _checked_run(rep, count, "the first job")

    reducer = builtin_reducer("mean_var")
    spec2 = parse_spec({"name": "bench-sep-stats", "backend": "numpy", "batch_size": BATCH, "lanes": 1,
                        "source": {"kind": "npy_dir", "path": str(outputs)}, "sink": {"kind": "null"},
                        "stages": [{"fn": IDENTITY}]})

    def reduce_job() -> Mapping[str, Any]:
        sink = ReduceSinkImpl(d / "stats" / "partials", reducer)
        _checked_run(asyncio.run(run_pipeline(spec2, d / "stats", sink=sink)), count, "the reduce job")
        return reducer.finish(tree_merge(reducer, sink.partials()))

    times["stats"], PARAMS = _timed(reduce_job)
    spec3 = parse_spec({"name": "bench-sep-second", "backend": "numpy", "batch_size": BATCH, "lanes": 1,
                        "source": {"kind": "npy_dir", "path": str(outputs)}, "sink": {"kind": "null"},
                        "stages": [{"fn": "steps:second_plain"}]})
    times["second"], rep = _timed(lambda: asyncio.run(run_pipeline(spec3, d / "second")))
    _checked_run(rep, count, "the second job")
    wall = time.perf_counter() - t0
    shutil.rmtree(d, ignore_errors=True)
    return wall, times, PARAMS


def reduce_table(n: int, runs: Mapping[int, dict[str, Any]]) -> None:
    """Table 1: the reduce at each lane count, against the same job map-only."""
    rows: list[list[Any]] = []
    for lanes in LANES:
        r, mp = runs[lanes]["reduce"], runs[lanes]["map"]
        mg = r["merge"]
        rows += [
            [lanes, "reduce step: wall (run_steps)", f"{r['wall_s']:.2f} s",
             f"map-only job: {mp['wall_s']:.2f} s", verdict(None)],
            [lanes, "reduce: tasks/s (whole step)", f"{n / r['wall_s']:,.0f}",
             f"map-only: {n / mp['wall_s']:,.0f}", verdict(None)],
            [lanes, "reduce: tasks/s (engine run)", f"{n / r['engine_s']:,.0f}",
             f"map-only: {n / mp['engine_s']:,.0f}", verdict(None)],
            [lanes, "reduce's cost per task over map-only (wall)", _us((r["wall_s"] - mp["wall_s"]) / n),
             "", verdict(None)],
            [lanes, "(a) engine run (fill, stage, combine + partial write)", f"{r['engine_s']:.2f} s",
             f"map-only engine run: {mp['engine_s']:.2f} s", verdict(None)],
            [lanes, "(a)'s sink phase per batch: wall, CPU", f"{_ms(r['sink_phase_s'])}, {_ms(r['sink_cpu_s'])}",
             f"map-only's null sink: {_ms(mp['sink_phase_s'])}, {_ms(mp['sink_cpu_s'])}", verdict(None)],
            [lanes, "engine open + close (journal, settle)", f"{r['open_close_s']:.2f} s", "", verdict(None)],
            [lanes, f"(b) final merge of {mg['partials']} partials", _ms(mg["total_s"]),
             f"read + check files {_ms(mg['files_s'])}, no key twice {_ms(mg['keys_s'])}, "
             f"tree_merge {_ms(mg['merge_s'])}, finish {_us(mg['finish_s'])}", verdict(None)],
            [lanes, "(b)'s check that no key is in two partials, per task", _us(mg["keys_s"] / n), "",
             verdict(None)],
        ]
    print_table(f"reduce: mean_var over {n:,} synthetic tasks of float32 {SHAPE}, batch {BATCH}, "
                "against the same job map-only (identity stage, null sink)",
                ["lanes", "figure", "measured", "compared with", "result"], rows,
                right=[True, False, True, False, False])


def model_table(runs: Mapping[int, dict[str, Any]], tiny: dict[str, float], big: dict[str, float],
                per_batch: dict[str, float]) -> tuple[float, float, int]:
    """Table 2: a and b, and the final merge against the all-reduce model; returns a, b and m."""
    alpha = tiny["total_s"]
    beta = max(0.0, (big["total_s"] - tiny["total_s"]) / (big["bytes"] - tiny["bytes"]))
    m = runs[1]["reduce"]["merge"]["acc_bytes"]
    f_bytes = runs[1]["reduce"]["merge"]["file_bytes"]
    rows = [
        ["a: one message of a 1-value accumulator", _us(alpha),
         f"{tiny['bytes']} B: write {_us(tiny['write_s'])} + read {_us(tiny['read_s'])} "
         f"+ merge {_us(tiny['merge_s'])}", verdict(None)],
        ["b: per byte, from a 16 MiB accumulator", f"{beta * 1e9:.3f} ns/B ({1 / beta / 1e9:.2f} GB/s)"
         if beta > 0 else "0",
         f"{big['bytes'] / 2**20:.0f} MiB: write {_ms(big['write_s'])} + read {_ms(big['read_s'])} "
         f"+ merge {_ms(big['merge_s'])}", verdict(None)],
        ["m: the accumulator (count, mean, m2 of (16,))", f"{m} B",
         f"a partial's file: {f_bytes:,.0f} B (its {BATCH} task keys and a checksum beside the accumulator)",
         verdict(None)],
        ["sink per batch of 4096: combine + partial write", _ms(per_batch["total_s"]),
         f"combine {_ms(per_batch['combine_s'])}, write {_ms(per_batch['write_s'])}", verdict(None)],
    ]
    for p in LANES:
        mg = runs[p]["reduce"]["merge"]
        model = allreduce_model_s(p, alpha, beta, m)
        k = mg["partials"]
        rows.append([f"p = {p}: measured final merge (b)", _ms(mg["total_s"]),
                     f"all-reduce model 2(p-1)a + 2(p-1)/p b m = {_ms(model)}", verdict(None)])
        rows.append([f"p = {p}: (b) without the key check", _ms(mg["total_s"] - mg["keys_s"]),
                     f"{k} partials x (a + b m) = {_ms(k * (alpha + beta * m))}; x (a + b file) = "
                     f"{_ms(k * (alpha + beta * mg['file_bytes']))}", verdict(None)])
    rows.append(["local Ray, 2 actors", "not measured: steps run on local lanes only", ray_line(), verdict(None)])
    print_table("the final merge against the all-reduce model (a, b: a partial file written, read back and merged)",
                ["figure", "measured", "compared with", "result"], rows, right=[False, True, False, False])
    return alpha, beta, m


def barrier_pairs(root: Path, nb: int, pairs: int) -> list[dict[str, Any]]:
    """The barrier job as steps and as three separate jobs, alternating which goes first, ``pairs`` times."""
    out = []
    for i in range(pairs):
        pair: dict[str, Any] = {}
        for way in ("steps", "separate") if i % 2 == 0 else ("separate", "steps"):
            if way == "steps":
                pair["steps_wall_s"], pair["steps_rep"] = barrier_steps(root, nb)
            else:
                pair["separate_wall_s"], pair["separate_s"], pair["separate_result"] = barrier_separate(root, nb)
        out.append(pair)
    return out


def _each(values: list[float], unit: str = " s") -> str:
    return " / ".join(f"{v:.2f}" for v in values) + unit


def barrier_table(nb: int, pairs: list[dict[str, Any]]) -> list[float]:
    """Table 3: the barrier job as steps against three separate jobs; returns the ratios per pair."""
    ratios = [p["steps_wall_s"] / p["separate_wall_s"] for p in pairs]
    segs = [{s.name: s for s in p["steps_rep"].segments} for p in pairs]
    shown, sep = segs[-1]["stats"].result, pairs[-1]["separate_result"]  # the report's values: all 16
    diff = max(float(np.max(np.abs(np.asarray(shown[key]) - np.asarray(sep[key])))) for key in ("mean", "std"))
    rows = [
        ["map -> reduce -> map as steps (run_steps), per pair", _each([p["steps_wall_s"] for p in pairs]),
         f"three separate jobs: {_each([p['separate_wall_s'] for p in pairs])}", verdict(None)],
        ["steps / separate, median of pairs", f"{statistics.median(ratios):.3f}",
         f"no target; per pair {_each(ratios, '')}", verdict(None)],
    ]
    for name in ("first", "stats", "second"):
        kind = segs[0][name].kind
        rows.append([f"segment {name} ({kind}): seconds", _each([sg[name].seconds for sg in segs]),
                     f"separate job: {_each([p['separate_s'][name] for p in pairs])}", verdict(None)])
        rows.append([f"segment {name}: barrier_wait_s", _each([sg[name].barrier_wait_s for sg in segs]), "",
                     verdict(None)])
    rows += [
        ["runner's own time (elapsed - segments' seconds)",
         _each([(p["steps_rep"].elapsed_s - sum(s.seconds for s in p["steps_rep"].segments)) * 1e3 for p in pairs],
               " ms"),
         "separate: wall - jobs' seconds "
         + _each([(p["separate_wall_s"] - sum(p["separate_s"].values())) * 1e3 for p in pairs], " ms"), verdict(None)],
        ["critical path", _each([p["steps_rep"].critical_path_s for p in pairs]),
         " -> ".join(pairs[0]["steps_rep"].critical_path), verdict(None)],
        ["stats' result: steps against separate (max abs diff)", f"{diff:.2g}", "0 expected (the same partials)",
         verdict(None)],
        ["straggler profile", "not built", "speculative backups do not exist yet", verdict(None)],
    ]
    print_table(f"barrier: map -> reduce -> map over {nb:,} tasks of float32 {SHAPE}, batch {BATCH}, 1 lane, "
                f"npy outputs between steps; {len(pairs)} pair{'s' if len(pairs) > 1 else ''}"
                f"{', alternating which runs first' if len(pairs) > 1 else ', steps first'}",
                ["figure", "measured", "compared with", "result"], rows, right=[False, True, False, False])
    return ratios


# -- main -------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100,000 tasks for the reduce, 20,000 for the barrier")
    ap.add_argument("--tasks", type=int, help="tasks of the reduce (default 1,000,000; --quick 100,000)")
    ap.add_argument("--barrier-tasks", type=int, help="tasks of the barrier job (default 200,000; --quick 20,000)")
    ap.add_argument("--pairs", type=int, help="barrier runs each way, alternating (default 1)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    n = args.tasks or (100_000 if args.quick else 1_000_000)
    nb = args.barrier_tasks or (20_000 if args.quick else 200_000)
    n_pairs = args.pairs or 1
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wd-bench-steps-") as tmp:
        root = Path(tmp)
        reduce_run(root, 20_000, 1)  # warm-up: imports, first allocations
        map_run(root, 20_000, 1)
        runs = {}
        for lanes in LANES:  # map-only first, then the reduce, at each lane count
            runs[lanes] = {"map": map_run(root, n, lanes), "reduce": reduce_run(root, n, lanes)}
        tiny = message_cost(root, 1, 200)
        big = message_cost(root, BIG_VALUES, 5)
        per_batch = sink_per_batch(root, 20)
        pairs = barrier_pairs(root, nb, n_pairs)
    load_after = os.getloadavg()
    reduce_table(n, runs)
    print()
    alpha, beta, m = model_table(runs, tiny, big, per_batch)
    print()
    ratios = barrier_table(nb, pairs)
    took = time.perf_counter() - t_start
    shared = " (a shared machine: above 1.5)" if max(load_before[0], load_after[0]) > 1.5 else ""
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after{shared}; {os.cpu_count()} CPUs; "
          f"{took:.0f} s in all")
    write_json(args.json, "steps", {
        "tasks": n, "barrier_tasks": nb, "shape": list(SHAPE), "batch_size": BATCH,
        "reduce": {str(k): v for k, v in runs.items()},
        "alpha_s": alpha, "beta_s_per_byte": beta, "m_bytes": m, "message_tiny": tiny, "message_big": big,
        "sink_per_batch": per_batch,
        "model_s": {str(p): allreduce_model_s(p, alpha, beta, m) for p in LANES},
        "barrier": {"ratios": ratios, "ratio": statistics.median(ratios), "pairs": [
            {"steps_wall_s": p["steps_wall_s"], "separate_wall_s": p["separate_wall_s"], "separate_s": p["separate_s"],
             "steps_elapsed_s": p["steps_rep"].elapsed_s,
             "segments": {s.name: {"seconds": s.seconds, "barrier_wait_s": s.barrier_wait_s}
                          for s in p["steps_rep"].segments}} for p in pairs]},
        "load_before": load_before[0], "load_after": load_after[0],
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
