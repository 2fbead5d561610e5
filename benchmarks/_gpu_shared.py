"""The GPU benchmark's shared-slot part: slot buffers in shared memory, page-locked for the card.

What it measures (issue 31: worker processes write straight into the slots; on CuPy the shared slots
are registered as pinned so h2d reads them directly):
- copies from and to a shared-memory buffer registered with ``cudaHostRegister`` against the same
  copies from ``cudaHostAlloc`` memory (the engine's slots today) and from the shared buffer before it
  was registered (pageable), each the median of CUDA-event-timed copies (pageable: the host's clock);
- the cost of registering and unregistering a buffer, per GiB (paid once per slot, at start);
- whether an h2d from a registered buffer is asynchronous (the enqueue returns long before the copy
  ends), as it must be for the lanes to overlap;
- correctness across processes: two spawned worker processes attach to a registered 64 MiB slot by
  name and each writes half its rows from its own seed; the h2d'd bytes on the card must equal what
  the parent regenerates from the seeds, in two rounds (the second over the first, with the workers'
  mappings still open), after the slot was poisoned;
- the engine with every host slot in registered shared memory against the engine as it is, on the
  balanced workload (k = 2), batches/s and device busy, back to back on the same card.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import _gpu_work
import numpy as np

from warpdeck.engine.backends.cupy_backend import CupyBackend
from warpdeck.engine.backends.shared_memory import SharedArena, SharedBuffer, attach

GB = 1e9
ROWS = 64
ROW_ELEMS = 256 * 1024  # one float32 (256, 1024) task per row: 1 MiB


class SharedSlotsCupy(CupyBackend):
    """The CuPy backend with every host slot buffer in ``arena``, registered for the device."""

    def __init__(self, arena: SharedArena) -> None:
        super().__init__(0, "benchmark: host slots in registered shared memory")
        self.arena = arena

    def host_buffer(self, nbytes: int) -> Any:
        return self.shared_host_buffer(self.arena, nbytes).array


def copies(cp: Any, backend: CupyBackend, arena: SharedArena, sizes: tuple[int, ...], reps: int) -> dict[str, Any]:
    """GB/s of h2d and d2h for cudaHostAlloc, registered shared and pageable shared buffers."""
    s = cp.cuda.Stream(non_blocking=True)
    out: dict[str, Any] = {}
    for n in sizes:
        out.update(_copies_of(cp, backend, arena, s, n, reps))
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
    return out


def _copies_of(cp: Any, backend: CupyBackend, arena: SharedArena, s: Any, n: int, reps: int) -> dict[str, Any]:
    import gpu  # noqa: PLC0415 - gpu.py imports this module: its timers, once it has loaded

    _events, _wall = gpu._event_median, gpu._wall_median
    tag = f"{n >> 20}MiB"
    out: dict[str, Any] = {}
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(n), np.uint8, n)
    plain = arena.allocate(n)  # shared, not registered: pageable to CUDA
    t = time.perf_counter()
    shared = backend.shared_host_buffer(arena, n)
    out[f"register_s_per_gib_{tag}"] = (time.perf_counter() - t) / (n / 2**30)
    pattern = (np.arange(n, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)  # never zeros
    for a in (pinned, plain.array, shared.array):
        a[:] = pattern
    dev = cp.empty(n, cp.uint8)
    for label, host in (("pinned", pinned), ("shared_registered", shared.array)):
        out[f"h2d_{label}_{tag}"] = n / _events(cp, s, lambda h=host: dev.set(h, stream=s), reps) / GB
        out[f"d2h_{label}_{tag}"] = n / _events(cp, s, lambda h=host: dev.get(stream=s, out=h, blocking=False),
                                                reps) / GB
    dev.set(pattern, stream=s)
    out[f"h2d_shared_pageable_{tag}"] = n / _wall(s, lambda: dev.set(plain.array, stream=s), reps) / GB
    # Asynchronous: the enqueue of a registered h2d returns well before the copy is done.
    s.synchronize()
    t = time.perf_counter()
    dev.set(shared.array, stream=s)
    out[f"h2d_registered_enqueue_ms_{tag}"] = (time.perf_counter() - t) * 1e3
    s.synchronize()
    out[f"h2d_registered_copy_ms_{tag}"] = n / out[f"h2d_shared_registered_{tag}"] / GB * 1e3
    out[f"copied_ok_{tag}"] = bool((dev[:4096].get() == pattern[:4096]).all())
    t = time.perf_counter()
    arena.release(shared)  # unregisters, then unmaps
    out[f"unregister_s_per_gib_{tag}"] = (time.perf_counter() - t) / (n / 2**30)
    arena.release(plain)
    return out


def _write_rows(path: str, nbytes: int, rows: tuple[int, int], seed: int, go: Any, done: Any) -> None:
    """A worker process: attach to the slot, and once ``go[round]`` is set, write rows [a, b) from
    ``seed + round``; say ``done``."""
    slot = attach(path, nbytes).view(np.float32).reshape(ROWS, ROW_ELEMS)
    for rnd in range(2):
        go[rnd].wait()
        rng = np.random.default_rng(seed + rnd)
        slot[rows[0]:rows[1]] = rng.standard_normal((rows[1] - rows[0], ROW_ELEMS), dtype=np.float32)
        done.release()


def cross_process(cp: Any, backend: CupyBackend, arena: SharedArena) -> dict[str, Any]:
    """Two spawned processes write a registered slot; the card must read exactly their bytes."""
    nbytes = ROWS * ROW_ELEMS * 4
    buf: SharedBuffer = backend.shared_host_buffer(arena, nbytes)
    host = buf.array.view(np.float32).reshape(ROWS, ROW_ELEMS)
    dev = cp.empty((ROWS, ROW_ELEMS), cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    ctx = mp.get_context("spawn")
    seeds = [int(time.time_ns() % 2**30), int(time.time_ns() % 2**30) + 7919]
    halves = [(0, ROWS // 2), (ROWS // 2, ROWS)]
    gos = [ctx.Event(), ctx.Event()]  # one per round
    done = ctx.Semaphore(0)
    procs = [ctx.Process(target=_write_rows, args=(str(buf.path), nbytes, halves[i], seeds[i], gos, done))
             for i in range(2)]
    for p in procs:
        p.start()
    res: dict[str, Any] = {"rounds": []}
    try:
        for rnd in range(2):
            host.view(np.uint8)[:] = 0xFF  # poison: a row nobody wrote stays NaN
            gos[rnd].set()
            for _ in procs:
                if not done.acquire(timeout=60):
                    raise TimeoutError("a worker process did not write its rows")
            dev.set(host, stream=s)
            s.synchronize()
            want = np.concatenate([np.random.default_rng(seeds[i] + rnd).standard_normal(
                (b - a, ROW_ELEMS), dtype=np.float32) for i, (a, b) in enumerate(halves)])
            got = cp.asnumpy(dev)
            res["rounds"].append({"equal": bool(np.array_equal(got, want)),
                                  "nan": int(np.isnan(got).sum()), "rows": ROWS})
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        arena.release(buf)
    res["ok"] = all(r["equal"] for r in res["rounds"])
    return res


def engine_runs(cp: Any, arena: SharedArena, ceil: dict[str, Any], batches: int) -> dict[str, Any]:
    """The balanced workload, k = 2: the engine as it is, then with every host slot shared and
    registered, then as it is again (the spread between the two plain runs is the noise)."""
    from _gpu_runners import run_warpdeck  # noqa: PLC0415
    from gpu import calibrate  # noqa: PLC0415

    nbytes = 64 * ROW_ELEMS * 4
    copy_s = max(nbytes / (ceil["h2d_pinned"] * GB), 2 * nbytes / (ceil["bidir_pinned"] * GB))
    _gpu_work.ITERS, t_k = calibrate(cp, copy_s, nbytes // 4)
    res: dict[str, Any] = {"kernel_ms": t_k * 1e3, "copy_ms": copy_s * 1e3, "bound_batches_s": 1 / max(copy_s, t_k)}
    for label in ("cudaHostAlloc", "shared-registered", "cudaHostAlloc-again"):
        backend = SharedSlotsCupy(arena) if label == "shared-registered" else None
        try:
            r = run_warpdeck(cp, f"gpu-shared-{label}", batches, 64, 2, backend=backend)
        finally:
            if backend is not None:
                backend.close()
        res[label] = {k: r.get(k) for k in ("batches_s", "device_busy", "wrong_stamps", "status", "done",
                                             "loop_cpu_ms_per_batch", "bottleneck")}
        res[label]["h2d_gbs_median"] = r.get("overlap", {}).get("h2d_gbs_median")
        print(f"[shared] engine {label}: {r['batches_s']:.1f} batches/s (bound {res['bound_batches_s']:.1f}), "
              f"busy {r['device_busy']:.3f}, h2d {res[label]['h2d_gbs_median'] or 0:.1f} GB/s, "
              f"wrong stamps {r['wrong_stamps']}", flush=True)
    res["arena_bytes_after"] = arena.nbytes
    return res


def shared_part(cp: Any, ceil: dict[str, Any], batches: int, quick: bool) -> dict[str, Any]:
    with SharedArena(label="gpu-bench") as arena:
        backend = CupyBackend(0, "benchmark")
        try:
            out: dict[str, Any] = {"arena": str(arena.path)}
            out["copies"] = copies(cp, backend, arena, (64 << 20, (256 if quick else 1024) << 20), 10 if quick else 20)
            print(f"[shared] copies: {out['copies']}", flush=True)
            out["cross_process"] = cross_process(cp, backend, arena)
            print(f"[shared] cross-process: {out['cross_process']}", flush=True)
        finally:
            backend.close()
        out["engine"] = engine_runs(cp, arena, ceil, batches)
    return out


class _Sample:
    """A sink that keeps every 97th output (to check) and counts the rest."""

    def __init__(self) -> None:
        self.kept: dict[str, np.ndarray] = {}
        self.count = 0

    def write(self, key: str, arr: np.ndarray) -> None:
        self.count += 1
        if int(key[-8:]) % 97 == 0:
            self.kept[key] = np.array(arr)


def fill_processes(lines: int, workers: tuple[int | None, ...] = (None, 8), backend: str = "cupy") -> dict[str, Any]:
    """The tokens example (pure-Python tokenising per line) on CuPy: fills on threads, in worker
    processes writing registered shared slots, and the default ``auto`` (the tuner's choice); the
    vectors checked against the example's own float64 reference on every 97th line."""
    import asyncio  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from warpdeck.engine.api import Engine, load_spec  # noqa: PLC0415
    from warpdeck.examples import tokens  # noqa: PLC0415

    out: dict[str, Any] = {"lines": lines}
    with tempfile.TemporaryDirectory() as tmp:
        text = tokens.make_lines(Path(tmp) / "lines.txt", lines, seed=int(time.time()) % 1000)
        all_lines = text.read_text(encoding="utf-8").splitlines()
        base = load_spec(Path(__file__).resolve().parents[1] / "examples" / "tokens-lines.toml")
        for pool in ("threads", "processes", "auto"):
            for n in (workers if pool != "auto" else (None,)):
                host = base.host.model_copy(update={"fill_pool": pool, "fill_workers": n})
                spec = base.model_copy(update={
                    "backend": backend, "host": host,
                    "source": base.source.model_copy(update={"options": {"path": str(text)}})})
                sink = _Sample()

                async def go(spec: Any = spec, sink: _Sample = sink) -> Any:
                    async with Engine(spec, sink=sink) as eng:
                        return await eng.wait()

                t = time.perf_counter()
                report = asyncio.run(go())
                wall = time.perf_counter() - t
                worst = max(float(np.abs(v - tokens.reference(all_lines[int(k[-8:])])).max())
                            for k, v in sink.kept.items())
                label = f"{pool}-{n or 'tuned'}"
                out[label] = {"tasks_s": report.counts.done / wall, "steady_tasks_s": report.steady_tasks_s,
                              "done": report.counts.done, "failed": report.counts.failed,
                              "device_busy": report.device_busy, "bottleneck": report.bottleneck,
                              "host_threads": report.host_threads, "host_processes": report.host_processes,
                              "checked": len(sink.kept), "max_abs_error": worst,
                              "mean_phase_ms": {k: v * 1e3 for k, v in report.mean_phase_s.items()}}
                print(f"[fill] {label}: {out[label]['tasks_s']:.0f} lines/s (steady {report.steady_tasks_s:.0f}), "
                      f"done {report.counts.done}, checked {len(sink.kept)} max error {worst:.2e}; "
                      f"{report.bottleneck}", flush=True)
    return out
