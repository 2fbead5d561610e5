"""One local Ray for the whole session (starting one costs seconds): 2 CPUs and 2 fake GPUs, no
dashboard. Without Ray installed the Ray tests skip, and fail under CI=true (CI must run them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SUPPORT = Path(__file__).parent.parent / "support"


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        msg = "Ray is not installed (pip install -e '.[dev]' or '.[ray]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg}: CI must run the Ray tests")
        pytest.skip(msg)
    return ray


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[ModuleType]:
    """``ray.init(num_cpus=2, num_gpus=2)``: one actor per fake GPU, as on a 2-GPU node."""
    ray = _import_ray()
    # The actors import the tests' stage functions (wd_stages) by name: Ray's worker processes
    # inherit the environment of the node started here, so tests/support goes on their path.
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SUPPORT), before) if p)
    try:
        ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    try:
        yield ray
    finally:
        ray.shutdown()
