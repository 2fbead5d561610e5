"""ray_dispatch.py's second half: shipped against shared data, and a node lost mid-run.

Data modes: one folder of ``.npy`` inputs (64 x 64 float32, 16 KiB each) through a no-op stage into
an ``npy_dir`` sink, with ``data = "ship"`` (the engine loads, arrays travel through the object
store, the engine writes) and ``data = "shared"`` (the engine leases keys and paths, each actor loads
and stages, the engine renames), on 1 and 2 actors. Driver bytes per task are the pickled size of
the jobs sent and the outcomes returned (what Ray serialises), sampled over the first 50 calls of
each run; throughput is steady state, done / (elapsed - first batch).

Node loss: a ``ray.cluster_utils.Cluster`` (a head with no CPUs, two worker nodes with one fake GPU
each: separate raylets and object stores on this machine), two actors spread over them, a stage
that sleeps 20 ms per batch; the node holding ray-1 is removed (its raylet killed). Figures: from
the removal to ray-1's batches back in the queue, and to the first of them running again (a task on
its second attempt leaves the queue), and which conviction acted first.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from warpdeck.engine.api import Cancel, ControlSettings, Engine, PipelineSpec, parse_spec
from warpdeck.engine.scaleout.remote import RemoteWorker

SHAPE = (64, 64)


def make_inputs(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(count):
        np.save(folder / f"x{i:06d}.npy", rng.standard_normal(SHAPE).astype(np.float32))
    return folder


def _spec(src: Path, out: Path, data: str, workers: int) -> PipelineSpec:
    return parse_spec({
        "name": f"bench-data-{data}-{workers}", "backend": "numpy", "batch_size": 64, "slot_depth": 2, "lanes": 1,
        "source": {"kind": "npy_dir", "path": str(src), "shape": list(SHAPE), "dtype": "float32"},
        "sink": {"kind": "npy_dir", "path": str(out)}, "stages": [{"fn": "_stages:noop"}],
        "executor": {"kind": "ray", "workers": workers, "data": data},
    })


async def data_mode_run(src: Path, out: Path, data: str, workers: int) -> dict[str, Any]:
    """One run: throughput and the driver's bytes per task each way."""
    sent: list[tuple[int, int, int]] = []
    real_run = RemoteWorker.run

    async def sampled(self: RemoteWorker, job: Any) -> Any:
        outcome = await real_run(self, job)
        if len(sent) < 50:
            sent.append((len(job), len(pickle.dumps(job, protocol=5)), len(pickle.dumps(outcome, protocol=5))))
        return outcome

    RemoteWorker.run = sampled  # type: ignore[method-assign]
    try:
        async with Engine(_spec(src, out, data, workers), journal=False) as eng:
            report = await eng.wait()
    finally:
        RemoteWorker.run = real_run  # type: ignore[method-assign]
    assert report.counts.failed == 0 and report.first_batch_s is not None, report.counts
    tasks = sum(n for n, _, _ in sent)
    return {"data": data, "workers": workers, "executor": report.executor,
            "tasks_s": report.counts.done / max(report.elapsed_s - report.first_batch_s, 1e-9),
            "out_bytes_per_task": sum(b for _, b, _ in sent) / tasks,
            "back_bytes_per_task": sum(b for _, _, b in sent) / tasks}


async def _until(cond: Any, limit_s: float) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit_s:
            raise TimeoutError(f"not within {limit_s} s")
        await asyncio.sleep(0.002)
    return time.monotonic() - t0


async def node_loss(broker: str, node_of: Any, remove: Any) -> dict[str, Any]:
    """Remove the node holding ray-1 mid-run: requeue and running-again times."""
    from warpdeck.engine.api import parse_broker  # noqa: PLC0415

    spec = parse_spec({
        "name": "bench-node-loss", "backend": "numpy", "batch_size": 16, "lanes": 1,
        "source": {"kind": "synthetic", "count": 1_000_000, "shape": [16], "dtype": "float32"},
        "sink": {"kind": "null"}, "stages": [{"fn": "_stages:compute_sleep"}],
        "executor": {"kind": "ray", "workers": 2, "placement": "spread"},
    })
    async with Engine(spec, journal=False, control=ControlSettings(broker=parse_broker(broker))) as eng:
        assert eng.executor is not None
        victim = eng.executor.workers[1]
        await _until(lambda: victim.batches_done >= 3 and len(eng.leases.leased_to(victim.id)) >= 1, 120)
        table = eng.table
        before = eng.leases.reclaimed
        assert victim.hello is not None
        node = node_of(victim.hello.pid)
        # Removed on a thread, as a node dies apart from the engine: its loop goes on meanwhile.
        t0 = time.monotonic()
        removing = asyncio.ensure_future(asyncio.to_thread(remove, node))
        await _until(lambda: eng.leases.reclaimed > before, 30)
        requeued = time.monotonic() - t0

        def again() -> bool:
            n = len(table)
            return bool(((table.attempt[:n] >= 2) & (table.state[:n] != 0)).any())  # State.QUEUED == 0

        await _until(again, 30)
        running = time.monotonic() - t0
        await removing
        first = eng.executor.convictions[-1].why.split(":")[0] if eng.executor.convictions else "?"
        await eng.command(Cancel(all=True))
    return {"requeued_s": requeued, "running_again_s": running, "by": first, "t0": t0}
