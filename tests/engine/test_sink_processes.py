"""The sink in worker processes (issue 31, item 2): each batch's outputs written by a warm worker
process straight from the slot's shared memory; a bad output fails its task alone; a worker's death
costs only its batch's current attempt; a full disk holds the writes as it does on threads.

Real processes, shared memory, files and signals; the writers are a test module a worker imports by
name (tests/support/wd_sink.py), as it would a user's.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_wait import until

from warpdeck.engine.api import Engine, SpecError, parse_spec
from warpdeck.engine.backends.shared_memory import ARENA_PREFIX, default_root
from warpdeck.engine.edges.sinks import CHECKSUMS

ROW = (4, 8)
COUNT = 320


def spec(sink: dict[str, Any], workers: int = 2, **host: Any) -> Any:
    return parse_spec({
        "name": "sink-procs", "backend": "numpy", "batch_size": 16,
        "source": {"kind": "items", "items": "wd_fill:items", "load": "wd_fill:load_stamp", "shape": list(ROW),
                   "dtype": "float64"},
        "sink": sink, "stages": [{"fn": "wd_stages:add_one"}], "retry": {"max_attempts": 3},
        "host": {"fill_pool": "threads", "sink_pool": "processes", "sink_workers": workers, **host}})


def _arenas() -> set[str]:
    mine = f"-{os.getpid()}-"
    return {p.name for p in default_root().iterdir() if p.name.startswith(ARENA_PREFIX) and mine in p.name}


def _landed(where: Path, pattern: str = "t*.npy") -> list[Path]:
    """The files a run left in ``where`` (read once the engine is done)."""
    return sorted(where.glob(pattern))


def _writers(where: Path) -> set[int]:
    """The processes that wrote the outputs in ``where`` (``wd_sink`` notes each in ``<key>.pid``)."""
    return {int(p.read_text()) for p in where.glob("*.pid")}


def _expected(key: str, arr: np.ndarray) -> bool:
    """The stage added one to a row of the item's index (its first value: the loading thread's pid)."""
    return bool((arr.reshape(-1)[1:] == int(key[1:]) + 1).all())


async def test_an_npy_sink_writes_each_batch_from_a_worker_process_and_a_resume_trusts_it(tmp_path: Path) -> None:
    before = _arenas()
    out = tmp_path / "out"
    s = spec({"kind": "npy_dir", "path": str(out)})
    async with Engine(s, run_dir=tmp_path / "run") as eng:
        writers = eng.state.lanes[0].sink_processes  # type: ignore[attr-defined]
        await until(lambda: len(writers.pool.pids()) == 2, 30, "two sink workers")
        pids = set(writers.pool.pids())
        report = await eng.wait()
        detail = eng.task_detail("t00042")
    assert report.status == "finished" and report.counts.done == COUNT
    files = _landed(out)
    assert len(files) == COUNT and not _landed(out, ".*.tmp")
    for f in files:
        assert _expected(f.stem, np.load(f))
    assert not (out / CHECKSUMS).exists()  # settled: the finished run's journal holds every output
    procs = report.sink_processes["0"]
    assert {int(p["pid"]) for p in procs} == pids and os.getpid() not in pids
    assert sum(int(p["batches"]) for p in procs) == COUNT // 16
    assert report.host_threads["0"]["sink"] == 2
    assert detail is not None and detail.output_to == f"written to {out / 't00042.npy'}"
    assert not _arenas() - before  # the lane removed the shared output buffers it made
    async with Engine(s, run_dir=tmp_path / "run") as eng:  # the same run again: nothing is left to write
        again = await eng.wait()
    assert again.counts.skipped_done == COUNT and again.counts.failed == 0


@pytest.mark.parametrize("batch", [False, True], ids=["target", "write_batch"])
async def test_a_callable_sink_runs_in_the_workers_and_a_bad_output_fails_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: bool) -> None:
    monkeypatch.setenv("WD_SINK_DIR", str(tmp_path))
    sink = {"kind": "callable", "write_batch": "wd_sink:write_batch_record"} if batch else \
        {"kind": "callable", "target": "wd_sink:write_failing"}
    async with Engine(spec(sink)) as eng:
        report = await eng.wait()
        bad = eng.task_detail("t00007")
    writers = _writers(tmp_path)
    assert writers and os.getpid() not in writers
    assert writers <= {int(p["pid"]) for p in report.sink_processes["0"]}
    if batch:
        assert report.counts.done == COUNT and len(_landed(tmp_path)) == COUNT
        return
    assert report.counts.done == COUNT - 1 and report.counts.failed == 1
    assert not (tmp_path / "t00007.npy").exists() and (tmp_path / "t00006.npy").exists()
    assert (tmp_path / "t00008.npy").exists()  # its batch's other outputs landed
    assert bad is not None and bad.attempt == 3 and "cannot encode t00007" in bad.error
    assert 'wd_sink.py", line' in bad.traceback  # the worker's own frames


@pytest.mark.parametrize("trial", range(6))
async def test_a_sink_worker_killed_mid_batch_loses_nothing_and_writes_each_output_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trial: int) -> None:
    rng = random.Random(trial)
    monkeypatch.setenv("WD_SINK_DIR", str(tmp_path))
    async with Engine(spec({"kind": "callable", "target": "wd_sink:write_slow"}), run_dir=tmp_path / "run") as eng:
        pool = eng.state.lanes[0].sink_processes.pool  # type: ignore[attr-defined]
        await until(lambda: len(pool.pids()) == 2 and eng.snapshot().counts.done > 0, 30, "two busy workers")
        await asyncio.sleep(rng.uniform(0.0, 0.3))
        victim = rng.choice(pool.pids())
        os.kill(victim, signal.SIGKILL)
        await until(lambda: pool.replaced >= 1 and len(pool.pids()) == 2 and victim not in pool.pids(), 30,
                    "the pool replaced the killed worker")
        report = await eng.wait()
    assert report.counts.done == COUNT and report.counts.failed == 0
    assert any(v == victim and "SIGKILL" in why for v, why in pool.losses)
    outs = _landed(tmp_path)
    assert len(outs) == COUNT  # one file per key
    for f in outs:
        assert _expected(f.stem, np.load(f))  # each whole: the writer renames a finished temp file
    # A writer killed between its temp file and the rename leaves that temp file: the user's own
    # (wd_sink names it by its pid), which the engine cannot know of. No other process left one.
    assert all(p.name.endswith(f".{victim}.tmp") for p in _landed(tmp_path, ".*.tmp"))


async def test_a_full_disk_in_a_worker_holds_the_writes_and_fails_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WD_SINK_DIR", str(tmp_path))
    s = spec({"kind": "callable", "target": "wd_sink:write_full_thrice"})
    s = s.model_copy(update={"retry": s.retry.model_copy(update={"max_attempts": 1})})
    async with Engine(s) as eng:
        report = await asyncio.wait_for(eng.wait(), 60)
        held = eng.outage.count  # type: ignore[attr-defined]
    assert report.counts.done == COUNT and report.counts.failed == 0  # no attempt was spent on the disk
    assert held >= 1 and len(_landed(tmp_path)) == COUNT


def test_a_parquet_sink_or_ray_actors_cannot_be_given_sink_processes() -> None:
    base = {"name": "x", "source": {"kind": "synthetic", "count": 4, "shape": [2]},
            "stages": [{"fn": "wd_stages:double"}], "host": {"sink_pool": "processes"}}
    with pytest.raises(SpecError, match="a parquet sink writes from the engine's process"):
        parse_spec({**base, "sink": {"kind": "parquet", "path": "out"}})
    with pytest.raises(SpecError, match="sink_pool = 'processes' is for local lanes"):
        parse_spec({**base, "executor": "ray"})
    with pytest.raises(SpecError, match="sink_pool"):
        parse_spec({**base, "host": {"sink_pool": "maybe"}})


def test_a_sink_object_given_to_the_engine_is_refused_for_processes() -> None:
    class Here:
        def write(self, key: str, out: np.ndarray) -> None:
            pass

    with pytest.raises(ValueError, match="a sink object given here writes in this process"):
        Engine(spec({"kind": "null"}), sink=Here())
