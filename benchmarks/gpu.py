"""GPU: the CuPy path on a real card, against the card's own measured limits, in one run.

Needs a CUDA device, CuPy and PyTorch (with CUDA). Parts, in this order (``--parts`` picks some):

  env       the card, driver, CUDA, CuPy and torch versions, PCIe link
  ceilings  pinned h2d and d2h (large copies, and one batch's size), both at once on two streams,
            device-to-device (bytes read + written), pageable h2d and d2h for contrast
  shared    slot buffers in shared memory registered as pinned (cudaHostRegister), which worker
            processes write directly: copies from them against cudaHostAlloc and pageable memory, the
            registration's cost, two spawned processes writing a slot the card then reads (compared
            with their seeds), and the engine's balanced run with every host slot shared and
            registered against the engine as it is (benchmarks/_gpu_shared.py)
  fill      the tokens example (each line tokenised in pure Python by a user load function) on CuPy:
            fills on threads against fills in worker processes writing registered shared slots, tuned
            and at 8; every 97th line's vector checked against the example's float64 reference
  figures   three workloads, each a float32 (256, 1024) task (1 MiB) in batches of 64 (64 MiB in and
            64 MiB out per batch) and a kernel calibrated to a share of one batch's copy time:
              transfer-bound  compute 0.25x the copy      balanced  compute 1x the copy
              compute-bound   compute 3x the copy
            each run by: a naive synchronous CuPy loop; a hand-tuned PyTorch DataLoader loop (pinned,
            non_blocking, h2d prefetched on a side stream, d2h on a third; num_workers 0 and 2, the
            faster kept); warpdeck with slot_depth k = 2 and k = 3 (auto depth off, host threads tuned).
            Bound: 1 / the slowest of (h2d, d2h, both copies at once, the kernel) per batch, each
            from the measured ceilings and the kernel's own time; rate: steady state, the sink's
            stamps from the first batch done to the last; busy: the kernels' share of the time from
            the first to the last, from CUDA events. The kernel's time is the fastest median the card
            showed for it (alone or inside a runner's loop). The balanced k = 2 run also writes --trace.
  scaling   the balanced workload at 64, 128 and 256 tasks per batch (one batch's device work from
            about 1.5 to 6 ms): the DataLoader loop and warpdeck k = 2, with the CPU the engine's event
            loop spends per batch: where the engine's own per-batch cost meets the device's
  loop      the balanced workload (64 tasks a batch) through warpdeck k = 2, as it is and with the
            garbage collector's existing objects frozen (gc.freeze, as `warpdeck run` does after start):
            the event loop's CPU per batch in the steady state
  correct   every synthetic example and the torch classifier on CuPy (buffers poisoned with NaN)
            against NumPy, on fresh random inputs: ||gpu - cpu|| / ||cpu||
  nvml      the heartbeat's NVML sampler beside nvidia-smi under load, and the device figures a run's
            own heartbeats carry (control plane on, embedded broker)
  trace     `warpdeck run examples/dense-synthetic.toml --headless --backend cupy --trace`
  tests     pytest -m gpu over tests/gpu, tests/engine/test_cupy_timing.py, tests/engine/test_torch_stages.py
  advise    `warpdeck advise examples/dense-synthetic.toml` (calibrates NumPy and CuPy: the payoff)

Targets (DESIGN.md, issue 27): pinned h2d >= 90 % of the measured pinned peak (the h2d warpdeck's
batches reach, from their CUDA events); warpdeck >= 0.95 of the bound and >= 1.8x the naive loop
on the balanced workload; ahead of the DataLoader on all three workloads.

    python benchmarks/gpu.py [--quick] [--parts a,b] [--batches N] [--out DIR] [--json PATH]

Results go to DIR (default $OUT, else ./gpu-out): gpu.json (every figure, written after each part)
and the balanced run's trace. The table is printed last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _gpu_shared
import _gpu_work
import numpy as np
from _common import print_table, verdict, write_json

PARTS = ("env", "ceilings", "shared", "fill", "figures", "scaling", "loop", "correct", "nvml", "trace", "tests",
         "advise")
BATCH = 64
WORKLOADS = {"transfer-bound": 0.25, "balanced": 1.0, "compute-bound": 3.0}
"""Compute time per batch as a share of one batch's copy time, per workload."""
DL_WORKERS = (0, 2)
DEPTHS = (2, 3)
GB = 1e9


def _cp() -> Any:
    import cupy  # noqa: PLC0415 - only on a machine with a device

    return cupy


# -- ceilings ---------------------------------------------------------------------------------------
def _event_median(cp: Any, stream: Any, fn: Callable[[], None], reps: int) -> float:
    """Median seconds of ``fn``'s work on ``stream``, from CUDA events, after two warm-up calls."""
    for _ in range(2):
        fn()
    stream.synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return statistics.median(times)


def _wall_median(stream: Any, fn: Callable[[], None], reps: int) -> float:
    """Median wall seconds of ``fn`` until ``stream`` is idle (a pageable copy is timed this way:
    the host takes part in it)."""
    for _ in range(2):
        fn()
        stream.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        stream.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def ceilings(cp: Any, big: int, batch_bytes: int, reps: int) -> dict[str, Any]:
    """Copy ceilings in GB/s (1e9 bytes/s); the buffers are freed afterwards."""
    try:
        return _ceilings(cp, big, batch_bytes, reps)
    finally:
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


def _ceilings(cp: Any, big: int, batch_bytes: int, reps: int) -> dict[str, Any]:
    s, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    pattern = (np.arange(big, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)  # never zeros
    pin_a = np.frombuffer(cp.cuda.alloc_pinned_memory(big), np.uint8, big)
    pin_b = np.frombuffer(cp.cuda.alloc_pinned_memory(big), np.uint8, big)
    pin_a[:] = pattern
    page_a, page_b = pattern.copy(), np.empty_like(pattern)
    dev_a, dev_b = cp.empty(big, cp.uint8), cp.empty(big, cp.uint8)
    dev_b.set(pin_a)
    out: dict[str, Any] = {"bytes": big, "batch_bytes": batch_bytes}
    for n, tag in ((big, ""), (batch_bytes, "_batch")):
        src, dst = pin_a[:n], dev_a[:n]
        out[f"h2d_pinned{tag}"] = n / _event_median(cp, s, lambda src=src, dst=dst: dst.set(src, stream=s), reps) / GB
        d_src, p_dst = dev_b[:n], pin_b[:n]
        out[f"d2h_pinned{tag}"] = n / _event_median(
            cp, s, lambda d_src=d_src, p_dst=p_dst: d_src.get(stream=s, out=p_dst, blocking=False), reps) / GB

    def both() -> None:
        start = cp.cuda.Event()
        start.record(s)
        s2.wait_event(start)
        dev_a.set(pin_a, stream=s)
        dev_b.get(stream=s2, out=pin_b, blocking=False)
        joined = cp.cuda.Event()
        joined.record(s2)
        s.wait_event(joined)

    out["bidir_pinned"] = 2 * big / _event_median(cp, s, both, reps) / GB
    out["d2d"] = 2 * big / _event_median(cp, s, lambda: dev_a.data.copy_from_device_async(dev_b.data, big, s),
                                         reps) / GB
    out["h2d_pageable"] = big / _wall_median(s, lambda: dev_a.set(page_a, stream=s), reps) / GB
    out["d2h_pageable"] = big / _wall_median(s, lambda: dev_b.get(stream=s, out=page_b), reps) / GB
    out["h2d_pinned_wall"] = big / _wall_median(s, lambda: dev_a.set(pin_a, stream=s), reps) / GB
    ok = bool((dev_a[:4096].get() == pattern[:4096]).all())  # the copies moved the bytes
    return {**out, "copied_ok": ok}


# -- the kernel -------------------------------------------------------------------------------------
def kernel_seconds(cp: Any, iters: int, elements: int, reps: int = 7) -> float:
    """Median seconds of the benchmark kernel at ``iters`` over ``elements`` float32 (device-resident)."""
    x = cp.random.standard_normal(elements, dtype=cp.float32)
    y = cp.empty_like(x)
    k = _gpu_work.fma_kernel(cp)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        t = _event_median(cp, s, lambda: k(x, np.float32(1), np.float32(0), np.int32(iters), y), reps)
    assert bool(cp.array_equal(x, y)), "the kernel must return its input exactly (a = 1, b = 0)"
    return t


def calibrate(cp: Any, target_s: float, elements: int) -> tuple[int, float]:
    """The iteration count whose kernel takes ``target_s`` on one batch, and its measured time."""
    t0, t1 = kernel_seconds(cp, 0, elements), kernel_seconds(cp, 256, elements)
    per = max((t1 - t0) / 256, 1e-12)
    iters = max(0, round((target_s - t0) / per))
    return iters, kernel_seconds(cp, iters, elements)


# -- figures ----------------------------------------------------------------------------------------
def figures(cp: Any, ceil: dict[str, Any], batches: int, out: Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - the DataLoader runner
    from _gpu_runners import run_dataloader, run_naive, run_warpdeck  # noqa: PLC0415

    in_b = out_b = BATCH * int(np.prod(_gpu_work.TASK_SHAPE)) * 4
    t_h2d = in_b / (ceil["h2d_pinned"] * GB)
    t_d2h = out_b / (ceil["d2h_pinned"] * GB)
    t_both = (in_b + out_b) / (ceil["bidir_pinned"] * GB)
    copy_s = max(t_h2d, t_d2h, t_both)
    res: dict[str, Any] = {}
    for name, share in WORKLOADS.items():
        iters, t_k = calibrate(cp, share * copy_s, in_b // 4)
        _gpu_work.ITERS = iters
        bound = 1 / max(copy_s, t_k)
        w: dict[str, Any] = {"iters": iters, "kernel_ms": t_k * 1e3, "h2d_ms": t_h2d * 1e3, "d2h_ms": t_d2h * 1e3,
                             "both_copies_ms": t_both * 1e3, "bound_batches_s": bound}
        print(f"[figures] {name}: kernel {t_k * 1e3:.3f} ms at {iters} iterations, copies {copy_s * 1e3:.3f} ms, "
              f"bound {bound:.1f} batches/s", flush=True)
        for label, fn in (
            ("naive", lambda: run_naive(cp, max(20, batches // 4), BATCH)),
            *((f"dataloader-{nw}", lambda nw=nw: run_dataloader(cp, torch, batches, BATCH, nw)) for nw in DL_WORKERS),
            *((f"warpdeck-k{k}", lambda k=k, name=name: run_warpdeck(
                cp, f"gpu-{name}-k{k}", batches, BATCH, k,
                trace=out / "trace-balanced-k2.json" if (name, k) == ("balanced", 2) else None)) for k in DEPTHS),
        ):
            try:
                r = fn()
            except Exception:  # noqa: BLE001 - one runner's failure is reported, the others still run
                r = {"error": traceback.format_exc()}
            if "batches_s" in r:
                r["of_bound"] = r["batches_s"] / bound
            w[label] = r
            print(f"[figures] {name} {label}: " + (
                f"{r['batches_s']:.1f} batches/s ({r['of_bound']:.3f} of bound), busy {r['device_busy']:.3f}, "
                f"wrong stamps {r['wrong_stamps']}" if "batches_s" in r else r["error"]), flush=True)
        # The kernel ran a little faster inside some loops than alone (clocks): the bound takes the
        # fastest median the card showed, so that no runner is judged above 1.
        medians = [r["kernel_median_ms"] / 1e3 for r in w.values() if isinstance(r, dict) and r.get("kernel_median_ms")]
        w["kernel_best_ms"] = min([t_k, *medians]) * 1e3
        bound = w["bound_batches_s"] = 1 / max(copy_s, w["kernel_best_ms"] / 1e3)
        for r in w.values():
            if isinstance(r, dict) and "batches_s" in r:
                r["of_bound"] = r["batches_s"] / bound
        dls = [w[f"dataloader-{nw}"] for nw in DL_WORKERS if "batches_s" in w[f"dataloader-{nw}"]]
        w["dataloader"] = max(dls, key=lambda r: r["batches_s"]) if dls else {}
        res[name] = w
    return res


def scaling(cp: Any, ceil: dict[str, Any], batches: int, sizes: tuple[int, ...] = (64, 128, 256)) -> dict[str, Any]:
    """The balanced workload at several batch sizes: DataLoader (no workers) and warpdeck k = 2."""
    import torch  # noqa: PLC0415
    from _gpu_runners import run_dataloader, run_warpdeck  # noqa: PLC0415

    res: dict[str, Any] = {}
    for batch in sizes:
        nbytes = batch * int(np.prod(_gpu_work.TASK_SHAPE)) * 4
        copy_s = max(nbytes / (ceil["h2d_pinned"] * GB), 2 * nbytes / (ceil["bidir_pinned"] * GB))
        iters, t_k = calibrate(cp, copy_s, nbytes // 4)
        _gpu_work.ITERS = iters
        w: dict[str, Any] = {"iters": iters, "kernel_ms": t_k * 1e3, "copy_ms": copy_s * 1e3}
        for label, fn in (("dataloader-0", lambda b=batch: run_dataloader(cp, torch, batches, b, 0)),
                          ("warpdeck-k2", lambda b=batch: run_warpdeck(cp, f"gpu-scale-{b}", batches, b, 2))):
            try:
                w[label] = fn()
            except Exception:  # noqa: BLE001
                w[label] = {"error": traceback.format_exc()}
        medians = [r["kernel_median_ms"] / 1e3 for r in w.values() if isinstance(r, dict) and r.get("kernel_median_ms")]
        bound = w["bound_batches_s"] = 1 / max(copy_s, min([t_k, *medians]))
        for r in w.values():
            if isinstance(r, dict) and "batches_s" in r:
                r["of_bound"] = r["batches_s"] / bound
        wd = w["warpdeck-k2"]
        print(f"[scaling] batch {batch}: bound {bound:.1f}/s; dataloader {w['dataloader-0'].get('of_bound', 0):.3f}; "
              f"warpdeck {wd.get('of_bound', 0):.3f} of bound, loop CPU {wd.get('loop_cpu_ms_per_batch', 0):.2f} ms "
              f"and process CPU {wd.get('process_cpu_ms_per_batch', 0):.2f} ms per batch", flush=True)
        res[str(batch)] = w
    return res


def loop_part(cp: Any, ceil: dict[str, Any], batches: int) -> dict[str, Any]:
    """warpdeck k = 2 on the balanced workload, with and without gc.freeze(): the loop's CPU."""
    from _gpu_runners import run_warpdeck  # noqa: PLC0415

    nbytes = BATCH * int(np.prod(_gpu_work.TASK_SHAPE)) * 4
    copy_s = max(nbytes / (ceil["h2d_pinned"] * GB), 2 * nbytes / (ceil["bidir_pinned"] * GB))
    _gpu_work.ITERS, t_k = calibrate(cp, copy_s, nbytes // 4)
    res: dict[str, Any] = {"kernel_ms": t_k * 1e3, "copy_ms": copy_s * 1e3}
    for label in ("as-is", "gc-frozen", "as-is-again"):
        if label == "gc-frozen":
            gc.freeze()
        r = run_warpdeck(cp, f"gpu-loop-{label}", batches, BATCH, 2)
        if label == "gc-frozen":
            gc.unfreeze()
        res[label] = {k: r.get(k) for k in ("batches_s", "device_busy", "loop_cpu_ms_per_batch",
                                             "process_cpu_ms_per_batch", "wall_ms_per_batch", "bottleneck")}
        print(f"[loop] {label}: {r['batches_s']:.1f} batches/s (bound {1 / max(copy_s, t_k):.1f}), loop CPU "
              f"{r.get('loop_cpu_ms_per_batch', 0):.3f} ms / wall {r.get('wall_ms_per_batch', 0):.3f} ms per batch, "
              f"process CPU {r.get('process_cpu_ms_per_batch', 0):.3f} ms", flush=True)
    return res


# -- orchestration ----------------------------------------------------------------------------------
def env_part(cp: Any) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    from _gpu_checks import smi  # noqa: PLC0415

    keys = ("name", "driver_version", "memory.total", "pcie.link.gen.current", "pcie.link.gen.max",
            "pcie.link.width.current", "power.limit", "clocks.max.sm")
    vals = smi(",".join(keys))
    return {**dict(zip(keys, vals, strict=False)), "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "cuda_driver": cp.cuda.runtime.driverGetVersion(), "cupy": cp.__version__, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "numpy": np.__version__, "python": platform.python_version(),
            "cpus": os.cpu_count()}


def tests_part(timeout: float) -> dict[str, Any]:
    from _gpu_checks import command  # noqa: PLC0415

    return command(["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
                    "tests/gpu", "tests/engine/test_cupy_timing.py", "tests/engine/test_torch_stages.py"],
                   timeout=timeout)


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def summary(res: dict[str, Any]) -> None:
    env = res.get("env", {})
    print(f"\ndevice: {env.get('name', '?')}, driver {env.get('driver_version', '?')}, CUDA runtime "
          f"{env.get('cuda_runtime', '?')}, CuPy {env.get('cupy', '?')}, torch {env.get('torch', '?')}, "
          f"PCIe gen {env.get('pcie.link.gen.current', '?')} x{env.get('pcie.link.width.current', '?')}")
    c = res.get("ceilings", {})
    if "h2d_pinned" in c:
        print_table("ceilings (GB/s)", ["copy", "GB/s"], [
            ["h2d pinned (1 GiB / one batch)", f"{c['h2d_pinned']:.1f} / {c['h2d_pinned_batch']:.1f}"],
            ["d2h pinned (1 GiB / one batch)", f"{c['d2h_pinned']:.1f} / {c['d2h_pinned_batch']:.1f}"],
            ["h2d + d2h at once, pinned", f"{c['bidir_pinned']:.1f}"],
            ["device to device (read + write)", f"{c['d2d']:.1f}"],
            ["h2d / d2h pageable", f"{c['h2d_pageable']:.1f} / {c['d2h_pageable']:.1f}"],
        ])
    rows = []
    for name, w in res.get("figures", {}).items():
        if not isinstance(w, dict) or "bound_batches_s" not in w:
            continue
        naive, dl = w.get("naive", {}), w.get("dataloader", {})
        for label in ("naive", "dataloader", *(f"warpdeck-k{k}" for k in DEPTHS)):
            r = w.get(label, {})
            if "batches_s" not in r:
                rows.append([name, label, "error", "", "", "", "", ""])
                continue
            wd = label.startswith("warpdeck")
            vs_naive = r["batches_s"] / naive["batches_s"] if wd and naive.get("batches_s") else None
            vs_dl = r["batches_s"] / dl["batches_s"] if wd and dl.get("batches_s") else None
            target = (r["of_bound"] >= 0.95 and (vs_naive or 0) >= 1.8) if wd and name == "balanced" else None
            rows.append([name, label + (f" ({r['workers']} workers)" if "workers" in r else ""),
                         f"{r['batches_s']:.1f}", f"{r['of_bound']:.3f}", f"{r['device_busy']:.3f}",
                         _fmt(vs_naive, ".2f"), _fmt(vs_dl, ".3f"),
                         verdict(target if target is not None else ((vs_dl >= 1.0) if vs_dl is not None else None))])
    if rows:
        print_table("figures (batches of 64 MiB in, 64 MiB out)",
                    ["workload", "runner", "batches/s", "of bound", "busy", "x naive", "/ dataloader", "target"], rows)
        bal = res["figures"].get("balanced", {}).get("warpdeck-k2", {}).get("overlap", {})
        if bal:
            h2d = bal["h2d_gbs_median"] / c.get("h2d_pinned", float("nan"))
            print(f"h2d inside warpdeck (balanced, k=2): {bal['h2d_gbs_median']:.1f} GB/s = {h2d:.3f} of the pinned "
                  f"peak {verdict(h2d >= 0.90)}; h2d of n+1 beside compute of n in "
                  f"{bal['h2d_next_overlaps_compute']:.2f} of batches, d2h of n-1 in "
                  f"{bal['d2h_prev_overlaps_compute']:.2f}; kernel gaps median {bal['gap_median_us']:.0f} us")
    sh = res.get("shared", {})
    if "copies" in sh:
        cp_ = sh["copies"]

        def pair(a: str, b: str, scale: float = 1.0, spec: str = ".1f") -> str:
            return f"{cp_.get(a, 0) * scale:{spec}} / {cp_.get(b, 0) * scale:{spec}}"

        rows = [[size, pair(f"h2d_pinned_{size}", f"d2h_pinned_{size}"),
                 pair(f"h2d_shared_registered_{size}", f"d2h_shared_registered_{size}"),
                 f"{cp_.get(f'h2d_shared_pageable_{size}', 0):.1f}",
                 pair(f"register_s_per_gib_{size}", f"unregister_s_per_gib_{size}", 1e3, ".0f"),
                 pair(f"h2d_registered_enqueue_ms_{size}", f"h2d_registered_copy_ms_{size}", 1.0, ".3f")]
                for size in sorted({k.rsplit("_", 1)[1] for k in cp_ if k.startswith("h2d_pinned_")})]
        print_table("shared slots (GB/s)", ["size", "cudaHostAlloc h2d / d2h", "shared registered h2d / d2h",
                                           "shared pageable h2d", "register / unregister ms per GiB",
                                           "registered h2d enqueue / copy ms"], rows)
    if "cross_process" in sh:
        print(f"shared: two worker processes wrote a registered slot the card read: {sh['cross_process']}")
    for label, r in sh.get("engine", {}).items():
        if isinstance(r, dict):
            print(f"shared: engine {label}: {r.get('batches_s') or 0:.1f} batches/s of bound "
                  f"{sh['engine']['bound_batches_s']:.1f}, busy {r.get('device_busy') or 0:.3f}, "
                  f"h2d {r.get('h2d_gbs_median') or 0:.1f} GB/s, wrong stamps {r.get('wrong_stamps')}")
    for part in ("correct", "nvml", "trace", "advise", "tests"):
        if part in res:
            print(f"{part}: {json.dumps(res[part], default=str)[:1500]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer batches and smaller ceilings")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--batches", type=int, help="batches per runner (default 300, --quick 80)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-out"))
    ap.add_argument("--json", metavar="PATH", help="also save the figures here (benchmarks' common format)")
    ap.add_argument("--fill-workers", default="tuned,8",
                    help="the fill part's worker counts, comma-separated ('tuned': the tuner's)")
    ap.add_argument("--budget-s", type=float, default=1e9,
                    help="start no part after this many seconds (a lease's time is short: the table still prints)")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts: {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    batches = args.batches or (80 if args.quick else 300)
    cp = _cp()
    res: dict[str, Any] = {"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    from _gpu_checks import (  # noqa: PLC0415 - they import the engine and, once called, torch
        SYNTHETIC,
        check_classify,
        check_heartbeat_stats,
        check_nvml,
        check_synthetic,
        command,
        traced_run,
    )

    def correct() -> dict[str, Any]:
        seed = int(time.time_ns() % 2**31)
        out = {n: check_synthetic(n, 512, seed + i) for i, n in enumerate(SYNTHETIC)}
        out["classify"] = check_classify(192, seed, tf32=False)
        out["classify_tf32"] = check_classify(192, seed + 1, tf32=True)
        return out

    def heartbeats() -> dict[str, Any]:
        # About 5 s of 15 ms batches: several heartbeats, each with the card busy.
        _gpu_work.ITERS, _ = calibrate(cp, 0.015, BATCH << 18)
        return check_heartbeat_stats("gpu-hb", 330, BATCH)

    steps: dict[str, Callable[[], Any]] = {
        "env": lambda: env_part(cp),
        "ceilings": lambda: ceilings(cp, (256 if args.quick else 1024) << 20, BATCH << 20, 10 if args.quick else 20),
        "shared": lambda: _gpu_shared.shared_part(cp, res["ceilings"], batches, args.quick),
        "fill": lambda: _gpu_shared.fill_processes(
            20_000 if args.quick else 100_000,
            tuple(None if w == "tuned" else int(w) for w in args.fill_workers.split(","))),
        "figures": lambda: figures(cp, res["ceilings"], batches, args.out),
        "scaling": lambda: scaling(cp, res["ceilings"], min(batches, 200)),
        "loop": lambda: loop_part(cp, res["ceilings"], batches),
        "correct": correct,
        "nvml": lambda: {"sampler": check_nvml(cp), "heartbeats": heartbeats()},
        "trace": lambda: traced_run(args.out),
        "advise": lambda: command(
            ["-m", "warpdeck.cli.main", "advise", "examples/dense-synthetic.toml", "--json",
             str(args.out / "advise-dense.json")], timeout=120),
        "tests": lambda: tests_part(150),
    }
    if {"figures", "scaling", "loop", "shared"} & set(parts) and "ceilings" not in parts:
        parts.insert(0, "ceilings")
    began = time.perf_counter()
    for part in parts:
        t = time.perf_counter()
        if t - began > args.budget_s:
            res[part] = {"skipped": f"past --budget-s {args.budget_s:g}"}
            print(f"[{part}] skipped: past the budget", flush=True)
            continue
        print(f"[{part}] ...", flush=True)
        try:
            res[part] = steps[part]()
        except Exception:  # noqa: BLE001 - a part's failure is kept with its traceback; the rest still run
            res[part] = {"error": traceback.format_exc()}
            print(res[part]["error"], flush=True)
        print(f"[{part}] {time.perf_counter() - t:.1f} s", flush=True)
        (args.out / "gpu.json").write_text(json.dumps(res, indent=1, default=str) + "\n", encoding="utf-8")
    summary(res)
    write_json(args.json, "gpu", res)
    return 0


if __name__ == "__main__":
    with_smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout.strip()
    print(with_smi or "nvidia-smi found no device", flush=True)
    sys.exit(main())
