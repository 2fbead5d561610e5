"""The GPU benchmark's runners: one workload pushed through a naive CuPy loop, a hand-tuned PyTorch
DataLoader loop and warpdeck, each timed the same way (the sink's stamp after every batch) and each
with its device busy time taken from CUDA events around the kernel.

The decision this module protects: the baselines are the best a user would write by hand, not
straw men. The naive loop is what a first CuPy script does (pageable arrays, ``cp.asarray`` and
``cp.asnumpy``, every step synchronous). The DataLoader loop is the usual tuned PyTorch pattern:
pinned batches, ``non_blocking`` copies on a side stream prefetching batch n+1 while n computes
(NVIDIA's apex ``data_prefetcher``), and the output copied back on a third stream into a ring of
pinned buffers that is read one batch late, so nothing on the hot path waits for the device except
the sink reading a finished batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _gpu_work
import numpy as np
from _gpu_work import TASK_SHAPE, StampSink, StampSource, fma_kernel

from warpdeck.engine.api import (
    BatchFinished,
    BatchRecord,
    Engine,
    ExportSettings,
    exporting,
    parse_spec,
    select_backend,
)

_ONE, _ZERO = np.float32(1.0), np.float32(0.0)
_FILL, _H2D, _COMPUTE, _D2H, _SINK = range(5)
"""Index of each phase in a BatchRecord's ``phases`` (RUN_PHASES order)."""


def steady_rate(done_at: Sequence[float]) -> float:
    """Batches/s from the first batch done to the last."""
    if len(done_at) < 2 or done_at[-1] <= done_at[0]:
        return 0.0
    return (len(done_at) - 1) / (done_at[-1] - done_at[0])


def event_busy(cp: Any, spans: Sequence[tuple[Any, Any]]) -> float:
    """Compute's share of the time from the first kernel's start to the last one's end, all read
    from the CUDA events that bracket each kernel."""
    if not spans:
        return 0.0
    elapsed = cp.cuda.get_elapsed_time
    total = elapsed(spans[0][0], spans[-1][1])
    busy = sum(elapsed(a, b) for a, b in spans)
    return busy / total if total > 0 else 0.0


def event_median(cp: Any, spans: Sequence[tuple[Any, Any]]) -> float:
    """The median kernel time in seconds, from the events around each kernel."""
    return statistics.median(cp.cuda.get_elapsed_time(a, b) for a, b in spans) / 1e3 if spans else 0.0


def _result(sink: StampSink, busy: float, batches: int, kernel_s: float, **extra: Any) -> dict[str, Any]:
    return {"batches_s": steady_rate(sink.done_at), "device_busy": busy, "batches": len(sink.done_at),
            "expected_batches": batches, "tasks": sink.tasks, "wrong_stamps": sink.wrong,
            "kernel_median_ms": kernel_s * 1e3, **extra}


def _external(cp: Any, torch_stream: Any) -> Any:
    """CuPy's view of a torch stream (``Stream.from_external`` where CuPy has it: CuPy 14)."""
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:
        with contextlib.suppress(TypeError, AttributeError):
            return from_external(torch_stream)
    return cp.cuda.ExternalStream(torch_stream.cuda_stream)


# -- naive: synchronous CuPy ------------------------------------------------------------------------
def run_naive(cp: Any, batches: int, batch: int) -> dict[str, Any]:
    """Per batch: stamp a pageable array, ``cp.asarray`` it, run the kernel, ``cp.asnumpy`` the result."""
    kernel = fma_kernel(cp)
    rng = np.random.default_rng()
    pool = [rng.standard_normal((batch, *TASK_SHAPE), dtype=np.float32) for _ in range(2)]
    sink, spans = StampSink(), []
    for i in range(batches):
        host = pool[i % 2]
        idx = np.arange(i * batch, (i + 1) * batch)
        host[:, 0, 0] = idx
        dev = cp.asarray(host)
        out = cp.empty_like(dev)
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        kernel(dev, _ONE, _ZERO, np.int32(_gpu_work.ITERS), out)
        b.record()
        res = cp.asnumpy(out)
        spans.append((a, b))
        sink.check(res[:, 0, 0], idx)
    return _result(sink, event_busy(cp, spans), batches, event_median(cp, spans))


# -- the DataLoader loop ----------------------------------------------------------------------------
class _Batches:
    """A torch Dataset of whole batches (``batch_size=None``). In the main process (no workers) it
    stamps one of a ring of pinned batches, the hand-tuned way with no host copy at all; in a worker
    process it makes a new tensor, which the DataLoader's pin thread copies into pinned memory."""

    def __init__(self, torch: Any, batches: int, batch: int, pinned_ring: int) -> None:
        self.torch = torch
        self.batches = batches
        self.batch = batch
        self.pool = [torch.empty((batch, *TASK_SHAPE), dtype=torch.float32, pin_memory=True)
                     for _ in range(pinned_ring)]
        for p in self.pool:
            p.normal_()

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, i: int) -> Any:
        torch = self.torch
        if torch.utils.data.get_worker_info() is None:
            t = self.pool[i % len(self.pool)]
        else:
            t = torch.empty((self.batch, *TASK_SHAPE), dtype=torch.float32)
        t[:, 0, 0] = torch.arange(i * self.batch, (i + 1) * self.batch, dtype=torch.float32)
        return t


def run_dataloader(cp: Any, torch: Any, batches: int, batch: int, workers: int) -> dict[str, Any]:
    """The tuned PyTorch loop: h2d of batch n+1 on a copy stream while n computes, d2h on its own
    stream into a pinned ring read one batch late (see the module's docstring)."""
    ring = 3
    data = _Batches(torch, batches, batch, pinned_ring=0 if workers else 8)
    it = iter(torch.utils.data.DataLoader(data, batch_size=None, shuffle=False, num_workers=workers,
                                          pin_memory=workers > 0, prefetch_factor=4 if workers else None))
    dev = torch.device("cuda")
    copy_s, comp_s, back_s = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    outs = [torch.empty((batch, *TASK_SHAPE), dtype=torch.float32, device=dev) for _ in range(ring)]
    host_outs = [torch.empty((batch, *TASK_SHAPE), dtype=torch.float32, pin_memory=True) for _ in range(ring)]
    kernel = fma_kernel(cp)
    sink, spans = StampSink(), []
    pending: collections.deque[tuple[Any, Any, int]] = collections.deque()

    def prefetch() -> tuple[Any, Any] | None:
        x = next(it, None)
        if x is None:
            return None
        with torch.cuda.stream(copy_s):
            xd = x.to(dev, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(copy_s)
        return xd, ready

    def drain(keep: int) -> None:
        while len(pending) > keep:
            done, host, j = pending.popleft()
            done.synchronize()
            sink.check(host[:, 0, 0].numpy(), np.arange(j * batch, (j + 1) * batch))

    with torch.cuda.stream(comp_s):
        ext = _external(cp, comp_s)
        out_cp = [cp.from_dlpack(o) for o in outs]
        nxt = prefetch()
        i = 0
        while nxt is not None:
            xd, ready = nxt
            comp_s.wait_event(ready)
            xd.record_stream(comp_s)
            nxt = prefetch()
            drain(ring - 1)  # the output slot about to be reused has been read
            with ext:
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(ext)
                kernel(cp.from_dlpack(xd), _ONE, _ZERO, np.int32(_gpu_work.ITERS), out_cp[i % ring])
                b.record(ext)
            spans.append((a, b))
            computed = torch.cuda.Event()
            computed.record(comp_s)
            back_s.wait_event(computed)
            with torch.cuda.stream(back_s):
                host_outs[i % ring].copy_(outs[i % ring], non_blocking=True)
                landed = torch.cuda.Event()
                landed.record(back_s)
            pending.append((landed, host_outs[i % ring], i))
            i += 1
        drain(0)
    return _result(sink, event_busy(cp, spans), batches, event_median(cp, spans), workers=workers)


# -- warpdeck ---------------------------------------------------------------------------------------
def overlap_from_records(records: Sequence[BatchRecord]) -> dict[str, Any]:
    """What the CUDA-event timeline of a one-lane run shows: for each batch n, does the h2d of n+1
    and the d2h of n-1 run while n computes; how much of the compute time a copy runs beside; and
    the device's idle gaps between consecutive kernels."""
    recs = sorted((r for r in records if r.ok), key=lambda r: r.batch)
    if len(recs) < 3:
        return {}

    def over(a: tuple[float, float], b: tuple[float, float]) -> float:
        return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))

    h2d_next = d2h_prev = 0
    copied_beside = computing = 0.0
    gaps = []
    for n in range(1, len(recs) - 1):
        comp = recs[n].phases[_COMPUTE]
        h2d_next += over(recs[n + 1].phases[_H2D], comp) > 0
        d2h_prev += over(recs[n - 1].phases[_D2H], comp) > 0
        copies = [recs[m].phases[p] for m in (n - 1, n + 1) for p in (_H2D, _D2H)]
        copied_beside += min(comp[1] - comp[0], sum(over(c, comp) for c in copies))
        computing += comp[1] - comp[0]
        gaps.append(max(0.0, comp[0] - recs[n - 1].phases[_COMPUTE][1]))
    inner = len(recs) - 2
    h2d_s = [r.phases[_H2D][1] - r.phases[_H2D][0] for r in recs]
    d2h_s = [r.phases[_D2H][1] - r.phases[_D2H][0] for r in recs]
    comp_s = [r.phases[_COMPUTE][1] - r.phases[_COMPUTE][0] for r in recs]
    return {
        "batches_seen": len(recs),
        "h2d_next_overlaps_compute": h2d_next / inner,
        "d2h_prev_overlaps_compute": d2h_prev / inner,
        "compute_with_a_copy_beside": copied_beside / computing if computing else 0.0,
        "gap_median_us": statistics.median(gaps) * 1e6,
        "gap_mean_us": statistics.fmean(gaps) * 1e6,
        "h2d_median_ms": statistics.median(h2d_s) * 1e3,
        "compute_median_ms": statistics.median(comp_s) * 1e3,
        "d2h_median_ms": statistics.median(d2h_s) * 1e3,
        "h2d_gbs_median": statistics.median(r.nbytes / max(1e-9, r.phases[_H2D][1] - r.phases[_H2D][0])
                                            for r in recs) / 1e9,
        "d2h_gbs_median": statistics.median(r.out_nbytes / max(1e-9, r.phases[_D2H][1] - r.phases[_D2H][0])
                                            for r in recs) / 1e9,
    }


def warpdeck_spec(name: str, batches: int, batch: int, depth: int) -> Any:
    return parse_spec({
        "name": name, "backend": "cupy", "batch_size": batch, "slot_depth": depth,
        "source": {"kind": "synthetic", "count": batches * batch, "shape": list(TASK_SHAPE)},  # replaced
        "sink": {"kind": "null"},  # replaced
        "stages": [{"fn": "_gpu_work:fma", "deadline_s": 120}],
        "feeder": {"auto_depth": False, "memory_budget_mb": 32768},
    })


def run_warpdeck(cp: Any, name: str, batches: int, batch: int, depth: int, trace: Path | None = None,
                 backend: Any = None) -> dict[str, Any]:
    """One engine run of the workload on CuPy with ``depth`` slots per lane (auto depth off; the
    host threads tuned as by default); its report's figures and the overlap its records show."""
    spec = warpdeck_spec(name, batches, batch, depth)
    source, sink = StampSource(batches * batch), StampSink()
    pool = cp.get_default_memory_pool()
    records: list[BatchRecord] = []
    pool_bytes: list[int] = []
    # (loop thread CPU, process CPU, wall) when the 10th and the last batch were heard: the steady
    # state's CPU, without the start (slot buffers are allocated and pinned on the loop) or the close.
    marks: list[tuple[float, float, float]] = []

    def heard(event: Any) -> None:
        if isinstance(event, BatchFinished):
            records.append(event.record)
            if len(records) in (10, batches):  # the device pool after warm-up, and at the end
                pool_bytes.append(pool.total_bytes())
                marks.append((time.thread_time(), time.process_time(), time.perf_counter()))

    async def go() -> Any:
        eng = Engine(spec, source=source, sink=sink, backend=backend or select_backend("cupy"), journal=False)
        unsubscribe = eng.events.subscribe(heard)
        exports = ExportSettings(trace=trace) if trace is not None else None
        try:
            with exporting(exports, eng.events, eng.publisher, spec.name) if exports else contextlib.nullcontext():
                async with eng:
                    return await eng.wait()
        finally:
            unsubscribe()

    report = asyncio.run(go())
    overlap = overlap_from_records(records)
    return _result(
        sink, report.device_busy, batches, overlap.get("compute_median_ms", 0.0) / 1e3, depth=depth,
        status=report.status, done=report.counts.done,
        engine_bound_tasks_s=report.bound_tasks_s, overlap_efficiency=report.overlap_efficiency,
        bottleneck=report.bottleneck, host_threads=report.host_threads, tuning=report.tuning[-4:],
        phase_clocks=report.phase_clocks, mean_phase_ms={k: v * 1e3 for k, v in report.mean_phase_s.items()},
        pool_bytes=pool_bytes, overlap=overlap,
        **_steady_cpu(marks, batches))


def _steady_cpu(marks: Sequence[tuple[float, float, float]], batches: int) -> dict[str, float]:
    """CPU per batch of the event loop's thread (the engine's own bookkeeping) and of the whole
    process, and the wall time per batch, between the 10th batch and the last."""
    if len(marks) < 2 or batches <= 10:
        return {}
    (l0, p0, w0), (l1, p1, w1) = marks[0], marks[-1]
    n = batches - 10
    return {"loop_cpu_ms_per_batch": (l1 - l0) / n * 1e3, "process_cpu_ms_per_batch": (p1 - p0) / n * 1e3,
            "wall_ms_per_batch": (w1 - w0) / n * 1e3}
