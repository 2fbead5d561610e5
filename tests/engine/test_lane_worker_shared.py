"""An actor's body (``LaneWorker``) with shared data, run in this process as Ray would run it in
another: it loads its tasks from the spec's own source by handle, stages its outputs under its
attempt's temp names (nothing lands), sends bad inputs back by row, and takes the fill threads the
engine's tuner chose for the lane. Real files, the real lanes, no Ray."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from wd_build import spec as build_spec

from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.sinks import NpyDirSinkImpl, open_sink
from warpdeck.engine.edges.sources import open_source
from warpdeck.engine.scaleout.jobs import BatchJob
from warpdeck.engine.scaleout.shared_data import shared_data
from warpdeck.engine.scaleout.worker import LaneWorker
from warpdeck.engine.state.task_states import Phase


async def test_an_actor_loads_by_handle_stages_and_returns_bad_rows(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        np.save(src / f"x{i}.npy", np.full((3,), float(i), np.float32))
    (src / "x4.npy").write_bytes(b"not an array")
    spec = build_spec(["wd_stages:double"], name="lw", executor={"kind": "ray", "data": "shared"},
                      source={"kind": "npy_dir", "path": str(src), "shape": [3], "dtype": "float32"},
                      sink={"kind": "npy_dir", "path": "outputs"})
    sink = open_sink(spec.sink, tmp_path / "run")
    assert isinstance(sink, NpyDirSinkImpl)
    shared = shared_data(spec, sink)
    assert shared is not None and Path(shared.sink.path).is_absolute()
    items = tuple(open_source(spec.source).items())
    worker = LaneWorker(spec, "ray-7", None, shared=shared)
    try:
        outcome = await worker.run(BatchJob(11, 0, items[0].batch_key, None, 2, items, fill_workers=3))
        assert worker.lanes[0].workers(Phase.FILL) == 3, "the tuner's fill threads reach the actor's lane"
    finally:
        await worker.stop()
    assert outcome.failure is None and outcome.outputs is None, "shared data: nothing travels back but names"
    [(row, err)] = outcome.fill_errors
    assert row == 4 and isinstance(err, InputError) and "x4.npy" in str(err)
    assert outcome.staged_keys == ("x0", "x1", "x2", "x3", "x5")
    tag = f"ray-7-e{outcome.epoch}-b11"
    assert [re.sub(r"-[0-9a-f]{8}\.tmp$", ".tmp", n) for n in outcome.staged] == [
        f".{k}.npy.{tag}.tmp" for k in outcome.staged_keys]  # each with its output's checksum
    assert not any(sink.committed(k) for k in outcome.staged_keys), "staged, not committed: the engine renames"
    sink.commit(outcome.staged_keys, outcome.staged)
    np.testing.assert_array_equal(np.load(sink.path("x5")), np.full((3,), 10.0, np.float32))


async def test_an_actor_applies_the_nonfinite_policy_before_staging(tmp_path: Path) -> None:
    from wd_stages import POISON

    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):
        np.save(src / f"x{i}.npy", np.full((2,), POISON if i in (1, 2) else float(i), np.float32))
    for policy, staged_keys, written in (("fail", ("x0", "x3"), False), ("flag", ("x0", "x1", "x2", "x3"), True)):
        spec = build_spec(["wd_stages:nan_at_poison"], name="nf", executor={"kind": "ray", "data": "shared"},
                          nonfinite=policy, sink={"kind": "npy_dir", "path": f"out-{policy}"},
                          source={"kind": "npy_dir", "path": str(src), "shape": [2], "dtype": "float32"})
        shared = shared_data(spec, open_sink(spec.sink, tmp_path))
        assert shared is not None
        items = tuple(open_source(spec.source).items())
        worker = LaneWorker(spec, "ray-0", None, shared=shared)
        try:
            outcome = await worker.run(BatchJob(1, 0, items[0].batch_key, None, 2, items))
        finally:
            await worker.stop()
        assert outcome.staged_keys == staged_keys, policy
        assert [(row, type(e).__name__, e.written) for row, e in outcome.sink_errors] == [  # type: ignore[attr-defined]
            (1, "NonFiniteOutput", written), (2, "NonFiniteOutput", written)], policy
