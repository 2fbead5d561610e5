"""Batch-at-a-time user code (issue 31): an items source's ``load_batch(handles, out)`` and a callable
sink's ``write_batch(keys, outputs)``, each called once per batch, with one bad item still failing
alone where the spec gives the per-item function too.

Real engine runs, on fill threads and in fill worker processes; the only fakes are the user's
functions (tests/support/wd_batch_io.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wd_batch_io

from warpdeck.engine.api import Engine, SpecError, parse_spec
from warpdeck.engine.backends.process_pool import ProcessPool
from warpdeck.engine.edges.item_loader import ItemLoader
from warpdeck.engine.edges.sinks import batch_writer, open_sink

ROW = (4, 8)
COUNT = 320  # wd_fill:items


def spec(load_batch: str | None = "wd_batch_io:load_batch", load: str | None = None, pool: str = "threads",
         attempts: int = 3, sink: dict[str, Any] | None = None) -> Any:
    source: dict[str, Any] = {"kind": "items", "items": "wd_fill:items", "shape": list(ROW), "dtype": "float64"}
    if load_batch is not None:
        source["load_batch"] = load_batch
    if load is not None:
        source["load"] = load
    return parse_spec({
        "name": "batch-io", "backend": "numpy", "batch_size": 16, "source": source,
        "sink": sink or {"kind": "null"}, "stages": [{"fn": "wd_stages:add_one"}],
        "retry": {"max_attempts": attempts},
        "host": {"fill_pool": pool, "fill_workers": 2}}, "<test>")


class Keeping:
    """A sink that keeps every output."""

    def __init__(self) -> None:
        self.out: dict[str, np.ndarray] = {}

    def write(self, key: str, arr: np.ndarray) -> None:
        self.out[key] = np.array(arr)


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no recorded batches, and its own folder for the loaders' marks."""
    monkeypatch.setenv("WD_BATCH_MARKS", str(tmp_path))
    wd_batch_io.reset()
    yield
    wd_batch_io.reset()


def refused(tmp_path: Path) -> list[list[int]]:
    """The batches (their handles) a loader refused, in order."""
    marks = tmp_path / "raised"
    text = marks.read_text(encoding="utf-8") if marks.exists() else ""
    return [[int(h) for h in line.split()] for line in text.splitlines()]


def assert_loaded_in_batches(out: dict[str, np.ndarray], keys: set[str]) -> set[int]:
    """Each of ``keys`` holds its index + 1 (the stage adds one) and was loaded in a call handed more
    than one item; the pids that loaded them."""
    assert set(out) == keys
    for key in keys:
        flat = out[key].reshape(-1)
        assert (flat[2:] == int(key[1:]) + 1).all(), key
    assert max(int(out[k].reshape(-1)[1]) - 1 for k in keys) > 1  # at least one batch of several
    return {int(out[k].reshape(-1)[0]) - 1 for k in keys}


# -- load_batch ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", ["threads", "processes"])
async def test_load_batch_alone_loads_every_item(pool: str) -> None:
    sink = Keeping()
    async with Engine(spec(pool=pool), sink=sink) as eng:
        report = await eng.wait()
    assert report.status == "finished" and report.counts.done == COUNT and report.counts.failed == 0
    pids = assert_loaded_in_batches(sink.out, {f"t{i:05d}" for i in range(COUNT)})
    if pool == "threads":
        assert pids == {os.getpid()}
    else:
        assert pids and os.getpid() not in pids


async def test_load_batch_is_called_once_per_batch_with_its_handles() -> None:
    sink = Keeping()
    async with Engine(spec("wd_batch_io:load_batch_recording"), sink=sink) as eng:
        report = await eng.wait()
    assert report.counts.done == COUNT
    assert sorted(h for batch in wd_batch_io.LOADS for h in batch) == list(range(COUNT))  # each item once
    for batch in wd_batch_io.LOADS:  # each row knows how many items its call was handed
        assert {int(sink.out[f"t{h:05d}"].reshape(-1)[1]) - 1 for h in batch} == {len(batch)}


@pytest.mark.parametrize("pool", ["threads", "processes"])
async def test_a_batch_that_raises_is_loaded_again_item_by_item_so_only_the_bad_item_fails(
        pool: str, tmp_path: Path) -> None:
    sink = Keeping()
    async with Engine(spec("wd_batch_io:load_batch_raising", load="wd_batch_io:load_one", pool=pool),
                      sink=sink) as eng:
        report = await eng.wait()
        bad = eng.task_detail("t00007")
    assert report.counts.done == COUNT - 1 and report.counts.failed == 1
    assert refused(tmp_path) and len(refused(tmp_path)[0]) > 1  # the whole batch was refused first
    assert bad is not None and "record 7 is bad on its own" in bad.error  # load's own error, not the batch's
    assert 'wd_batch_io.py", line' in bad.traceback
    # The rest of the refused batch was loaded by load, one at a time, in the right rows.
    assert_loaded_in_batches(sink.out, {f"t{i:05d}" for i in range(COUNT)} - {"t00007"})


@pytest.mark.parametrize("pool", ["threads", "processes"])
async def test_without_load_every_item_of_a_batch_that_raises_fails_with_its_traceback(
        pool: str, tmp_path: Path) -> None:
    sink = Keeping()
    async with Engine(spec("wd_batch_io:load_batch_raising", pool=pool, attempts=1), sink=sink) as eng:
        report = await eng.wait()
        (batch,) = refused(tmp_path)
        details = {h: eng.task_detail(f"t{h:05d}") for h in batch}
    assert len(batch) > 1 and 7 in batch
    assert report.counts.failed == len(batch) and report.counts.done == COUNT - len(batch)
    assert not {f"t{h:05d}" for h in batch} & set(sink.out)
    for h, detail in details.items():
        assert detail is not None and detail.state == "failed", h
        assert "batch with bad record 7" in detail.error
        assert 'wd_batch_io.py", line' in detail.traceback and "load_batch_raising" in detail.traceback


async def test_without_load_a_retried_batch_sorts_the_good_items_from_the_bad() -> None:
    # Retries go one task per batch (retry.isolate): each good item of the refused batch passes alone.
    sink = Keeping()
    async with Engine(spec("wd_batch_io:load_batch_raising", attempts=3), sink=sink) as eng:
        report = await eng.wait()
        bad = eng.task_detail("t00007")
    assert report.counts.done == COUNT - 1 and report.counts.failed == 1
    assert bad is not None and bad.attempt == 3 and "batch with bad record 7" in bad.error


@pytest.mark.parametrize("pool", ["threads", "processes"])
async def test_a_wrong_number_of_answers_fails_every_item_saying_so(pool: str) -> None:
    async with Engine(spec("wd_batch_io:load_batch_short", pool=pool, attempts=1), sink=Keeping()) as eng:
        report = await eng.wait()
        detail = eng.task_detail("t00000")
    assert report.counts.failed == COUNT and report.counts.done == 0
    assert detail is not None and "load_batch returned" in detail.error
    assert "ValueError: load_batch returned" in detail.traceback
    said = re.search(r"returned (\d+) entries for a batch of (\d+) items", detail.error)
    assert said is not None and int(said[1]) == int(said[2]) - 1, detail.error


@pytest.mark.parametrize("pool", ["threads", "processes"])
async def test_an_item_load_batch_reports_fails_alone(pool: str) -> None:
    sink = Keeping()
    async with Engine(spec("wd_batch_io:load_batch_some_fail", pool=pool), sink=sink) as eng:
        report = await eng.wait()
        bad = eng.task_detail("t00013")
    assert report.counts.done == COUNT - 1 and report.counts.failed == 1
    assert bad is not None and bad.attempt == 1 and "checksum mismatch" in bad.error  # an InputError: not retried
    assert_loaded_in_batches(sink.out, {f"t{i:05d}" for i in range(COUNT)} - {"t00013"})


def test_an_items_source_with_neither_load_nor_load_batch_is_refused_naming_both() -> None:
    with pytest.raises(SpecError) as info:
        spec(load_batch=None)
    (issue,) = info.value.issues
    assert issue.loc == "source"
    assert "needs load (one item at a time) or load_batch (a batch at a time)" in issue.message
    assert info.value.file == "<test>"


def test_a_load_batch_that_cannot_be_imported_is_reported_at_its_field() -> None:
    with pytest.raises(SpecError) as info:
        spec("wd_batch_io:no_such_loader")
    assert [i.loc for i in info.value.issues] == ["source.load_batch"]


def test_a_load_batch_defined_in_main_is_refused_for_worker_processes_at_once() -> None:
    def fetch(handles: Any, out: np.ndarray) -> None:
        pass

    fetch.__module__ = "__main__"
    with pytest.raises(ValueError, match="defined in __main__"):
        ProcessPool("t", ItemLoader(wd_batch_io.load_one, fetch), 1)


# -- write_batch -----------------------------------------------------------------------------------
async def test_a_callable_sink_with_write_batch_gets_each_batch_in_one_call() -> None:
    s = spec("wd_batch_io:load_batch_recording", sink={"kind": "callable", "write_batch": "wd_batch_io:write_batch"})
    async with Engine(s) as eng:
        report = await eng.wait()
    assert report.counts.done == COUNT
    written = sorted(keys for keys, _ in wd_batch_io.WRITES)
    loaded = sorted(tuple(f"t{h:05d}" for h in batch) for batch in wd_batch_io.LOADS)
    assert len(wd_batch_io.WRITES) == len(wd_batch_io.LOADS) and written == loaded  # one call per batch
    for keys, outputs in wd_batch_io.WRITES:
        assert outputs.shape == (len(keys), *ROW)
        for key, out in zip(keys, outputs, strict=True):
            assert (out.reshape(-1)[2:] == int(key[1:]) + 1).all(), key
            assert int(out.reshape(-1)[1]) - 1 == len(keys)


async def test_a_raising_write_batch_fails_its_batch_and_the_retries_go_one_task_at_a_time() -> None:
    s = spec(sink={"kind": "callable", "write_batch": "wd_batch_io:write_batch_failing"})
    async with Engine(s) as eng:
        report = await eng.wait()
        bad = eng.task_detail("t00007")
        others = [eng.task_detail(f"t{i:05d}") for i in range(COUNT)]
    assert report.counts.done == COUNT - 1 and report.counts.failed == 1
    assert bad is not None and bad.attempt == 3 and "refused a batch holding t00007" in bad.error
    retried = {d.key for d in others if d is not None and d.state == "done" and d.attempt == 2}
    assert retried  # the bad key's batch-mates failed with it once, then were written alone
    written = {k for keys, _ in wd_batch_io.WRITES for k in keys}
    assert written == {f"t{i:05d}" for i in range(COUNT)} - {"t00007"}
    assert all(len(keys) == 1 for keys, _ in wd_batch_io.WRITES if set(keys) & retried)


def test_a_callable_sink_writes_a_lone_output_as_a_batch_of_one(tmp_path: Path) -> None:
    s = spec(sink={"kind": "callable", "write_batch": "wd_batch_io:write_batch"})
    sink = open_sink(s.sink, tmp_path)
    assert batch_writer(sink) is not None
    sink.write("k1", np.arange(3.0))
    ((keys, outputs),) = wd_batch_io.WRITES
    assert keys == ("k1",) and outputs.tolist() == [[0.0, 1.0, 2.0]]


def test_a_callable_sink_without_write_batch_has_no_write_batch(tmp_path: Path) -> None:
    sink = open_sink(spec(sink={"kind": "callable", "target": "wd_batch_io:write_one"}).sink, tmp_path)
    assert not hasattr(sink, "write_batch") and batch_writer(sink) is None


def test_a_callable_sink_with_neither_target_nor_write_batch_is_refused_naming_both() -> None:
    with pytest.raises(SpecError) as info:
        spec(sink={"kind": "callable"})
    (issue,) = info.value.issues
    assert issue.loc == "sink"
    assert "needs target (one output at a time) or write_batch (a batch at a time)" in issue.message
