"""A run across two Ray actors writes the same outputs, byte for byte, as the same spec run in
this process: real Ray, real Mosquitto, real .npy files."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from wd_broker import Mosquitto
from wd_build import spec as build_spec

from warpdeck.engine.api import ControlSettings, Engine, PipelineSpec

COUNT = 300


def _spec(executor: str) -> PipelineSpec:
    # Two stages and an out_spec (row_sum: shape (6, 5) -> (1,)); a partial last batch (300 = 37 * 8 + 4).
    return build_spec(["wd_stages:add_one", "wd_stages:double", "wd_stages:row_sum"], name=f"eq-{executor}",
                      lanes=2, executor=executor, sink={"kind": "npy_dir", "path": "outputs"},
                      source={"kind": "synthetic", "count": COUNT, "shape": [6, 5], "dtype": "float32", "seed": 7})


async def _run(spec: PipelineSpec, run_dir: Path, control: ControlSettings) -> Engine:
    async with Engine(spec, run_dir, control=control) as eng:
        report = await eng.wait()
    assert report.counts.done == COUNT and report.counts.failed == 0, report.counts
    return eng


async def test_two_actors_write_the_same_bytes_as_one_process(ray_cluster: ModuleType, mosquitto: Mosquitto,
                                                               tmp_path: Path) -> None:
    control = ControlSettings(broker=mosquitto.address)
    ray_eng = await _run(_spec("ray"), tmp_path / "ray", control)
    local_eng = await _run(_spec("local"), tmp_path / "local", control)
    assert local_eng.executor is None and ray_eng.executor is not None
    # Both actors took part.
    assert [w.id for w in ray_eng.executor.workers] == ["ray-0", "ray-1"]
    assert all(w.batches_done > 0 for w in ray_eng.executor.workers)
    got = {p.name: p.read_bytes() for p in (tmp_path / "ray" / "outputs").glob("*.npy")}
    want = {p.name: p.read_bytes() for p in (tmp_path / "local" / "outputs").glob("*.npy")}
    assert len(want) == COUNT
    assert got == want
