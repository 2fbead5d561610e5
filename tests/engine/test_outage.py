"""Outages on a real disk: outputs and journal on a small tmpfs that fills, or is remounted
read-only, mid-run. The run pauses with the reason, fails nothing and burns no attempt, carries on
by itself when the disk comes back, and after ``[faults] outage_timeout_s`` stops with a report so
that a plain resume finishes the work: 0 lost, 0 doubled throughout.

Mounting needs root and mount(8) (the CI machine has both); where it is refused the tests skip
with the reason, and test_bad_input.py covers the same logic with injected errors.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_build import spec
from wd_cli import COMMAND, cli_env, warpdeck

from warpdeck.engine.api import Engine, ExitStatus, IterableSource, JournalError, RunEvent, RunReport, StallEvent
from warpdeck.engine.edges.journal import Journal
from warpdeck.engine.edges.outage import environment_cause

ROW = 2048  # float64 values per output: 16 KiB of data (+128 bytes of header) per file
Mount = Callable[[str], Path]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Mount]:
    """Mount a tmpfs of the given size (``"1m"``) under tmp_path; unmounted at the end."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); test_bad_input.py injects the same errors")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        mnt = tmp_path / f"fs{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                           capture_output=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True, capture_output=True)


def _fill(mnt: Path, leave: int) -> Path:
    """A file that leaves about ``leave`` bytes free on ``mnt`` (none made when the run's own writes
    filled it first: then it is as full as asked)."""
    st = os.statvfs(mnt)
    filler = mnt / "filler"
    try:
        filler.write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))
    except OSError as exc:
        if exc.errno != errno.ENOSPC or leave:
            raise
    return filler


def _items(n: int) -> list[tuple[str, np.ndarray]]:
    return [(f"k{i:04d}", np.full(ROW, float(i))) for i in range(n)]


def _spec(out: Path, **kw: Any):
    return spec(["wd_stages:double"], batch_size=4, sink={"kind": "npy_dir", "path": str(out)}, **kw)


async def _until(cond: Callable[[], object], limit_s: float = 20.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def _check_outputs(out: Path, n: int, plus: float = 0.0) -> None:
    """Every output there, whole and right (``2 * i + plus``); no temp file left."""
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert sorted(p.stem for p in out.glob("*.npy")) == [f"k{i:04d}" for i in range(n)]
    for p in out.glob("*.npy"):
        np.testing.assert_array_equal(np.load(p), np.full(ROW, 2.0 * int(p.stem[1:]) + plus))


async def _hold_then(eng: Engine, then: Callable[[], None]) -> str:
    """Wait until the run is in an outage, check it is held as such, then call ``then``."""
    await _until(lambda: eng.outage.view() is not None and eng.snapshot().counts.stalled["control"] > 0)
    snap = eng.snapshot()
    assert snap.outage is not None and snap.feeder.state == "outage"
    assert snap.counts.failed == 0
    reason = snap.outage.reason
    assert {s.note for s in snap.stalled if s.reason == "control"} == {reason}
    admitted = snap.counts.total
    # The held writes are retried for a while (engine time, not a bare sleep): nothing is admitted.
    await _until(lambda: (s := eng.snapshot()).outage is not None and s.t - s.outage.since >= 0.3)
    assert eng.snapshot().counts.total == admitted
    then()
    return reason


async def test_a_disk_that_fills_mid_run_pauses_it_and_it_carries_on_when_space_returns(tmpfs: Mount) -> None:
    mnt = tmpfs("2m")
    out = mnt / "out"
    out.mkdir()
    filler = _fill(mnt, leave=10 * 20_480)  # room for about 10 of the 60 outputs
    heard: list[RunEvent] = []
    async with Engine(_spec(out), source=IterableSource(_items(60))) as eng:
        eng.events.subscribe(heard.append)
        reason = await _hold_then(eng, filler.unlink)
        report = await eng.wait()
    assert reason == f"sink: no space left on device ({out}{os.sep})"
    # The hold is told to the exporters as a stall of every live task: its start, then its length.
    held = [(e.began, e.note) for e in heard if isinstance(e, StallEvent) and e.batch == -1]
    assert held[:2] == [(True, reason), (False, reason)]
    assert next(e for e in heard if isinstance(e, StallEvent) and e.batch == -1 and not e.began).lasted_s > 0.3
    assert (report.counts.done, report.counts.failed, report.exit_code) == (60, 0, ExitStatus.FINISHED)
    assert report.outages is not None and report.outages.count >= 1 and report.outages.total_s > 0.3
    assert all(eng.task_detail(k).attempt == 1 for k, _ in _items(60))  # no attempt burnt
    _check_outputs(out, 60)


async def test_outputs_and_journal_on_one_full_disk_hold_together_and_the_journal_ends_whole(tmpfs: Mount) -> None:
    mnt = tmpfs("3m")
    run_dir, out = mnt / "run", mnt / "run" / "out"
    out.mkdir(parents=True)
    items = _items(80)
    async with Engine(_spec(out), run_dir, source=IterableSource(items)) as eng:
        filler = _fill(mnt, leave=12 * 20_480)
        await _hold_then(eng, filler.unlink)
        report = await eng.wait()
    assert (report.counts.done, report.counts.failed, report.exit_code, report.journal_error) == (
        80, 0, ExitStatus.FINISHED, "")
    _check_outputs(out, 80)
    with sqlite3.connect(run_dir / "journal.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall() == [(2, 80)]


async def test_a_disk_remounted_read_only_holds_the_run_until_it_is_writable_again(tmpfs: Mount) -> None:
    mnt = tmpfs("4m")
    out = mnt / "out"
    out.mkdir()
    slow = spec(["wd_stages:slow_double_40ms"], batch_size=4, sink={"kind": "npy_dir", "path": str(out)})
    async with Engine(slow, source=IterableSource(_items(40))) as eng:
        await _until(lambda: eng.snapshot().counts.done >= 4)
        _remount(mnt, "ro")
        try:
            reason = await _hold_then(eng, lambda: _remount(mnt, "rw"))
        finally:
            _remount(mnt, "rw")
        report = await eng.wait()
    assert reason == f"sink: read-only file system ({out}{os.sep})"
    assert (report.counts.done, report.counts.failed, report.exit_code) == (40, 0, ExitStatus.FINISHED)
    _check_outputs(out, 40, plus=1.0)


async def test_an_outage_past_its_timeout_stops_the_run_with_a_report_and_a_plain_resume_finishes(
        tmpfs: Mount, tmp_path: Path) -> None:
    mnt = tmpfs("2m")
    out = mnt / "out"
    out.mkdir()
    run_dir = tmp_path / "run"  # the journal is on another disk: only the outputs' is full
    filler = _fill(mnt, leave=8 * 20_480)
    s = _spec(out, faults={"outage_timeout_s": 0.5})
    async with Engine(s, run_dir, source=IterableSource(_items(60))) as eng:
        report: RunReport = await eng.wait()
    assert (report.status, report.stopped_by, report.exit_code) == ("stopped", "outage", ExitStatus.OUTAGE)
    assert report.counts.failed == 0 and report.failures == [] and report.journal_error == ""
    assert report.outages is not None and report.outages.last.startswith("sink: no space left on device")
    assert 0 < report.counts.done < 60
    written = {p.stem for p in out.glob("*.npy")}
    filler.unlink()
    async with Engine(s, run_dir, source=IterableSource(_items(60))) as eng:
        again = await eng.wait()
    assert (again.counts.failed, again.exit_code) == (0, ExitStatus.FINISHED)
    assert again.resume is not None and again.counts.done + again.counts.skipped_done == 60
    # 0 doubled: what the first run wrote was taken as done (recovered or journaled), never written again
    assert again.resume.skipped_done >= len(written)
    _check_outputs(out, 60)


async def test_a_journal_on_a_full_disk_with_no_patience_stops_at_once_as_journal_unwritable(
        tmpfs: Mount, tmp_path: Path) -> None:
    mnt = tmpfs("1m")
    out = tmp_path / "out"  # the outputs' disk is fine; the journal's fills
    s = spec(["wd_stages:slow_double_40ms"], batch_size=4, sink={"kind": "npy_dir", "path": str(out)},
             faults={"outage_timeout_s": 0})
    async with Engine(s, mnt / "run", source=IterableSource(_items(400))) as eng:
        await _until(lambda: eng.snapshot().counts.done >= 8)
        _fill(mnt, leave=0)
        report = await eng.wait()  # how fast: benchmarks/faults.py
    assert eng.report is not None
    final = eng.report
    assert final.exit_code == ExitStatus.JOURNAL, (final.stopped_by, final.journal_error)
    assert "journal" in final.journal_error and final.counts.failed == 0
    assert report.stopped_by in ("outage", "journal")


async def test_a_run_directory_on_a_read_only_disk_is_refused_as_journal_unwritable(
        tmpfs: Mount, tmp_path: Path) -> None:
    mnt = tmpfs("1m")
    _remount(mnt, "ro")
    with pytest.raises(JournalError, match="Read-only file system"):
        async with Engine(_spec(tmp_path / "out"), mnt / "run", source=IterableSource(_items(4))):
            pass


async def test_an_output_directory_that_cannot_be_made_is_an_outage(tmpfs: Mount) -> None:
    mnt = tmpfs("1m")
    _remount(mnt, "ro")
    async with Engine(_spec(mnt / "out", faults={"outage_timeout_s": 0.3}), source=IterableSource(_items(4))) as eng:
        report = await eng.wait()
    assert (report.exit_code, report.counts.failed) == (ExitStatus.OUTAGE, 0)
    assert report.outages is not None and report.outages.last == f"sink: read-only file system ({mnt}{os.sep})"


def test_numpys_short_write_to_a_full_disk_is_an_environment_error(tmpfs: Mount) -> None:
    # np.save to a path writes through tofile, whose OSError on a full disk carries no errno: a user's
    # callable sink saving that way holds the run as an npy sink does, not fail its task.
    mnt = tmpfs("64k")
    with pytest.raises(OSError) as info:
        np.save(mnt / "big.npy", np.zeros(64 * 1024, np.float32))
    assert info.value.errno is None
    assert (environment_cause(info.value) or "").startswith("short write: the disk took ")


# -- without a tmpfs -------------------------------------------------------------------------------
@pytest.mark.parametrize(("err", "cause"), [
    (OSError(errno.ENOSPC, "x"), "no space left on device"),
    (OSError(errno.EROFS, "x"), "read-only file system"),
    (OSError(errno.EDQUOT, "x"), "disk quota exceeded"),
    (OSError(errno.EIO, "x"), "input/output error"),
    (PermissionError(errno.EACCES, "x"), "permission denied"),
    (OSError("16384 requested and 10208 written"), "short write: the disk took 10208 of 16384 items (full?)"),
    (OSError("16384 requested"), None),
    (OSError(errno.EISDIR, "x"), None),
    (FileNotFoundError(errno.ENOENT, "x"), None),
    (ValueError("bad"), None),
])
def test_environment_errors_are_told_apart_from_the_tasks_own(err: BaseException, cause: str | None) -> None:
    assert environment_cause(err) == cause
    wrapped = RuntimeError("sink failed")
    wrapped.__cause__ = err
    assert environment_cause(wrapped) == cause


def test_sqlite_errors_of_a_refusing_disk_are_environment_errors(tmp_path: Path) -> None:
    db = tmp_path / "j.sqlite"
    sqlite3.connect(db).execute("CREATE TABLE t(x)").connection.close()
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as info:
        ro.execute("INSERT INTO t VALUES (1)")
    assert environment_cause(info.value) == "read-only file system"
    with pytest.raises(sqlite3.OperationalError) as other:
        ro.execute("SELECT * FROM nowhere")
    assert environment_cause(other.value) is None


async def test_a_journal_that_fails_for_good_stops_the_run_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Injected: a journal that breaks for a reason other than its disk (a corrupt page) cannot be
    # made on demand. The real path (a full disk) is the test above.
    real = Journal._apply_ops
    broke: dict[str, float] = {}

    def breaking(self: Journal, ops: list[Any]) -> None:
        if any(op[0] == "done" for op in ops) and "at" not in broke:
            broke["at"] = 1.0
            raise sqlite3.DatabaseError("database disk image is malformed")
        real(self, ops)

    monkeypatch.setattr(Journal, "_apply_ops", breaking)
    s = spec(["wd_stages:slow_double_40ms"], batch_size=4, sink={"kind": "npy_dir", "path": str(tmp_path / "out")})
    async with Engine(s, tmp_path / "run", source=IterableSource(_items(400))) as eng:
        report = await eng.wait()  # how fast (under 1 s): benchmarks/faults.py
    assert "at" in broke
    assert (report.stopped_by, report.exit_code, report.counts.failed) == ("journal", ExitStatus.JOURNAL, 0)
    assert "database disk image is malformed" in report.journal_error
    assert report.counts.done < 400


# -- from the command line -------------------------------------------------------------------------
CLI_SPEC = """
name = "outage-cli"
backend = "numpy"
batch_size = 4
[source]
kind = "synthetic"
count = 60
shape = [2048]
dtype = "float64"
[sink]
kind = "npy_dir"
path = "{out}"
[[stages]]
fn = "wd_stages:{fn}"
[faults]
outage_timeout_s = {timeout}
"""


def _warpdeck(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return warpdeck("run", *args, "--headless", "--broker", "none", cwd=cwd, columns=160)


def _cli_spec(tmp_path: Path, out: Path, timeout: float, fn: str = "double") -> str:
    p = tmp_path / "spec.toml"
    p.write_text(CLI_SPEC.format(out=out, timeout=timeout, fn=fn))
    return str(p)


def test_the_command_line_exits_5_on_an_outage_with_its_lines_and_report_then_finishes(
        tmpfs: Mount, tmp_path: Path) -> None:
    mnt = tmpfs("2m")
    out = mnt / "out"
    filler = _fill(mnt, leave=8 * 20_480)
    spec_ = _cli_spec(tmp_path, out, 0.5)
    r = _warpdeck(tmp_path, spec_, "--run-dir", "rd", "--json", "r.json")
    assert r.returncode == ExitStatus.OUTAGE, r.stderr
    assert f"outage: sink: no space left on device ({out}{os.sep}); holding the run (nothing fails)" in r.stdout
    assert "outage lasted" in r.stdout and "the run stopped" in r.stdout
    assert "stopped by an outage (sink: no space left on device" in r.stderr and "Traceback" not in r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["stopped_by"], report["counts"]["failed"], report["outages"]["count"]) == ("outage", 0, 1)
    filler.unlink()
    again = _warpdeck(tmp_path, spec_, "--run-dir", "rd", "--json", "r2.json")
    assert again.returncode == ExitStatus.FINISHED, again.stderr
    assert len(list(out.glob("*.npy"))) == 60


def test_the_command_line_exits_6_when_the_journal_cannot_be_written(tmpfs: Mount, tmp_path: Path) -> None:
    ro = tmpfs("1m")
    _remount(ro, "ro")
    r = _warpdeck(tmp_path, _cli_spec(tmp_path, tmp_path / "out", 600), "--run-dir", str(ro / "rd"))
    assert r.returncode == ExitStatus.JOURNAL, r.stderr
    assert "journal write failed" in r.stderr and "Read-only file system" in r.stderr
    assert "Traceback" not in r.stderr
    # mid-run: the journal's disk fills and the spec allows no outage
    small = tmpfs("1m")
    spec_ = _cli_spec(tmp_path, tmp_path / "out2", 0, fn="slow_double_40ms")
    proc = subprocess.Popen([*COMMAND, "run", spec_, "--headless", "--broker", "none",
                             "--run-dir", str(small / "rd"), "--json", str(tmp_path / "r.json")],
                            cwd=tmp_path, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(list((tmp_path / "out2").glob("*.npy"))) < 8:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        _fill(small, leave=0)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ExitStatus.JOURNAL, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert "journal write failed" in report["journal_error"] and report["counts"]["failed"] == 0
    assert "once its disk is fixed, run the same command again" in err and "Traceback" not in err


def test_an_unwritable_report_path_is_said_on_stderr_with_the_summary(tmpfs: Mount, tmp_path: Path) -> None:
    ro = tmpfs("1m")
    _remount(ro, "ro")
    r = _warpdeck(tmp_path, _cli_spec(tmp_path, tmp_path / "out", 600), "--run-dir", "rd",
                  "--json", str(ro / "r.json"))
    assert r.returncode == ExitStatus.FINISHED, r.stderr
    assert f"cannot write the report to {ro / 'r.json'}: Read-only file system" in r.stderr
    assert "the run finished, 60 done, 0 failed" in r.stderr and "Traceback" not in r.stderr


async def test_a_stop_during_an_outage_ends_at_once_and_a_plain_resume_finishes(
        tmpfs: Mount, tmp_path: Path) -> None:
    # Issue 28, item 3: a SIGTERM during an outage waited for the disk (outage_timeout_s here is
    # 5 s so that the old code ends at all; by default it is 10 minutes). The held writes now give
    # up at the stop: they were never journaled, so the resume writes them.
    mnt = tmpfs("2m")
    out = mnt / "out"
    out.mkdir()
    run_dir = tmp_path / "run"
    filler = _fill(mnt, leave=8 * 20_480)
    s = _spec(out, faults={"outage_timeout_s": 5})
    # Should the stop wait for the disk (the defect), the disk comes back after 10 s and the test
    # fails on the time the stop took, rather than hanging.
    watchdog = threading.Timer(10.0, lambda: filler.unlink(missing_ok=True))
    async with Engine(s, run_dir, source=IterableSource(_items(60))) as eng:
        await _hold_then(eng, lambda: None)
        stopping = time.monotonic()
        watchdog.start()
        # Leaving the engine's context while the run goes on stops it, as the headless command does
        # on SIGTERM or SIGINT.
    stopped_in = time.monotonic() - stopping
    watchdog.cancel()
    report = eng.report
    assert report is not None
    assert stopped_in < 1.0, f"the stop took {stopped_in:.2f} s"
    assert (report.status, report.stopped_by, report.exit_code) == ("stopped", "", ExitStatus.STOPPED)
    assert report.counts.failed == 0 and report.failures == []
    assert report.outages is not None and report.outages.last.startswith("sink: no space left on device")
    filler.unlink(missing_ok=True)
    async with Engine(s, run_dir, source=IterableSource(_items(60))) as eng:
        again = await eng.wait()
    assert (again.counts.failed, again.exit_code) == (0, ExitStatus.FINISHED)
    assert again.resume is not None and again.counts.done + again.counts.skipped_done == 60
    _check_outputs(out, 60)


async def test_a_journal_outage_with_every_task_in_flight_holds_the_run_until_the_disk_returns(
        tmpfs: Mount, tmp_path: Path) -> None:
    # Issue 28, item 4: when every remaining task was already in flight, the run ended while the
    # journal's last commit was held, the close gave it up, and the run exited 6 though the disk was
    # about to come back. Now the last commit is made while the fault watch runs: the run holds.
    mnt = tmpfs("1m")
    out = tmp_path / "out"  # the outputs' disk is fine; the journal's fills
    s = spec(["wd_stages:slow_double_40ms"], batch_size=4, sink={"kind": "npy_dir", "path": str(out)})
    async with Engine(s, mnt / "run", source=IterableSource(_items(8))) as eng:
        await _until(lambda: eng.snapshot().counts.done >= 4)  # every task admitted, the first batch done
        filler = _fill(mnt, leave=0)
        await _until(lambda: eng.snapshot().counts.done == 8)  # the lanes have nothing left
        await _until(lambda: (v := eng.outage.view()) is not None and v.what == "journal")
        held = eng.outage.view()
        assert held is not None
        await _until(lambda: (s := eng.snapshot()).outage is not None and s.t - s.outage.since >= 0.3)
        filler.unlink()
        report = await eng.wait()
    assert held.reason.startswith("journal: no space left on device")
    final = eng.report
    assert final is not None
    assert (final.exit_code, final.journal_error, final.counts.done) == (ExitStatus.FINISHED, "", 8)
    with sqlite3.connect(mnt / "run" / "journal.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall() == [(2, 8)]
    assert report.outages is not None and report.outages.count >= 1
