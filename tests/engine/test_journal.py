"""The journal and resume, on real SQLite files and real run directories (engine/edges/journal.py, resume.py)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_build import spec
from wd_stages import POISON, RecordingSink, SleepySource

from warpdeck.engine.api import Engine, IterableSource, RunReport, SpecMismatch, parse_spec
from warpdeck.engine.edges.journal import _TUNING, JOURNAL_NAME, Journal, RunDirBusy, _identity, spec_identity
from warpdeck.engine.edges.resume import IN_FLIGHT_REASON
from warpdeck.engine.edges.sinks import CHECKSUMS, TMP_SUFFIX, NpyDirSinkImpl
from warpdeck.engine.state.task_states import State

N = 48


def _npy_spec(tmp_path: Path, **kw: Any):
    base = {"source": {"kind": "synthetic", "count": N, "shape": [4], "dtype": "float64", "seed": 3},
            "sink": {"kind": "npy_dir", "path": "outputs"}, "batch_size": 8}
    base.update(kw)
    return spec(**base)


async def _run(s, run_dir: Path, **kw: Any) -> tuple[RunReport, Engine]:
    async with Engine(s, run_dir, **kw) as eng:
        return await eng.wait(), eng


def _db(run_dir: Path) -> sqlite3.Connection:
    return sqlite3.connect(run_dir / JOURNAL_NAME)


def _states(run_dir: Path) -> dict[str, tuple[int, int]]:
    with _db(run_dir) as c:
        return {k: (s, a) for k, s, a in c.execute("SELECT key, state, attempts FROM tasks")}


async def test_a_run_journals_every_task_done_with_the_spec_identity_in_wal_mode(tmp_path: Path) -> None:
    s = _npy_spec(tmp_path)
    report, _ = await _run(s, tmp_path)
    assert report.counts.done == N and report.resume is not None and not report.resume.resumed
    assert _states(tmp_path) == {f"syn-{i:08d}": (int(State.DONE), 1) for i in range(N)}
    with _db(tmp_path) as c:
        meta = dict(c.execute("SELECT name, value FROM meta"))
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        batches = {b for (b,) in c.execute("SELECT batch FROM tasks")}
    assert (meta["spec_name"], meta["spec_digest"]) == (spec_identity(s).name, spec_identity(s).digest)
    assert len(batches) == N // 8  # the lease (batch id) of each task's last attempt is kept


async def test_running_the_same_spec_again_skips_every_done_task_without_reading_or_writing(tmp_path: Path) -> None:
    s = spec(batch_size=8)
    src1, sink1 = SleepySource(40), RecordingSink()
    await _run(s, tmp_path, source=src1, sink=sink1)
    src2, sink2 = SleepySource(40), RecordingSink()
    report, _ = await _run(s, tmp_path, source=src2, sink=sink2)
    assert src2.loads == 0 and sink2.writes == {}
    assert report.counts.total == 0 and report.counts.skipped_done == 40
    assert report.resume is not None and report.resume.resumed and report.exit_code == 0


async def _killed_run(s, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run whose journal and outputs then look as a kill leaves them (see each caller): the outputs
    directory keeps its checksums, as a run that never finished does."""
    with monkeypatch.context() as m:
        m.setattr(NpyDirSinkImpl, "settle", lambda self: None)
        await _run(s, tmp_path)
    out = tmp_path / "outputs"
    assert (out / CHECKSUMS).is_file()
    return out


def _outputs(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in out.glob("*.npy")}


async def test_in_flight_tasks_are_requeued_as_a_new_attempt_and_outputs_already_in_place_are_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _npy_spec(tmp_path)
    out = await _killed_run(s, tmp_path, monkeypatch)
    before = _outputs(out)
    # What a kill leaves: tasks journaled running, some with their output renamed into place
    # (killed after the rename, before the done commit), some without (killed mid-batch).
    lost, renamed = ["syn-00000003", "syn-00000004"], ["syn-00000005"]
    with _db(tmp_path) as c:
        c.executemany("UPDATE tasks SET state=1, attempts=1 WHERE key=?", [(k,) for k in lost + renamed])
    for k in lost:
        (out / f"{k}.npy").unlink()
    report, eng = await _run(s, tmp_path)
    assert report.exit_code == 0
    assert (report.counts.total, report.counts.done, report.counts.skipped_done) == (2, 2, N - 2)
    assert report.resume is not None
    assert (report.resume.requeued_in_flight, report.resume.outputs_recovered) == (2, 1)
    d = eng.task_detail("syn-00000003")
    assert d is not None and d.state == "done" and d.attempt == 2
    assert [(h.outcome, h.reason) for h in d.history] == [("requeued", IN_FLIGHT_REASON)]
    after = _outputs(out)
    assert after.keys() == before.keys()
    assert after["syn-00000005.npy"] == before["syn-00000005.npy"]  # never written again
    assert not (out / CHECKSUMS).exists()  # the run finished: every output is journaled
    assert _states(tmp_path)["syn-00000003"] == (int(State.DONE), 2)
    with _db(tmp_path) as c:
        hist = c.execute("SELECT attempt, outcome FROM history WHERE key='syn-00000003'").fetchall()
    assert hist == [(1, "requeued")]


async def test_an_output_in_place_that_fails_its_checksum_is_removed_and_its_task_runs_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _npy_spec(tmp_path)
    out = await _killed_run(s, tmp_path, monkeypatch)
    good = {p.name: np.load(p) for p in out.glob("*.npy")}
    # Three outputs landed without a done row: one whole, one holding another task's values (what a
    # buffer reused under a sink thread wrote), one with no checksum (landed by an older warpdeck).
    whole, swapped, unlogged = "syn-00000005", "syn-00000006", "syn-00000007"
    with _db(tmp_path) as c:
        c.executemany("UPDATE tasks SET state=1, attempts=1 WHERE key=?", [(k,) for k in (whole, swapped, unlogged)])
    np.save(out / f"{swapped}.npy", good["syn-00000010.npy"])
    log = (out / CHECKSUMS).read_text().splitlines()
    (out / CHECKSUMS).write_text("".join(f"{line}\n" for line in log if not line.startswith(unlogged)))
    inode = (out / f"{whole}.npy").stat().st_ino
    report, _ = await _run(s, tmp_path)
    assert report.exit_code == 0 and report.resume is not None
    assert (report.resume.outputs_recovered, report.resume.outputs_rejected) == (1, 2)
    assert (report.counts.done, report.counts.skipped_done) == (2, N - 2)
    assert (out / f"{whole}.npy").stat().st_ino == inode  # verified, never written again
    for name, value in good.items():  # the rejected ones were written again, with their own values
        np.testing.assert_array_equal(np.load(out / name), value)
    assert _states(tmp_path)[swapped] == (int(State.DONE), 2)


async def test_a_run_directory_made_by_another_spec_is_refused_naming_both(tmp_path: Path) -> None:
    await _run(_npy_spec(tmp_path, name="first"), tmp_path)
    with pytest.raises(SpecMismatch) as info:
        await _run(_npy_spec(tmp_path, name="second"), tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg and "'first'" in msg and "'second'" in msg
    # the same name with other content is refused too; tuning fields are not part of the identity
    with pytest.raises(SpecMismatch):
        await _run(_npy_spec(tmp_path, name="first", source={"kind": "synthetic", "count": N + 1,
                                                              "shape": [4], "dtype": "float64"}), tmp_path)
    report, _ = await _run(_npy_spec(tmp_path, name="first", batch_size=4, lanes=2), tmp_path)
    assert report.counts.skipped_done == N


async def test_host_threads_may_change_on_resume_as_advise_recommends(tmp_path: Path) -> None:
    # Issue 28, item 5: `[host]` only tunes (threads per host phase), but a resume with other thread
    # counts was refused, naming host.fill_workers, though `warpdeck advise` recommends exactly those.
    first, _ = await _run(_npy_spec(tmp_path, host={"fill_workers": 1}), tmp_path)
    assert first.counts.done == N
    again, _ = await _run(_npy_spec(tmp_path, host={"fill_workers": 3, "sink_workers": 2}), tmp_path)
    assert again.counts.skipped_done == N


async def test_a_journal_whose_identity_still_holds_host_resumes_and_takes_todays(tmp_path: Path) -> None:
    # Journals made before `[host]` became a tuning field hashed it into their identity: they resume,
    # and from then on carry the identity without it. A field that decides the outputs still refuses.
    s = _npy_spec(tmp_path, host={"fill_workers": 2})
    data = s.model_dump(mode="json", exclude=_TUNING - {"host"})
    for stage in data["stages"]:
        stage.pop("deadline_s", None)
    legacy = _identity(s.name, data)
    assert legacy.digest != spec_identity(s).digest
    journal, _ = Journal.open(tmp_path, legacy)
    journal.close()
    report, _ = await _run(_npy_spec(tmp_path, host={"fill_workers": 1}), tmp_path)
    assert report.counts.done == N
    with _db(tmp_path) as c:
        assert dict(c.execute("SELECT name, value FROM meta"))["spec_digest"] == spec_identity(s).digest
    legacy_other = Journal.open(tmp_path / "other", legacy)[0]
    legacy_other.close()
    with pytest.raises(SpecMismatch):
        await _run(_npy_spec(tmp_path, stages=["wd_stages:add_one"]), tmp_path / "other")


async def test_a_journal_made_before_a_field_was_added_resumes_while_the_field_is_left_null(tmp_path: Path) -> None:
    # A callable sink's write_batch came later: a journal of a spec with a callable sink, made
    # before, holds no such key. Today's spec leaves it null, which is what its absence meant.
    s = parse_spec({"name": "added-field", "backend": "numpy", "batch_size": 4,
                    "source": {"kind": "synthetic", "count": N, "shape": [4], "dtype": "float64"},
                    "sink": {"kind": "callable", "target": "wd_batch_io:write_one"},
                    "stages": [{"fn": "wd_stages:double"}]}, "<test>")
    data = s.model_dump(mode="json", exclude=_TUNING)
    for stage in data["stages"]:
        stage.pop("deadline_s", None)
    assert data["sink"].pop("write_batch", "absent") is None
    before = _identity(s.name, data)
    assert before.digest != spec_identity(s).digest
    Journal.open(tmp_path / "old", before)[0].close()
    resumed, _ = Journal.open(tmp_path / "old", spec_identity(s))  # not refused: SpecMismatch otherwise
    resumed.close()
    # A value where the journal had none is a different spec.
    batched = s.model_copy(update={"sink": s.sink.model_copy(update={"write_batch": "wd_batch_io:write_batch"})})
    Journal.open(tmp_path / "other", before)[0].close()
    with pytest.raises(SpecMismatch):
        Journal.open(tmp_path / "other", spec_identity(batched))


async def test_stale_temp_files_of_a_killed_run_are_removed_on_resume(tmp_path: Path) -> None:
    s = _npy_spec(tmp_path)
    await _run(s, tmp_path)
    stale = tmp_path / "outputs" / f".syn-00000001.npy.4242{TMP_SUFFIX}"
    stale.write_bytes(b"half a file")
    report, _ = await _run(s, tmp_path)
    assert not stale.exists()
    assert report.resume is not None and report.resume.temps_cleaned == 1


def _poisoned(n: int, bad: set[int]) -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:03d}", np.full(4, POISON if i in bad else float(i))) for i in range(n)]


async def test_failed_tasks_stay_failed_on_resume_unless_retry_failed_is_asked(tmp_path: Path) -> None:
    s = spec(["wd_stages:poison"], batch_size=1, retry={"max_attempts": 1})
    first, _ = await _run(s, tmp_path, source=IterableSource(_poisoned(8, {2})), sink=RecordingSink())
    assert first.counts.failed == 1
    # resumed without the flag: still failed with its reason and attempt, and not run again
    sink = RecordingSink()
    again, eng = await _run(s, tmp_path, source=IterableSource(_poisoned(8, set())), sink=sink)
    assert (again.counts.total, again.counts.failed, again.exit_code) == (1, 1, 1)
    assert "poisoned input" in again.failures[0].reason and sink.writes == {}
    d = eng.task_detail("k002")
    assert d is not None and d.attempt == 1 and "in poison" in d.traceback
    # asked to retry (the input was fixed meanwhile): a new attempt, the failure kept in history
    sink = RecordingSink()
    fixed, eng = await _run(s, tmp_path, source=IterableSource(_poisoned(8, set())), sink=sink,
                            retry_failed=True)
    assert (fixed.counts.done, fixed.exit_code) == (1, 0) and set(sink.writes) == {"k002"}
    assert fixed.resume is not None and fixed.resume.retried_failed == 1
    d = eng.task_detail("k002")
    assert d is not None and d.attempt == 2 and d.history[0].outcome == "failed"
    assert "poisoned input" in d.history[0].reason


async def test_a_second_engine_on_a_busy_run_directory_is_refused(tmp_path: Path) -> None:
    s = spec(batch_size=8)
    async with Engine(s, tmp_path, source=SleepySource(40, fill_s=0.01), sink=RecordingSink()) as a:
        with pytest.raises(RunDirBusy):
            async with Engine(s, tmp_path, source=SleepySource(40), sink=RecordingSink()):
                pass
        await a.wait()


async def test_a_done_row_always_has_its_output_in_place_during_a_run(tmp_path: Path) -> None:
    s = _npy_spec(tmp_path, source={"kind": "synthetic", "count": 400, "shape": [4], "dtype": "float64"},
                  stages=["wd_stages:sleep_2ms"], batch_size=4)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        # A reader beside the writer, as the control room or an operator's sqlite3 would be.
        while not stop.is_set():
            if (tmp_path / JOURNAL_NAME).exists():
                with _db(tmp_path) as c:
                    try:
                        done = [k for (k,) in c.execute("SELECT key FROM tasks WHERE state = 2")]
                    except sqlite3.OperationalError as exc:  # the file exists before its schema does
                        if "no such table" not in str(exc):
                            raise
                        stop.wait(0.005)
                        continue
                missing = [k for k in done if not (tmp_path / "outputs" / f"{k}.npy").is_file()]
                assert not missing, missing
                seen.append(len(done))
            stop.wait(0.005)

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            watch()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=guarded)
    t.start()
    try:
        report, _ = await _run(s, tmp_path)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert report.counts.done == 400
    assert any(0 < n < 400 for n in seen), "the watcher never saw the run in progress"


async def test_without_a_run_directory_nothing_is_journaled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    report = await _run_no_dir()
    assert report.resume is None
    assert not list(tmp_path.rglob(JOURNAL_NAME))  # noqa: ASYNC240 - the run is over: nothing else uses the loop


async def _run_no_dir() -> RunReport:
    async with Engine(spec(), source=SleepySource(16), sink=RecordingSink()) as eng:
        return await eng.wait()


async def test_a_schema_1_journal_numbered_from_0_is_renumbered_from_1_once_when_opened(tmp_path: Path) -> None:
    s = spec(["wd_stages:poison"], batch_size=1, retry={"max_attempts": 3})
    await _run(s, tmp_path, source=IterableSource(_poisoned(4, {2})), sink=RecordingSink())
    with _db(tmp_path) as c:  # the same run as schema 1 journaled it: attempts from 0
        c.execute("UPDATE tasks SET attempts = attempts - 1")
        c.execute("UPDATE history SET attempt = -(attempt - 1)")
        c.execute("UPDATE history SET attempt = -attempt")
        c.execute("UPDATE meta SET value = '1' WHERE name = 'schema'")
    for _ in range(2):  # renumbered once: a second open changes nothing
        _, eng = await _run(s, tmp_path, source=IterableSource(_poisoned(4, {2})), sink=RecordingSink())
        d = eng.task_detail("k002")
        assert d is not None and d.state == "failed" and d.attempt == 3
        assert [h.attempt for h in d.history] == [1, 2]
        assert _states(tmp_path) == {"k000": (int(State.DONE), 1), "k001": (int(State.DONE), 1),
                                     "k002": (int(State.FAILED), 3), "k003": (int(State.DONE), 1)}
        with _db(tmp_path) as c:
            assert c.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() == ("2",)


def test_tasks_started_and_done_in_one_commit_are_written_once_and_end_as_both_would_leave_them(
        tmp_path: Path) -> None:
    from warpdeck.engine.edges.journal import SpecIdentity
    from warpdeck.engine.state.tasks import TaskAttempt

    keys = [f"t{i}" for i in range(13)]
    journal, _ = Journal.open(tmp_path, SpecIdentity("once", "0"), interval=3600)  # one commit, at flush
    journal.attach(keys)
    rows = np.arange(13, dtype=np.int64)
    journal.admitted(rows)
    journal.started(rows[:4], 5, np.full(4, 2, np.int16))            # batch 5: rows 0-3
    journal.started(rows[4:8], 6, np.full(4, 1, np.int16))           # batch 6: rows 4-7, pipelined
    journal.finished(rows[:3])                                       # 3 of batch 5 done, row 3 still running
    journal.requeued(["t4"], [2], [TaskAttempt(1, "requeued", 1.0, "worker lost")])  # by key: stops a merge
    journal.finished(rows[5:8])                                      # batch 6's rest: written on their own
    journal.started(rows[8:10], 7, np.full(2, 3, np.int16))
    journal.finished(rows[8:10])
    # Batches of one task, pipelined: 8 and 9 both done, 10 still running at the commit.
    for r, batch in ((10, 8), (11, 9), (12, 10)):
        journal.started(rows[r:r + 1], batch, np.ones(1, np.int16))
        if r > 10:
            journal.finished(rows[r - 1:r])
    assert journal.flush(10)
    journal.close()
    with sqlite3.connect(tmp_path / JOURNAL_NAME) as c:
        got = {k: (s, b, a) for k, s, b, a in c.execute("SELECT key, state, batch, attempts FROM tasks")}
    assert got == {
        "t0": (2, 5, 2), "t1": (2, 5, 2), "t2": (2, 5, 2), "t3": (1, 5, 2),
        "t4": (0, -1, 2), "t5": (2, 6, 1), "t6": (2, 6, 1), "t7": (2, 6, 1),
        "t8": (2, 7, 3), "t9": (2, 7, 3), "t10": (2, 8, 1), "t11": (2, 9, 1), "t12": (1, 10, 1)}
