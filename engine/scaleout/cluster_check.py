"""What ``warpdeck check`` finds of a Ray executor, without running anything: the cluster joined
under the spec's deadline (or the local Ray a run would start), its alive nodes and their
resources, whether the actors the spec asks for fit, and the data mode a run would use.

The decision this module protects: probing a cluster is the scale-out's work (it knows how a run
joins and what an actor asks for); the command line only prints what this finds, and reaches it
through the engine's one door (``engine/api.py``). Ray's own lines go to a scratch log.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from warpdeck.engine.backends.base import BackendError
from warpdeck.engine.edges.config import PipelineSpec
from warpdeck.engine.edges.executor_spec import resource_amounts
from warpdeck.engine.scaleout import raylink, reach
from warpdeck.engine.scaleout.shared_data import data_mode

__all__ = ["check_executor"]


def check_executor(spec: PipelineSpec, problems: list[str]) -> dict[str, Any]:
    """What ``warpdeck check`` finds of the spec's executor: for Ray, the cluster joined under
    ``connect_timeout_s`` (or the local Ray a run would start), its alive nodes, and whether the
    actors the spec asks for fit; each problem is appended to ``problems`` as one line."""
    ex = spec.executor
    if ex.kind != "ray":
        return {"kind": "local"}
    found: dict[str, Any] = {"kind": "ray", "address": ex.address, "connect_timeout_s": ex.connect_timeout_s,
                             "joined": False, "join_s": None, "nodes": [], "data_mode": None, "data_why": None}
    found["data_mode"], found["data_why"] = _data_mode(spec)
    ask = reach.per_actor(ex.cpus_per_worker, ex.gpus_per_worker, ex.resources)
    found["per_worker"] = ask
    found["remote_nodes"], found["plane_fix"] = [], reach.PLANE_FIX
    with tempfile.TemporaryDirectory(prefix="warpdeck-check-") as scratch:
        t0 = time.monotonic()
        try:
            if ex.address is None and not raylink.ray_running():
                found["note"] = "no [executor] address: the run starts a local Ray on this machine (nothing to join)"
                found["workers"] = ex.workers
                found["local_gpus"] = here = raylink.local_gpus()
                if ex.gpus_per_worker > 0 and here < ex.gpus_per_worker * (ex.workers or 1):
                    problems.append(f"this machine has {here} GPU(s) a local Ray would see, and the spec asks for "
                                    f"{ex.gpus_per_worker * (ex.workers or 1):g}: set [executor] gpus_per_worker = 0 "
                                    "to run the actors on CPUs, or give an address of a cluster with GPUs")
                return found
            joined = raylink.connect(ex.address, ex.connect_timeout_s, Path(scratch))
            try:
                nodes = raylink.cluster_nodes()
                found["remote_nodes"] = reach.remote_nodes(nodes, raylink.local_ips())
            finally:
                if joined:  # leave before the scratch log goes; a Ray this process already had stays
                    raylink.disconnect()
        except BackendError as exc:
            problems.append(exc.reason)
            return found
    found.update(joined=True, join_s=round(time.monotonic() - t0, 3))
    found["nodes"] = [{"ip": n.ip, "alive": n.alive, "CPU": n.cpus, "GPU": n.gpus, "resources": n.resources,
                       "node_id": n.node_id} for n in nodes]
    alive = [n for n in nodes if n.alive]
    gpus = sum(n.gpus for n in alive)
    workers = ex.workers if ex.workers is not None else max(1, int(gpus // ex.gpus_per_worker)
                                                            if ex.gpus_per_worker else 1)
    has: dict[str, float] = {}
    for n in alive:
        for k, v in {"CPU": n.cpus, "GPU": n.gpus, **n.resources}.items():
            has[k] = has.get(k, 0.0) + v
    holds = reach.actors_fit(alive, ask)
    found.update(workers=workers, asks={k: v * workers for k, v in ask.items()},
                 cluster={k: has.get(k, 0.0) for k in ask} if ask else {}, holds=holds,
                 fits=holds is None or holds >= workers)
    if not alive:
        problems.append(f"the Ray cluster at {ex.address or 'this process'} has no alive nodes")
    elif ex.gpus_per_worker > 0 and gpus == 0:
        problems.append("the Ray cluster has no GPUs: add GPU nodes, or set [executor] gpus_per_worker = 0")
    elif not found["fits"]:
        short = ", ".join(f"{k} {v * workers:g} (has {has.get(k, 0.0):g})" for k, v in ask.items())
        problems.append(f"the Ray cluster holds {holds} of the {workers} actors the spec asks for (each "
                        f"{resource_amounts(ask)}; in all {short}): add nodes, or lower [executor] workers")
    return found


def _data_mode(spec: PipelineSpec) -> tuple[str | None, str | None]:
    """The data mode a Ray run would use, and why (engine/scaleout/shared_data.py decides it)."""
    mode, why = data_mode(spec)
    return mode, why
