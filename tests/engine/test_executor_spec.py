"""The ``[executor]`` section: what a Ray cluster is asked for is checked before any cluster is
joined, each wrong value named by its field; the data mode (ship or shared) follows the source
and sink, and ``shared`` is refused where an actor could not open them."""

from __future__ import annotations

from typing import Any

import pytest

from warpdeck.engine.api import SpecError, parse_spec
from warpdeck.engine.scaleout.shared_data import data_mode


def _spec(executor: Any, **kw: Any) -> Any:
    data: dict[str, Any] = {"name": "ex", "stages": [{"fn": "numpy:negative"}], "executor": executor,
                            "source": {"kind": "synthetic", "count": 4, "shape": [2], "dtype": "float32"}}
    data.update(kw)
    return parse_spec(data)


def _problem(executor: Any, **kw: Any) -> str:
    with pytest.raises(SpecError) as info:
        _spec(executor, **kw)
    return str(info.value)


def test_every_ray_field_parses() -> None:
    spec = _spec({"kind": "ray", "address": "ray://head:10001", "connect_timeout_s": 5, "cpus_per_worker": 2,
                  "gpus_per_worker": 0.5, "resources": {"nvme": 1}, "placement": "pack", "data": "ship",
                  "runtime_env": {"py_modules": ["/shared/stages"], "env_vars": {"OMP_NUM_THREADS": "1"},
                                  "pip": ["scipy"]}})
    ex = spec.executor
    assert (ex.connect_timeout_s, ex.cpus_per_worker, ex.resources, ex.placement) == (5, 2, {"nvme": 1}, "pack")
    assert ex.runtime_env is not None
    assert ex.runtime_env.to_ray() == {"py_modules": ["/shared/stages"], "pip": ["scipy"],
                                       "env_vars": {"OMP_NUM_THREADS": "1"}}


@pytest.mark.parametrize(("executor", "named"), [
    ({"kind": "local", "data": "shared"}, "data: for kind = 'ray' only"),
    ({"kind": "local", "cpus_per_worker": 2}, "cpus_per_worker: for kind = 'ray' only"),
    ({"kind": "ray", "resources": {"GPU": 1}}, "'GPU' is Ray's own resource: set gpus_per_worker"),
    ({"kind": "ray", "runtime_env": {"pipp": ["x"]}}, "executor.runtime_env.pipp"),
    ({"kind": "ray", "placement": "scatter"}, "executor.placement"),
    ({"kind": "ray", "connect_timeout_s": 0}, "executor.connect_timeout_s"),
    ({"kind": "ray", "data": "sometimes"}, "executor.data"),
])
def test_a_wrong_executor_field_is_named(executor: Any, named: str) -> None:
    assert named in _problem(executor)


def test_shared_data_is_refused_where_an_actor_cannot_open_the_sink() -> None:
    problem = _problem({"kind": "ray", "data": "shared"}, sink={"kind": "callable", "target": "builtins:print"})
    assert "executor.data = 'shared': a callable sink is written in the engine's process" in problem


def test_auto_picks_shared_where_it_can_and_says_why_not_elsewhere() -> None:
    assert data_mode(_spec("ray"))[0] == "shared"
    assert data_mode(_spec({"kind": "ray", "data": "ship"})) == ("ship", "executor.data = 'ship'")
    callable_sink = _spec("ray", sink={"kind": "callable", "target": "builtins:print"})
    assert data_mode(callable_sink) == ("ship", "a callable sink is written in the engine's process")


def test_a_spec_read_back_from_its_dump_keeps_a_local_executor() -> None:
    spec = _spec("local")
    assert parse_spec(spec.model_dump()).executor.kind == "local"
    ray = _spec({"kind": "ray", "cpus_per_worker": 2, "runtime_env": {"env_vars": {"A": "1"}}})
    assert parse_spec(ray.model_dump()).executor == ray.executor
