"""Overlap: five three-phase workloads, each run three ways, against the device's bound.

Each batch is 32 tasks of float32 (256,). Loading a batch spends its time once inside
``Source.load`` (host fill), computing it sleeps once in the stage function (10 ms: the device),
sinking it sleeps once in the sink (on the batch's first task). ``time.sleep`` releases the GIL,
like waiting on a device or on I/O; the decode-bound profile burns CPU instead, in NumPy loops that
release the GIL as real decoders do (``_stages.CpuBurn``).

Profiles (per batch; the amounts are chosen by batch index, so several threads get the same ones):
  balanced      load 10 ms (sleep), compute 10 ms, sink 2 ms
  jittery       as balanced on average; 10 % of loads 5x slower, the rest lognormal, mean 10 ms
  load-bound    load 30 ms (sleep), compute 10 ms, sink 2 ms
  sink-bound    load 2 ms, compute 10 ms, sink 30 ms (sleep)
  gil-bound     load 30 ms of pure-Python CPU per batch (the GIL held: a user's own per-item
                ``load`` through an ``items`` source, ``_stages.gil_load``), compute 10, sink 2: only
                processes scale it; bound as decode-bound's (issue 31: >= 0.85 of it, >= the DataLoader)
  decode-bound  load 30 ms of CPU (GIL released), compute 10 ms, sink 2 ms: on 2 cores the
                device cannot be kept busy (2 cores / 30 ms = 67 batches/s at most)

Runners (same process, one full run each, same per-batch sequence):
  serial      load -> compute -> sink per batch, one thread
  warpdeck    NumPy backend, 1 lane, the spec's defaults: no host threads pinned, the autotuner on
  dataloader  torch DataLoader(batch_size=None) over a Dataset yielding whole batches, compute and
              sink in the main loop; num_workers tuned by hand: the best of 1, 2, 4, 8 (each a run)

Bound: the device's, 1 / mean compute time (measured in the serial run). decode-bound: the
core-aware bound, min(1 / compute, cores / decode CPU seconds per batch), the CPU time measured
in the serial run with ``time.thread_time`` and cores = the CPUs this process may run on.
Rate: steady state, first batch done -> last batch done, timed the same way for every runner
(the sink's stamp after a batch's last write). Device busy: compute's share of the wall time from
the first compute's start to the last one's end (warpdeck: ``report.device_busy``; the others:
``perf_counter`` around the compute call). Targets (issue 16): warpdeck's device busy >= 0.95 on
balanced, jittery and load-bound, >= 0.90 on sink-bound; rate >= 0.97 of the bound balanced, >= 0.95
jittery, >= 0.90 of the core-aware bound decode-bound; ahead of the best DataLoader everywhere.

How fast the tuner gets there (issue 31, item 5: 95 % of the run's final steady rate within 2 s or
20 batches, whichever is later): the final steady rate is the second half's; warpdeck has reached
95 % of it at the first batch from which the rest of the run, to its last batch, kept at least that
rate (a burst of batches right after the tuner adds threads does not count), timed from the
engine's start (before ``Engine`` is made) and counted in batches done before it.

    python benchmarks/overlap.py [--quick] [--batches N] [--profiles a,b] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import _stages
import numpy as np
from _common import print_table, verdict, write_json
from _stages import BatchSleepSink, CpuBurn, PyBurn, ScheduledSource

from warpdeck.engine.api import Engine, RunReport, parse_spec
from warpdeck.engine.state.batches import TaskInput

BATCH = 32
SHAPE = (256,)
LOAD_S, COMPUTE_S, SINK_S = 0.010, 0.010, 0.002
SLOW_S = 0.030  # the slow phase of load-, sink- and decode-bound: 3x compute
DL_WORKERS = (1, 2, 4, 8)
SHARED_LOAD = 1.5  # load average above which the figures are marked as taken on a shared machine
T95_S, T95_BATCHES = 2.0, 20


@dataclass(frozen=True)
class Profile:
    """One workload and what warpdeck must reach on it (None: not judged)."""

    name: str
    load_s: float
    sink_s: float
    decode: bool = False
    busy_target: float | None = None
    rate_target: float | None = None  # fraction of the bound
    gil: bool = False
    """The load holds the GIL (pure Python, through a user ``load`` function): ``_stages.PyBurn``."""


PROFILES = {p.name: p for p in (
    Profile("balanced", LOAD_S, SINK_S, busy_target=0.95, rate_target=0.97),
    Profile("jittery", LOAD_S, SINK_S, busy_target=0.95, rate_target=0.95),
    Profile("load-bound", SLOW_S, SINK_S, busy_target=0.95),
    Profile("sink-bound", 0.002, SLOW_S, busy_target=0.90),
    Profile("decode-bound", SLOW_S, SINK_S, decode=True, rate_target=0.90),
    Profile("gil-bound", SLOW_S, SINK_S, decode=True, rate_target=0.85, gil=True),
)}


def load_schedule(profile: str, n: int, seed: int) -> np.ndarray:
    """Per-batch load seconds (decode-bound: CPU seconds); the profile's mean exactly."""
    mean = PROFILES[profile].load_s
    if profile != "jittery":
        return np.full(n, mean)
    rng = np.random.default_rng(seed)
    k = max(1, round(0.10 * n))
    slow = np.zeros(n, bool)
    slow[rng.permutation(n)[:k]] = True
    out = np.empty(n)
    out[slow] = 5 * mean
    fast = rng.lognormal(0.0, 0.35, n - k)
    out[~slow] = fast * (mean * n - 5 * mean * k) / fast.sum()  # the rest keep the mean
    return out


@dataclass(frozen=True)
class Workload:
    """A profile's per-batch sequence: load amounts, how they are spent, the sink's sleep."""

    load_s: np.ndarray
    sink_s: float = SINK_S
    spend: Callable[[float], None] = time.sleep
    gil_iters: int = 0
    """GIL-bound: warpdeck loads through an ``items`` source whose ``load`` spins this many times per task
    (``_stages.gil_load``), as a user's own per-item code would; 0: the scheduled source."""

    def source(self) -> ScheduledSource:
        return ScheduledSource(self.load_s.tolist(), BATCH, SHAPE, _block(), self.spend)

    def sink(self) -> BatchSleepSink:
        return BatchSleepSink(self.sink_s, BATCH)


def steady_rate(done_at: Sequence[float]) -> float:
    """Batches/s from the first batch done to the last."""
    if len(done_at) < 2 or done_at[-1] <= done_at[0]:
        return 0.0
    return (len(done_at) - 1) / (done_at[-1] - done_at[0])


def late_rate(done_at: Sequence[float]) -> float:
    """Batches/s over the second half of the batches: once a tuner has settled (not judged)."""
    return steady_rate(done_at[len(done_at) // 2:])


def time_to_95(done_at: Sequence[float], t0: float) -> tuple[float, int] | None:
    """From when on the run kept 95 % of its final (second-half) rate to its end: seconds since
    ``t0`` and batches done before then; None when the run is too short to say."""
    final = late_rate(done_at)
    if final <= 0:
        return None
    for i in range(len(done_at) // 2):
        if steady_rate(done_at[i:]) >= 0.95 * final:
            return done_at[i] - t0, i
    return done_at[len(done_at) // 2] - t0, len(done_at) // 2  # the second half is the final rate


@dataclass
class ComputeClock:
    """The compute stage of the serial and DataLoader runners, timed: busy share of its span."""

    spans: list[tuple[float, float]] = field(default_factory=list)

    def __call__(self, inp: np.ndarray, out: np.ndarray) -> None:
        a = time.perf_counter()
        _stages.compute_sleep(np, inp, out)
        self.spans.append((a, time.perf_counter()))

    def busy(self) -> float:
        if not self.spans:
            return 0.0
        span = self.spans[-1][1] - self.spans[0][0]
        return sum(b - a for a, b in self.spans) / span if span > 0 else 0.0


def _block() -> np.ndarray:
    return np.arange(BATCH * SHAPE[0], dtype=np.float32).reshape(BATCH, *SHAPE)


def _batch_items(source: ScheduledSource, i: int) -> list[TaskInput]:
    return [TaskInput(f"t{j:08d}", source.key, j) for j in range(i * BATCH, (i + 1) * BATCH)]


def _workload(load_s: np.ndarray | Workload) -> Workload:
    return load_s if isinstance(load_s, Workload) else Workload(load_s)


# -- runners ---------------------------------------------------------------------------------------
def run_serial(load_s: np.ndarray | Workload) -> dict[str, Any]:
    """load -> compute -> sink per batch on this thread; the phases' wall and CPU means."""
    w = _workload(load_s)
    source, sink, clock = w.source(), w.sink(), ComputeClock()
    inp = np.empty((BATCH, *SHAPE), np.float32)
    out = np.empty_like(inp)
    t0 = time.perf_counter()
    spent = np.zeros(3)  # load, compute, sink: the phases as this machine really runs them
    cpu = np.zeros(3)
    for i in range(len(w.load_s)):
        items = _batch_items(source, i)
        a, ca = time.perf_counter(), time.thread_time()
        source.load(items, inp)
        b, cb = time.perf_counter(), time.thread_time()
        clock(inp, out)
        c, cc = time.perf_counter(), time.thread_time()
        for j, t in enumerate(items):
            sink.write(t.key, out[j])
        spent += (b - a, c - b, time.perf_counter() - c)
        cpu += (cb - ca, cc - cb, time.thread_time() - cc)
    means = spent / len(w.load_s)
    return {"batches_s": steady_rate(sink.done_at), "late_batches_s": late_rate(sink.done_at),
            "batches": len(sink.done_at), "device_busy": clock.busy(),
            "wall_s": time.perf_counter() - t0, "phase_means_s": means.tolist(),
            "cpu_means_s": (cpu / len(w.load_s)).tolist()}


async def _warpdeck(w: Workload, run_dir: str, journal: bool,
                    host: dict[str, Any] | None = None) -> tuple[RunReport, ScheduledSource, BatchSleepSink]:
    n = len(w.load_s)
    src: dict[str, Any] = {"kind": "synthetic", "count": n * BATCH, "shape": list(SHAPE)}  # replaced below
    if w.gil_iters:  # the user's own load function, by name: the engine may run it in processes
        src = {"kind": "items", "items": "_stages:gil_items", "load": "_stages:gil_load",
               "shape": list(SHAPE), "options": {"count": n * BATCH, "iters": w.gil_iters}}
    spec = parse_spec({  # the defaults: 1 lane, slot_depth 2, auto depth, host threads tuned
        "name": "bench-overlap", "backend": "numpy", "batch_size": BATCH, "source": src,
        "sink": {"kind": "null"},
        "stages": [{"fn": "_stages:compute_sleep"}],
        **({"host": host} if host else {}),
    })
    source, sink = w.source(), w.sink()
    if w.gil_iters:
        async with Engine(spec, run_dir, sink=sink, journal=journal) as eng:
            report = await eng.wait()
        return report, source, sink
    async with Engine(spec, run_dir, source=source, sink=sink, journal=journal) as eng:
        report = await eng.wait()
    return report, source, sink


def run_warpdeck(load_s: np.ndarray | Workload, journal: bool = True,
                 host: dict[str, Any] | None = None) -> dict[str, Any]:
    """One warpdeck run in a fresh run directory; ``journal`` off measures the engine without it;
    ``host``: a ``[host]`` section instead of the defaults (a diagnostic run)."""
    w = _workload(load_s)
    with tempfile.TemporaryDirectory(prefix="wd-bench-") as run_dir:
        t0 = time.perf_counter()
        report, source, sink = asyncio.run(_warpdeck(w, run_dir, journal, host))
        wall = time.perf_counter() - t0
    t95 = time_to_95(sink.done_at, t0)
    if report.status != "finished" or report.counts.done != len(w.load_s) * BATCH:
        raise RuntimeError(f"warpdeck run did not finish: {report.status} {report.counts}")
    if not w.gil_iters and (source.misaligned or any(b != BATCH for b in source.batch_sizes)):
        raise RuntimeError("warpdeck formed partial or misaligned batches; the sleep sequence would differ")
    return {
        "batches_s": steady_rate(sink.done_at), "late_batches_s": late_rate(sink.done_at),
        "batches": len(sink.done_at), "wall_s": wall, "device_busy": report.device_busy,
        "host_threads": report.host_threads, "bottleneck": report.bottleneck,
        "bottleneck_phase": report.bottleneck_phase, "tuning": list(report.tuning),
        "overlap_efficiency": report.overlap_efficiency, "slot_depth": report.slot_depth,
        "bound_tasks_s": report.bound_tasks_s, "steady_tasks_s": report.steady_tasks_s,
        "mean_phase_s": report.mean_phase_s, "cpu_phase_s": report.cpu_phase_s, "stall_s": report.stall_s,
        "occupancy": report.occupancy, "first_batch_s": report.first_batch_s,
        "host_processes": report.host_processes,
        "t95_s": t95[0] if t95 else None, "t95_batches": t95[1] if t95 else None,
    }


def run_dataloader(load_s: np.ndarray | Workload, workers: int = 2) -> dict[str, Any]:
    """DataLoader(num_workers=workers) yielding whole batches; compute and sink in the main loop."""
    import torch  # noqa: PLC0415 - optional (pip install torch==2.13.0, the "bench" extra)
    from torch.utils.data import DataLoader, Dataset  # noqa: PLC0415

    w = _workload(load_s)
    source = w.source()

    class Batches(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(w.load_s)

        def __getitem__(self, i: int) -> np.ndarray:
            buf = np.empty((BATCH, *SHAPE), np.float32)
            source.load(_batch_items(source, i), buf)
            return buf

    torch.set_num_threads(1)
    # More workers than cores is the point of the hand tuning (the loads wait); torch warns each time.
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    sink, clock = w.sink(), ComputeClock()
    loader = DataLoader(Batches(), batch_size=None, num_workers=workers)
    t0 = time.perf_counter()
    for i, x in enumerate(loader):
        inp = x.numpy()
        out = np.empty_like(inp)
        clock(inp, out)
        for j in range(BATCH):
            sink.write(f"t{i * BATCH + j:08d}", out[j])
    return {"batches_s": steady_rate(sink.done_at), "late_batches_s": late_rate(sink.done_at),
            "batches": len(sink.done_at), "device_busy": clock.busy(),
            "wall_s": time.perf_counter() - t0, "num_workers": workers}


def run_dataloaders(w: Workload) -> dict[str, Any]:
    """The DataLoader tuned by hand: a full run at each of DL_WORKERS, the fastest kept."""
    runs = {n: run_dataloader(w, n) for n in DL_WORKERS}
    best = max(runs, key=lambda n: runs[n]["batches_s"])
    return {**runs[best], "by_workers": {str(n): r for n, r in runs.items()}}


def run_profile(p: Profile, n: int, seed: int, burn: CpuBurn | None, have_torch: bool) -> dict[str, Any]:
    """All runners on one profile's sequence, and the bound they are judged against."""
    spend: Callable[[float], None] = burn if p.decode and burn is not None else time.sleep
    gil_iters = 0
    if p.gil:
        py = PyBurn()
        spend, gil_iters = py, py.iters(p.load_s / BATCH)
    w = Workload(load_schedule(p.name, n, seed), p.sink_s, spend, gil_iters)
    res: dict[str, Any] = {"load_mean_s": float(w.load_s.mean()), "load_max_s": float(w.load_s.max()),
                           "sink_s": p.sink_s, "decode": p.decode}
    serial = run_serial(w)
    res["serial"] = serial
    compute = serial["phase_means_s"][1]
    device = 1.0 / compute
    res["device_bound_batches_s"] = device
    if p.decode:  # the cores, not the device: decoding needs this much CPU per batch
        cores = len(os.sched_getaffinity(0))
        res["cores"] = cores
        res["decode_cpu_s"] = serial["cpu_means_s"][0]
        res["bound_batches_s"] = min(device, cores / serial["cpu_means_s"][0])
    else:
        res["bound_batches_s"] = device
    res["warpdeck"] = run_warpdeck(w)
    if p.gil:  # diagnostic, not judged: what the fill reaches pinned in processes, one per core
        res["warpdeck_processes"] = run_warpdeck(w, host={"fill_pool": "processes",
                                                          "fill_workers": len(os.sched_getaffinity(0))})
    res["dataloader"] = run_dataloaders(w) if have_torch else None
    return res


# -- the table -------------------------------------------------------------------------------------
def profile_rows(p: Profile, res: dict[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """The table's rows for one profile, and the notes printed under it."""
    bound = res["bound_batches_s"]
    bound_txt = f"{bound:.1f}" + (" (cores)" if p.decode and bound < res["device_bound_batches_s"] else "")
    rows: list[list[Any]] = []

    def row(runner: str, r: dict[str, Any], judged: str = "", value: str = "", target: str = "",
            ok: bool | None = None) -> None:
        rows.append([p.name, runner, f"{r['batches_s']:.1f}", bound_txt, f"{r['batches_s'] / bound:.3f}",
                     f"{r['device_busy']:.3f}", judged, value, target, verdict(ok)])

    def more(judged: str, value: str, target: str, ok: bool | None) -> None:
        rows.append(["", "", "", "", "", "", judged, value, target, verdict(ok)])

    row("serial", res["serial"])
    dl = res["dataloader"]
    if dl is not None:
        row(f"dataloader, {dl['num_workers']} workers", dl)
    wd = res["warpdeck"]
    judged: list[tuple[str, str, str, bool | None]] = []
    if p.busy_target is not None:
        judged.append(("device busy", f"{wd['device_busy']:.3f}", f">= {p.busy_target:.2f}",
                       wd["device_busy"] >= p.busy_target))
    frac = wd["batches_s"] / bound
    if p.rate_target is not None:
        judged.append(("of bound", f"{frac:.3f}", f">= {p.rate_target:.2f}", frac >= p.rate_target))
    if dl is not None:
        ratio = wd["batches_s"] / dl["batches_s"]
        judged.append(("/ dataloader", f"{ratio:.3f}", "> 1.00", ratio > 1.0))
    if wd["t95_s"] is None:
        judged.append(("95 % of steady", "never", f"<= {T95_S:g} s or {T95_BATCHES} batches", False))
    else:
        judged.append(("95 % of steady", f"{wd['t95_s']:.2f} s, {wd['t95_batches']} batches",
                       f"<= {T95_S:g} s or {T95_BATCHES} batches",
                       wd["t95_s"] <= T95_S or wd["t95_batches"] <= T95_BATCHES))
    first, *rest = judged or [("", "", "", None)]
    row("warpdeck (defaults)", wd, *first)
    for j in rest:
        more(*j)
    if "warpdeck_processes" in res:
        pr = res["warpdeck_processes"]
        row(f"warpdeck, fill in {len(pr['host_processes'].get('0', []))} processes (diagnostic)", pr)

    s = res["serial"]
    ms = "/".join(f"{v * 1e3:.2f}" for v in s["phase_means_s"])
    cpu = "/".join(f"{v * 1e3:.2f}" for v in s["cpu_means_s"])
    notes = [f"{p.name}: serial load/compute/sink {ms} ms wall, {cpu} ms CPU per batch; device bound "
             f"{res['device_bound_batches_s']:.1f}/s" + (
                 f", core-aware bound {res['cores']} cores / {res['decode_cpu_s'] * 1e3:.2f} ms = "
                 f"{res['cores'] / res['decode_cpu_s']:.1f}/s" if p.decode else "")]
    if dl is not None:
        by = "  ".join(f"{k}: {r['batches_s']:.1f}/s busy {r['device_busy']:.2f}" for k, r in dl["by_workers"].items())
        notes.append(f"  dataloader num_workers {by}  (best: {dl['num_workers']})")
    threads = "  ".join(f"lane {k}: fill {v['fill']} sink {v['sink']}" for k, v in wd["host_threads"].items())
    if wd.get("host_processes"):
        threads += " (fill in processes)"
    ph = " ".join(f"{k} {v * 1e3:.2f}" for k, v in wd["mean_phase_s"].items())
    st = " ".join(f"{k} {v:.2f}s" for k, v in wd["stall_s"].items() if v) or "none"
    late = " ".join(f"{k} {r['late_batches_s']:.1f}" for k, r in (("serial", s), ("dataloader", dl), ("warpdeck", wd))
                    if r is not None)
    notes += [f"  second half only (batches/s, not judged): {late}",
              f"  warpdeck: {threads}; depth {wd['slot_depth']}; engine bound {wd['bound_tasks_s'] / BATCH:.1f}/s, "
              f"overlap_efficiency {wd['overlap_efficiency']:.3f}; phase means (ms) {ph}; stalls {st}",
              f"  warpdeck {wd['bottleneck'] or 'bottleneck: (none reported)'}"]
    notes += [f"  tuner: {t}" for t in wd["tuning"][-4:]]
    return rows, notes


# -- main ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 batches per profile instead of 300")
    ap.add_argument("--batches", type=int, help="batches per profile (overrides --quick)")
    ap.add_argument("--profiles", default=",".join(PROFILES), help=f"comma-separated, of {','.join(PROFILES)}")
    ap.add_argument("--seed", type=int, default=7, help="seed of the jittery load sequence")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.profiles.split(",") if s.strip()]
    if unknown := [s for s in names if s not in PROFILES]:
        ap.error(f"unknown profile(s) {', '.join(unknown)}; choose from {', '.join(PROFILES)}")
    n = args.batches or (60 if args.quick else 300)
    _stages.COMPUTE_S = COMPUTE_S
    try:
        import torch  # noqa: F401, PLC0415
        have_torch = True
    except ImportError:
        have_torch = False
    burn = CpuBurn() if any(PROFILES[s].decode for s in names) else None

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    results: dict[str, Any] = {"batches": n, "batch_size": BATCH, "compute_s": COMPUTE_S,
                               "dataloader_workers": list(DL_WORKERS), "profiles": {},
                               "burn_pass_s": burn.pass_s if burn else None}
    rows: list[list[Any]] = []
    notes: list[str] = []
    for name in names:
        p = PROFILES[name]
        res = run_profile(p, n, args.seed, burn, have_torch)
        results["profiles"][name] = res
        r, nt = profile_rows(p, res)
        rows += r
        notes += nt
    load_after = os.getloadavg()[0]
    results.update(load_average=[load_before, load_after], wall_s=time.perf_counter() - t0)

    cores = len(os.sched_getaffinity(0))
    shared = max(load_before, load_after) > SHARED_LOAD
    print_table(
        f"overlap: {n} batches x {BATCH} tasks per profile, compute {COMPUTE_S * 1e3:g} ms per batch, {cores} cores; "
        "bound = 1 / measured compute mean (decode-bound: min of that and cores / decode CPU per batch), "
        "from the serial run; rate = steady batches/s, first batch done to last, the same for every runner",
        ["profile", "runner", "batches/s", "bound", "of bound", "busy", "judged", "measured", "target", "result"],
        rows, right=[False, False, True, True, True, True, False, True, False, False])
    for line in notes:
        print(line)
    print(f"load average {load_before:.2f} before, {load_after:.2f} after; {time.perf_counter() - t0:.0f} s"
          + (f" (shared machine: load average above {SHARED_LOAD})" if shared else ""))
    write_json(args.json, "overlap", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
