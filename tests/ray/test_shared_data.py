"""Shared data: actors that load their own inputs and stage their own outputs, the engine leasing
only keys and committing (renaming) what they staged. Real Ray, real Mosquitto, real files.

- Outputs are byte-identical to the same spec shipped through the object store and run in this
  process; a bad input fails alone, named, whichever process read it.
- The driver sends the key and handle of each task only: measured as the pickled size of the job
  (what Ray serialises), against the shipped job that carries the inputs.
- Exactly once across a kill between an actor's temp files and the engine's commit: the killed
  attempt's temp files are never renamed (the kernel counts renames: inotify), its tasks run again
  elsewhere, every output lands once with the right values.
"""

from __future__ import annotations

import os
import pickle
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from wd_broker import Mosquitto
from wd_build import spec as build_spec
from wd_control import EngineThread, wait_for
from wd_inotify import RenameWatch

from warpdeck.engine.api import ControlSettings, Engine, PipelineSpec
from warpdeck.engine.edges.sources import synthetic_values
from warpdeck.engine.scaleout.remote import RemoteWorker
from warpdeck.engine.scaleout.worker import HOLD_AFTER_STAGE_ENV

COUNT = 160
SHAPE = (32, 8)  # 1 KiB of float32 per task


def _inputs(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(COUNT):
        np.save(folder / f"in-{i:04d}.npy", rng.standard_normal(SHAPE).astype(np.float32))
    (folder / "in-0077.npy").write_bytes((folder / "in-0077.npy").read_bytes()[:100])  # truncated: fails alone
    return folder


def _spec(src: Path, executor: str, data: str | None = None) -> PipelineSpec:
    ex: Any = executor if data is None else {"kind": executor, "data": data}
    return build_spec(["wd_stages:add_one", "wd_stages:double"], name=f"shared-{executor}-{data}", lanes=2,
                      executor=ex, sink={"kind": "npy_dir", "path": "outputs"},
                      source={"kind": "npy_dir", "path": str(src), "shape": list(SHAPE), "dtype": "float32"})


async def _run(spec: PipelineSpec, run_dir: Path, control: ControlSettings) -> Engine:
    async with Engine(spec, run_dir, control=control) as eng:
        report = await eng.wait()
    assert report.counts.done == COUNT - 1 and report.counts.failed == 1, report.counts
    failed = eng.task_keys.detail("in-0077")
    assert failed is not None and "in-0077.npy" in failed.error, "the bad input is named, wherever it was read"
    return eng


async def test_shared_data_writes_the_same_bytes_and_sends_only_keys(ray_cluster: ModuleType, mosquitto: Mosquitto,
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    src = _inputs(tmp_path / "in")
    sent: dict[str, list[tuple[int, int, int]]] = {"ship": [], "shared": []}
    real_run = RemoteWorker.run

    async def measured(self: RemoteWorker, job: Any) -> Any:  # observes the real call, changes nothing
        out = await real_run(self, job)
        mode = "ship" if job.inputs is not None else "shared"
        sent[mode].append((len(job), len(pickle.dumps(job, protocol=5)), len(pickle.dumps(out, protocol=5))))
        return out

    monkeypatch.setattr(RemoteWorker, "run", measured)
    control = ControlSettings(broker=mosquitto.address)
    shared = await _run(_spec(src, "ray"), tmp_path / "shared", control)  # auto picks shared
    ship = await _run(_spec(src, "ray", "ship"), tmp_path / "ship", control)
    await _run(_spec(src, "local"), tmp_path / "local", control)
    assert shared.executor is not None and shared.executor.data_mode[0] == "shared"
    assert shared.report is not None and shared.report.executor.startswith("ray: 2 actor(s), data shared")
    assert ship.executor is not None and ship.executor.data_mode == ("ship", "executor.data = 'ship'")
    assert all(w.batches_done > 0 for w in shared.executor.workers), "both actors took part"
    want = {p.name: p.read_bytes() for p in (tmp_path / "local" / "outputs").glob("*.npy")}
    assert len(want) == COUNT - 1
    for mode in ("shared", "ship"):
        got = {p.name: p.read_bytes() for p in (tmp_path / mode / "outputs").iterdir()}
        assert got == want, f"{mode}: outputs differ from the in-process run (or temp files were left)"
    per_task = {m: sum(b for _, b, _ in v) / sum(n for n, _, _ in v) for m, v in sent.items()}
    back = {m: sum(b for _, _, b in v) / sum(n for n, _, _ in v) for m, v in sent.items()}
    task_bytes = int(np.prod(SHAPE)) * 4
    print(f"driver bytes per task out/back: ship {per_task['ship']:.0f}/{back['ship']:.0f}, "
          f"shared {per_task['shared']:.0f}/{back['shared']:.0f} (input and output {task_bytes} B each)")
    assert per_task["ship"] > task_bytes, "shipped jobs carry the inputs"
    assert per_task["shared"] < 160, "a shared job carries each task's key and path only"
    assert back["shared"] < 200 < task_bytes < back["ship"], "shared outcomes carry temp file names only"


def test_a_kill_between_staging_and_commit_loses_nothing_and_writes_once(ray_cluster: ModuleType,
                                                                          mosquitto: Mosquitto,
                                                                          tmp_path: Path) -> None:
    count, marker = 240, tmp_path / "held"
    run_dir = tmp_path / "run"
    (run_dir / "outputs").mkdir(parents=True)
    # ray-1 holds its first staged batch (temp files written, answer not sent) until it is killed.
    spec = build_spec(["wd_stages:slow_double_40ms"], name="shared-kill", batch_size=8,
                      executor={"kind": "ray", "data": "shared",
                                "runtime_env": {"env_vars": {HOLD_AFTER_STAGE_ENV: f"ray-1:120:{marker}"}}},
                      sink={"kind": "npy_dir", "path": "outputs"},
                      source={"kind": "synthetic", "count": count, "shape": [4], "dtype": "float32", "seed": 3})
    watch = RenameWatch(run_dir / "outputs")
    try:
        with EngineThread(spec, mosquitto.address, run_dir=run_dir) as et:
            eng = et.engine
            assert eng is not None and eng.executor is not None
            wait_for(lambda: marker.exists() and marker.read_text().count(".tmp") == 8, 60,
                     "ray-1 staged a batch and holds it")
            pid, tag, *temps = marker.read_text().split()
            assert all((run_dir / "outputs" / t).is_file() for t in temps), "its temp files are on disk"
            os.kill(int(pid), signal.SIGKILL)
            wait_for(lambda: eng.leases.reclaimed >= 1, 15, "ray-1 convicted, its batches taken back")
            wait_for(et.finished, 90, "run finished")
            watch.poll()
            report = et.report
    finally:
        watch.close()
    assert report.counts.done == count and report.counts.failed == 0, report.counts
    assert not watch.overflowed
    # A staged file is renamed once to carry its checksum (a hidden temp name), then into place.
    landed = {name: n for name, n in watch.counts.items() if not name.startswith(".")}
    assert len(landed) == count and max(landed.values()) == 1, "every output renamed into place once"
    assert not any((run_dir / "outputs" / t).exists() for t in temps), "the killed attempt's temp files are gone"
    assert not list((run_dir / "outputs").glob(".*")), "no temp file left"
    inputs = synthetic_values(3, list(range(count)), (4,), np.dtype("float32"))
    for i in range(count):
        np.testing.assert_array_equal(np.load(run_dir / "outputs" / f"syn-{i:08d}.npy"), inputs[i] * 2 + 1)
    attempts = eng.table.attempt[: len(eng.table)]
    assert int((attempts == 2).sum()) >= 8, "the held batch's tasks ran a second attempt"
    assert tag.startswith("ray-1-e")


async def test_parquet_parts_staged_by_actors_hold_the_in_process_rows(ray_cluster: ModuleType,
                                                                        mosquitto: Mosquitto, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    count = 100
    rows: dict[str, dict[str, Any]] = {}
    for executor in ("ray", "local"):
        spec = build_spec(["wd_stages:add_one"], name=f"pq-{executor}", executor=executor,
                          sink={"kind": "parquet", "path": "outputs"},
                          source={"kind": "synthetic", "count": count, "shape": [3], "dtype": "float64", "seed": 9})
        async with Engine(spec, tmp_path / executor, control=ControlSettings(broker=mosquitto.address)) as eng:
            report = await eng.wait()
        assert report.counts.done == count, report.counts
        table = pq.read_table(tmp_path / executor / "outputs")
        rows[executor] = dict(zip(table.column("key").to_pylist(), table.column("output").to_pylist(), strict=True))
        names = sorted(p.name for p in (tmp_path / executor / "outputs").iterdir())
        assert names == [f"part-{i:05d}.parquet" for i in range(len(names))], "parts numbered, no temp left"
    assert "data shared" in report.executor or executor == "local"
    assert rows["ray"] == rows["local"] and len(rows["ray"]) == count


@pytest.mark.parametrize("kind", ["images", "parquet"])
async def test_images_and_parquet_sources_are_read_by_the_actors(ray_cluster: ModuleType, mosquitto: Mosquitto,
                                                                  tmp_path: Path, kind: str) -> None:
    """The actors open the image folder or the Parquet file themselves (handles are paths, or row
    groups and rows) and write what the in-process run writes."""
    if kind == "images":
        pytest.importorskip("PIL")
        from warpdeck.examples.classify import make_images

        make_images(tmp_path / "data", 24)
        source: dict[str, Any] = {"kind": "images", "path": str(tmp_path / "data"), "size": [16, 16],
                                  "mode": "RGB", "dtype": "float32", "layout": "CHW"}
    else:
        pytest.importorskip("pyarrow")
        from warpdeck.examples.tables import make_table

        make_table(tmp_path / "data" / "t.parquet", 40, row_group_size=16)
        source = {"kind": "parquet", "path": str(tmp_path / "data" / "t.parquet"), "column": "features",
                  "shape": [512], "dtype": "float32", "key": "id"}
    outputs = {}
    for executor in ("ray", "local"):
        spec = build_spec(["wd_stages:double"], name=f"{kind}-{executor}", executor=executor, source=source,
                          sink={"kind": "npy_dir", "path": "outputs"})
        async with Engine(spec, tmp_path / executor, control=ControlSettings(broker=mosquitto.address)) as eng:
            report = await eng.wait()
        assert report.counts.failed == 0 and report.counts.done == report.counts.total > 0, report.counts
        assert executor == "local" or "data shared" in report.executor
        outputs[executor] = {p.name: p.read_bytes() for p in (tmp_path / executor / "outputs").iterdir()}
    assert outputs["ray"] == outputs["local"]
