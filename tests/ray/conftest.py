"""Ray for the Ray tests: a local one (2 CPUs, 2 fake GPUs, no dashboard) shared by the tests that
ask for ``ray_cluster``, and a multi-node ``Cluster`` (a head without CPUs, two worker nodes) for
those that ask for ``ray_nodes``, built once per module. A driver is connected to one Ray at a
time: each fixture shuts down the other's when it needs its own, so both kinds of tests run in one
session, in any order (a switch costs one start, a few seconds). Without Ray installed the Ray
tests skip, and fail under CI=true (CI must run them)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_HERE = Path(__file__).parent
SUPPORT = _HERE.parent / "support"

_CONNECTED = {"to": ""}
"""Which Ray this driver is connected to now: "local", "nodes" or "" (none)."""


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        msg = "Ray is not installed (pip install -e '.[dev]' or '.[ray]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg}: CI must run the Ray tests")
        pytest.skip(msg)
    return ray


class _SupportOnPath:
    """The actors import the tests' stage functions (wd_stages) by name: Ray's worker processes
    inherit the environment of the node (raylet) started meanwhile, so tests/support goes on their
    path while a node starts."""

    def __enter__(self) -> None:
        self.before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SUPPORT), self.before) if p)

    def __exit__(self, *exc: object) -> None:
        if self.before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = self.before


def _disconnect(ray: ModuleType) -> None:
    if ray.is_initialized():
        ray.shutdown()
    _CONNECTED["to"] = ""


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[ModuleType]:
    ray = _import_ray()
    try:
        yield ray
    finally:
        _disconnect(ray)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last Ray test, disconnect: the driver's own threads (Ray's C++ core worker) do not
    run on through the rest of the session (a session fixture alone would keep them to its end)."""
    if "ray" in sys.modules and (nextitem is None or _HERE not in nextitem.path.parents):
        _disconnect(sys.modules["ray"])


@pytest.fixture
def ray_cluster(_ray_session: ModuleType) -> ModuleType:
    """``ray.init(num_cpus=2, num_gpus=2)``: one actor per fake GPU, as on a 2-GPU node (started on
    first use, and again after a multi-node module)."""
    ray = _ray_session
    if _CONNECTED["to"] != "local":
        _disconnect(ray)
        with _SupportOnPath():
            # "local": a new instance, even where a `ray start` cluster runs on this machine (Ray
            # would join that one otherwise).
            ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False)
        _CONNECTED["to"] = "local"
    return ray


_FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 300, "health_check_timeout_ms": 300,
                "health_check_failure_threshold": 3}
"""GCS health checks fast enough that a node killed outright is declared dead in about a second (Ray's defaults take
tens of seconds), so its actors restart within a test's patience."""


@dataclass
class RayNodes:
    """A head (no CPUs: no actor goes there) and worker nodes of ``cpus`` CPUs and ``gpus`` fake GPUs."""

    ray: ModuleType
    cluster: Any
    cpus: int = 2
    gpus: int = 1
    workers: list[Any] = field(default_factory=list)

    def add(self) -> Any:
        with _SupportOnPath():
            node = self.cluster.add_node(num_cpus=self.cpus, num_gpus=self.gpus)
        self.workers.append(node)
        self.cluster.wait_for_nodes()
        return node

    def remove(self, node: Any, graceful: bool) -> None:
        self.cluster.remove_node(node, allow_graceful=graceful)
        self.workers.remove(node)

    def node_of(self, handle: Any) -> str:
        """The id of the node an actor runs on now (Ray's actor table)."""
        from ray._private.state import state

        return str(state.actor_table(handle._actor_id.hex())["Address"]["NodeID"])

    def restore(self, count: int = 2) -> None:
        """Back to ``count`` worker nodes, each with all its room free (after a test removed one)."""
        while len(self.workers) < count:
            self.add()


@pytest.fixture(scope="module")
def ray_nodes(_ray_session: ModuleType) -> Iterator[RayNodes]:
    """A ``ray.cluster_utils.Cluster``: a head with 0 CPUs and two worker nodes of 2 CPUs and 1 fake
    GPU each, this driver connected to it, for one module."""
    ray = _ray_session
    from ray.cluster_utils import Cluster

    _disconnect(ray)
    with _SupportOnPath():
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "num_gpus": 0, "include_dashboard": False, "_system_config": _FAST_HEALTH})
    nodes = RayNodes(ray, cluster)
    try:
        nodes.restore()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        _CONNECTED["to"] = "nodes"
        yield nodes
    finally:
        _disconnect(ray)
        cluster.shutdown()
