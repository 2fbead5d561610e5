"""Ray dispatch: what sending a batch to a Ray actor costs against running it in process, and how
soon a killed actor's batches are requeued.

Dispatch: one spec (no-op stage, batch 64 of float32 (256,), null sink, 1 lane, slot depth 2, auto
depth off) run twice, in process and with ``executor = "ray"`` on one actor; each after a warm-up
run. Per batch = steady state, (elapsed - first batch) / (batches - 1), so the actors' start-up is
left out. The difference is what Ray adds per batch: the inputs out and the outputs back through
the object store, the call, and the actor's own lane. Also shown: the round trip of an empty actor
call awaited from asyncio (the floor under any dispatch), and a 1 MiB batch each way.

Requeue: two actors run a pipeline whose stage sleeps 20 ms per batch; while actor ray-1 holds
batches its process is SIGKILLed. Figures per kill: from ``os.kill`` to its batches back in the
queue (``leases.reclaimed`` grows), which conviction acted first (its Will through the broker, or
Ray's actor-death error), and from ``os.kill`` to the actor re-born by Ray under a new epoch.

Data modes and node loss (``_ray_data.py``): driver bytes per task and throughput with the engine
shipping arrays or the actors reading and writing their own data, on 1 and 2 actors; and on a
simulated multi-node cluster, from a node's removal to its batches running again.

Bounds: dispatch overhead ≤ 2 ms per batch on one node (a lane's phases are milliseconds; more
would need deeper rings to hide); requeue p99 ≤ 0.5 s (DESIGN.md: a killed worker convicted within
0.5 s). Figures are wall-clock on this machine: compare only runs taken on the same one.

    python benchmarks/ray_dispatch.py [--quick] [--kills N] [--broker embedded|mqtt://host:port] [--json PATH]

(``--broker``: the requeue and node-loss parts need a broker the actors reach; embedded by default.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, verdict, write_json
from _ray_data import data_mode_run, make_inputs, node_loss

from warpdeck.engine.api import Cancel, ControlSettings, Engine, PipelineSpec, parse_broker, parse_spec

OVERHEAD_BOUND_S = 2e-3
REQUEUE_BOUND_S = 0.5
HERE = Path(__file__).resolve().parent


def _spec(executor: str, count: int, stage: str = "_stages:noop", shape: int = 256, workers: int = 1) -> PipelineSpec:
    ex: dict[str, Any] = {"kind": executor}
    if executor == "ray":
        ex["workers"] = workers
    return parse_spec({
        "name": f"bench-ray-{executor}", "backend": "numpy", "batch_size": 64, "slot_depth": 2, "lanes": 1,
        "source": {"kind": "synthetic", "count": count, "shape": [shape], "dtype": "float32"},
        "sink": {"kind": "null"}, "stages": [{"fn": stage}], "feeder": {"auto_depth": False}, "executor": ex,
    })


async def _per_batch(spec: PipelineSpec) -> float:
    async with Engine(spec, journal=False) as eng:
        report = await eng.wait()
    assert report.counts.done == spec.source.count, report.counts  # type: ignore[union-attr]
    assert report.first_batch_s is not None
    batches = -(-report.counts.done // spec.batch_size)
    return (report.elapsed_s - report.first_batch_s) / (batches - 1)


async def _round_trips(n: int) -> tuple[float, float]:
    """p50 of an empty call to an actor, and of a 1 MiB batch out and back (no-op stage)."""
    import numpy as np  # noqa: PLC0415

    from warpdeck.engine.scaleout import raylink  # noqa: PLC0415
    from warpdeck.engine.scaleout.jobs import BatchJob  # noqa: PLC0415
    from warpdeck.engine.scaleout.worker import LaneWorker  # noqa: PLC0415
    from warpdeck.engine.state.batches import BatchKey  # noqa: PLC0415

    spec = _spec("ray", 1)
    [handle] = raylink.spawn(LaneWorker, 1, lambda k: (spec, "bench-rtt", None), gpus=1, max_restarts=0)
    await raylink.call(handle, "bench-rtt", "hello")
    empty, big = [], []
    key = BatchKey("synthetic", (4096,), "float32")
    inputs = np.ones((64, 4096), np.float32)  # 1 MiB
    for i in range(n):
        t0 = time.perf_counter()
        await raylink.call(handle, "bench-rtt", "hello")
        empty.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await raylink.call(handle, "bench-rtt", "run", BatchJob(i, 0, key, inputs, 2))
        big.append(time.perf_counter() - t0)
    await raylink.call(handle, "bench-rtt", "stop")
    raylink.kill(handle)
    return statistics.median(empty), statistics.median(big)


async def _kills(kills: int, broker: str) -> list[dict[str, Any]]:
    spec = _spec("ray", 1_000_000, "_stages:compute_sleep", shape=16, workers=2)
    control = ControlSettings(broker=parse_broker(broker))
    out = []
    async with Engine(spec, journal=False, control=control) as eng:
        assert eng.executor is not None
        victim = eng.executor.workers[1]
        for _ in range(kills):
            await _until(lambda: victim.batches_done >= 2 and len(eng.leases.leased_to(victim.id)) >= 1, 60)
            assert victim.hello is not None
            before, epoch, seen = eng.leases.reclaimed, victim.epoch, len(eng.executor.convictions)
            t0 = time.monotonic()
            os.kill(victim.hello.pid, signal.SIGKILL)
            await _until(lambda b=before: eng.leases.reclaimed > b, 30)
            requeued = time.monotonic() - t0
            first = eng.executor.convictions[seen]
            await _until(lambda e=epoch: victim.epoch > e, 60)
            out.append({"requeued_s": requeued, "by": first.why.split(":")[0], "back_s": time.monotonic() - t0,
                        "batches_requeued": eng.leases.reclaimed - before})
        await eng.command(Cancel(all=True))
    return out


async def _until(cond: Any, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"not within {limit_s} s")
        await asyncio.sleep(0.002)


def _node_loss(broker: str) -> dict[str, Any]:
    """A head without CPUs and two worker nodes (one fake GPU each); the node of ray-1 removed."""
    import ray  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "num_gpus": 0})
    nodes = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
    try:
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)

        def node_of(pid: int) -> Any:
            """The node whose raylet started process ``pid`` (its parent)."""
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            return next(n for n in nodes if n.all_processes["raylet"][0].process.pid == ppid)

        return asyncio.run(node_loss(broker, node_of, lambda n: cluster.remove_node(n, allow_graceful=False)))
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer batches and one kill")
    ap.add_argument("--kills", type=int, default=None, help="SIGKILLs to time (default 5; --quick 1)")
    ap.add_argument("--broker", default="embedded", help="the control plane's broker (default: embedded)")
    ap.add_argument("--address", default=None, help="a Ray cluster to join (default: a local one, 2 fake GPUs)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import ray  # noqa: PLC0415 - the benchmark needs Ray (warpdeck[ray])

    # The actors import the benchmark's stages (_stages) by name: their processes inherit this path.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    if args.address:
        ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    else:
        ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    count = 64 * (100 if args.quick else 400)
    kills = args.kills if args.kills is not None else (1 if args.quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_per_batch(_spec("local", 64 * 20)))
        local = asyncio.run(_per_batch(_spec("local", count)))
        asyncio.run(_per_batch(_spec("ray", 64 * 20)))
        remote = asyncio.run(_per_batch(_spec("ray", count)))
        empty, big = asyncio.run(_round_trips(20 if args.quick else 100))
        killed = asyncio.run(_kills(kills, args.broker))
        src = make_inputs(Path(tmp) / "in", 64 * (20 if args.quick else 80))
        modes = [asyncio.run(data_mode_run(src, Path(tmp) / f"out-{d}-{w}", d, w))
                 for w in (1, 2) for d in ("ship", "shared")]
        ray.shutdown()
        lost = None if args.address else _node_loss(args.broker)
    overhead = remote - local
    req = sorted(k["requeued_s"] for k in killed)
    p99 = req[min(len(req) - 1, round(0.99 * (len(req) - 1)))]
    by = {w: sum(1 for k in killed if k["by"] == w) for w in sorted({k["by"] for k in killed})}
    rows = [
        ["in process: per batch (64 x 1 KiB, no-op)", f"{local * 1e3:.3f} ms", "", verdict(None)],
        ["Ray, 1 actor: per batch (same spec)", f"{remote * 1e3:.3f} ms", "", verdict(None)],
        ["dispatch overhead per batch (Ray - in process)", f"{overhead * 1e3:.3f} ms",
         f"<= {OVERHEAD_BOUND_S * 1e3:g} ms", verdict(overhead <= OVERHEAD_BOUND_S)],
        ["empty actor call, round trip (p50)", f"{empty * 1e3:.3f} ms", "", verdict(None)],
        ["1 MiB batch out and back, no-op (p50)", f"{big * 1e3:.3f} ms", "", verdict(None)],
        [f"SIGKILL -> batches requeued (p50 / max of {len(req)})",
         f"{statistics.median(req):.3f} / {req[-1]:.3f} s", f"p99 <= {REQUEUE_BOUND_S:g} s",
         verdict(p99 <= REQUEUE_BOUND_S)],
        ["  convicted first by", ", ".join(f"{w}: {n}" for w, n in by.items()), "", verdict(None)],
        ["SIGKILL -> actor back under a new epoch (p50)",
         f"{statistics.median(k['back_s'] for k in killed):.2f} s", "", verdict(None)],
    ]
    for m in modes:
        rows.append([f"data {m['data']}, {m['workers']} actor(s): 16 KiB tasks, bytes out / back per task",
                     f"{m['out_bytes_per_task']:,.0f} / {m['back_bytes_per_task']:,.0f} B", "", verdict(None)])
        rows.append(["  throughput (steady)", f"{m['tasks_s']:,.0f} tasks/s", "", verdict(None)])
    if lost is not None:
        rows.append(["node removed -> its batches requeued", f"{lost['requeued_s']:.3f} s",
                     f"<= {REQUEUE_BOUND_S:g} s", verdict(lost["requeued_s"] <= REQUEUE_BOUND_S)])
        rows.append(["node removed -> its batches running again", f"{lost['running_again_s']:.3f} s", "",
                     verdict(None)])
        rows.append(["  convicted first by", lost["by"], "", verdict(None)])
    print_table(f"ray_dispatch: Ray {ray.__version__}, broker {args.broker}, {count // 64} batches per dispatch run",
                ["figure", "measured", "bound", "result"], rows, right=[False, True, True, False])
    write_json(args.json, "ray_dispatch", {"per_batch_local_s": local, "per_batch_ray_s": remote,
                                           "overhead_s": overhead, "call_rtt_s": empty, "mib_rtt_s": big,
                                           "kills": killed, "data_modes": modes, "node_loss": lost})
    return 0


if __name__ == "__main__":
    sys.exit(main())
