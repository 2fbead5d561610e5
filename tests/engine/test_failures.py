"""A failing stage, input or sink fails its own task with the reason kept; the rest finish."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from wd_build import spec
from wd_stages import POISON, RecordingSink

from warpdeck.engine.api import Engine, IterableSource, RunReport


def _arrays(n: int, poison_at: set[int] = frozenset()) -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:04d}", np.full(4, POISON if i in poison_at else float(i))) for i in range(n)]


async def _run(s, source, sink) -> tuple[RunReport, Engine]:
    async with Engine(s, source=source, sink=sink) as eng:
        return await eng.wait(), eng


async def test_raising_stage_fails_only_the_bad_task_after_retries() -> None:
    s = spec(["wd_stages:poison"], batch_size=8, retry={"max_attempts": 3})
    sink = RecordingSink()
    report, eng = await _run(s, IterableSource(_arrays(40, {13})), sink)
    assert (report.counts.done, report.counts.failed) == (39, 1)
    assert report.exit_code == 1
    detail = eng.task_detail("k0013")
    assert detail is not None and detail.state == "failed"
    assert detail.attempt == 3  # three attempts: 1, 2, 3
    assert "ValueError: poisoned input" in detail.error
    assert "def poison" in detail.traceback or "in poison" in detail.traceback
    assert [h.outcome for h in detail.history] == ["failed", "failed"]
    assert [f.key for f in report.failures] == ["k0013"]
    assert "poisoned input" in report.failures[0].reason
    assert "k0013" not in sink.out and len(sink.out) == 39


async def test_innocent_neighbours_of_a_failed_batch_are_retried_and_finish() -> None:
    s = spec(["wd_stages:poison"], batch_size=8, retry={"max_attempts": 2})
    _, eng = await _run(s, IterableSource(_arrays(16, {3})), RecordingSink())
    neighbour = eng.task_detail("k0004")
    assert neighbour is not None and neighbour.state == "done"
    assert neighbour.attempt == 2 and neighbour.history[0].outcome == "failed"


async def test_no_retry_policy_fails_whole_batch_once() -> None:
    s = spec(["wd_stages:poison"], batch_size=4, retry={"max_attempts": 1})
    report, _ = await _run(s, IterableSource(_arrays(8, {1})), RecordingSink())
    assert (report.counts.done, report.counts.failed) == (4, 4)


async def test_sink_error_is_retried_then_succeeds() -> None:
    sink = RecordingSink(fail_keys=["k0002"], fail_times=1)
    s = spec(["wd_stages:double"], batch_size=4, retry={"max_attempts": 2})
    report, eng = await _run(s, IterableSource(_arrays(8)), sink)
    assert report.counts.done == 8
    assert sink.writes["k0002"] == 1
    detail = eng.task_detail("k0002")
    assert detail is not None and "Connection reset by peer" in detail.history[0].reason


async def test_sink_error_past_the_limit_fails_with_reason() -> None:
    sink = RecordingSink(fail_keys=["k0002"], fail_times=5)
    s = spec(["wd_stages:double"], batch_size=4, retry={"max_attempts": 2})
    report, _ = await _run(s, IterableSource(_arrays(8)), sink)
    assert (report.counts.done, report.counts.failed) == (7, 1)
    assert "Connection reset by peer" in report.failures[0].reason


async def test_corrupt_and_misshapen_npy_inputs_fail_alone_without_retry(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    for i in range(10):
        np.save(data / f"f{i:02d}.npy", np.full(4, float(i)))
    (data / "f03.npy").write_bytes(b"\x93NUMPY garbage")
    np.save(data / "f05.npy", np.zeros(5))
    full = (data / "f07.npy").read_bytes()
    (data / "f07.npy").write_bytes(full[:-8])
    s = spec(["wd_stages:double"], batch_size=4,
             source={"kind": "npy_dir", "path": str(data), "shape": [4], "dtype": "float64"},
             sink={"kind": "npy_dir", "path": str(tmp_path / "out")})
    report, eng = await _run(s, None, None)
    assert (report.counts.done, report.counts.failed) == (7, 3)
    reasons = {f.key: f.reason for f in report.failures}
    assert "shape [5], expected [4]" in reasons["f05"]
    assert "truncated" in reasons["f07"]
    assert "f03" in reasons
    assert all(eng.task_detail(k).attempt == 1 for k in reasons)  # input errors are not retried
    outs = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert outs == [f"f{i:02d}.npy" for i in (0, 1, 2, 4, 6, 8, 9)]
    assert np.array_equal(np.load(tmp_path / "out" / "f04.npy"), np.full(4, 8.0))


async def test_bad_keys_from_an_iterable_fail_at_admission() -> None:
    items = [*_arrays(4), ("bad/key", np.zeros(4))]
    report, _ = await _run(spec(), IterableSource(items), RecordingSink())
    assert (report.counts.done, report.counts.failed) == (4, 1)
    assert "bad/key" in report.failures[0].key


async def test_attempts_are_numbered_from_one_in_the_table_detail_history_report_journal_and_wire(
        tmp_path: Path) -> None:
    import sqlite3

    from warpdeck.engine.control.telemetry import summarize
    from warpdeck.engine.edges.journal import JOURNAL_NAME

    s = spec(["wd_stages:poison"], batch_size=1, retry={"max_attempts": 2})
    report, eng = await _run_in(s, tmp_path, IterableSource(_arrays(4, {2})))
    snap = eng.snapshot()
    assert snap.tasks.attempt.tolist() == [1, 1, 2, 1]  # the first attempt is 1; k0002 failed twice
    d = eng.task_detail("k0002")
    assert d is not None and d.state == "failed" and d.attempt == 2
    assert [(h.attempt, h.outcome) for h in d.history] == [(1, "failed")]
    assert [(f.key, f.attempt) for f in report.failures] == [("k0002", 2)]
    assert [(f.key, f.attempt) for f in summarize(snap, 0.0).failures] == [("k0002", 2)]
    with sqlite3.connect(tmp_path / JOURNAL_NAME) as c:
        assert dict(c.execute("SELECT key, attempts FROM tasks")) == {"k0000": 1, "k0001": 1, "k0002": 2, "k0003": 1}
        assert c.execute("SELECT key, attempt, outcome FROM history").fetchall() == [("k0002", 1, "failed")]


async def _run_in(s, run_dir: Path, source) -> tuple[RunReport, Engine]:
    async with Engine(s, run_dir, source=source, sink=RecordingSink()) as eng:
        return await eng.wait(), eng
