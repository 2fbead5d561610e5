"""Bad input is refused with a reason, and nothing else is lost.

Each case checks the failed (or flagged) task's reason in ``engine.task_detail`` and in the JSON
report, and that every other task finishes. Faults are real where the OS can make them (files,
a name taken by a directory, a read-only directory when not root); where it cannot (ENOSPC and
EACCES on one chosen file, tests running as root), they are injected at the call that writes or
renames, and the real path is exercised beside them (and in test_outage.py, on a real tmpfs).
A full or read-only disk is an outage (engine/edges/outage.py): it holds the writes and fails nothing.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_build import spec
from wd_stages import POISON, RecordingSink

from warpdeck.engine.api import Engine, ExitStatus, IterableSource, RunReport, SpecError, parse_spec
from warpdeck.engine.edges.sinks import CHECKSUMS


def _arrays(n: int, values: dict[int, float] | None = None) -> list[tuple[str, np.ndarray]]:
    values = values or {}
    return [(f"k{i:04d}", np.full(4, values.get(i, float(i)))) for i in range(n)]


async def _run(s, source=None, sink=None, run_dir=None) -> tuple[RunReport, Engine]:
    async with Engine(s, run_dir, source=source, sink=sink) as eng:
        return await eng.wait(), eng


def _json(report: RunReport) -> dict[str, Any]:
    return json.loads(report.model_dump_json())


def _failed_with(report: RunReport, eng: Engine, key: str, text: str) -> None:
    d = eng.task_detail(key)
    assert d is not None and d.state == "failed" and text in d.error, d
    reasons = {f["key"]: f["reason"] for f in _json(report)["failures"]}
    assert text in reasons[key], reasons


# -- input files --------------------------------------------------------------------------------
def _write_case(path: Path, case: str) -> str:
    good = np.full(4, 1.0)
    if case == "corrupt header":
        path.write_bytes(b"\x93NUMPY\x01\x00garbage")
        return "corrupt"
    if case == "not npy at all":
        path.write_text("hello")
        return "corrupt"
    if case == "empty":
        path.write_bytes(b"")
        return "corrupt"
    if case == "truncated":
        np.save(path, good)
        path.write_bytes(path.read_bytes()[:-5])
        return "truncated"
    if case == "wrong shape":
        np.save(path, np.zeros((2, 2)))
        return "shape [2, 2], expected [4]"
    np.save(path, good.astype(np.float32))  # wrong dtype
    return "dtype float32, expected float64"


@pytest.mark.parametrize("case", ["corrupt header", "not npy at all", "empty", "truncated", "wrong shape",
                                  "wrong dtype"])
async def test_bad_npy_input_fails_alone_before_any_stage_with_its_reason(tmp_path: Path, case: str) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(12):
        np.save(src / f"f{i:02d}.npy", np.full(4, float(i)))
    want = _write_case(src / "f05.npy", case)
    s = spec(["wd_stages:double"], batch_size=4,
             source={"kind": "npy_dir", "path": str(src), "shape": [4], "dtype": "float64"},
             sink={"kind": "npy_dir", "path": str(tmp_path / "out")})
    report, eng = await _run(s)
    assert (report.counts.done, report.counts.failed) == (11, 1)
    _failed_with(report, eng, "f05", want)
    d = eng.task_detail("f05")
    # refused while filling pinned host memory: the stage (and a device) never saw it, no retry
    assert d is not None and d.error.startswith("input:") and d.attempt == 1
    assert not (tmp_path / "out" / "f05.npy").exists()


# -- non-finite outputs -------------------------------------------------------------------------
async def test_nonfinite_output_is_flagged_by_default_and_the_task_finishes() -> None:
    sink = RecordingSink()
    s = spec(["wd_stages:nan_at_poison"], batch_size=4)
    assert s.nonfinite == "flag"
    report, eng = await _run(s, IterableSource(_arrays(12, {5: POISON, 7: -POISON})), sink)
    assert (report.counts.done, report.counts.failed, report.counts.flagged) == (12, 0, 2)
    d = eng.task_detail("k0005")
    assert d is not None and d.state == "done" and "4 of 4 values are NaN or infinite" in d.flag
    assert np.isnan(sink.out["k0005"]).all() and np.isinf(sink.out["k0007"]).all()
    assert {f["key"]: f["note"] for f in _json(report)["flagged"]} == {
        "k0005": "non-finite output: 4 of 4 values are NaN or infinite",
        "k0007": "non-finite output: 4 of 4 values are NaN or infinite"}
    assert report.exit_code == 0
    ok = eng.task_detail("k0004")
    assert ok is not None and ok.flag == ""


async def test_nonfinite_fail_policy_fails_the_task_without_writing_or_retrying() -> None:
    sink = RecordingSink()
    s = spec(["wd_stages:nan_at_poison"], batch_size=4, nonfinite="fail", retry={"max_attempts": 3})
    report, eng = await _run(s, IterableSource(_arrays(12, {5: POISON})), sink)
    assert (report.counts.done, report.counts.failed) == (11, 1)
    _failed_with(report, eng, "k0005", "4 of 4 values are NaN or infinite")
    d = eng.task_detail("k0005")
    assert d is not None and d.attempt == 1 and "k0005" not in sink.out
    assert report.exit_code == 1


async def test_nonfinite_allow_policy_does_not_look() -> None:
    s = spec(["wd_stages:nan_at_poison"], batch_size=4, nonfinite="allow")
    report, eng = await _run(s, IterableSource(_arrays(8, {5: POISON})), RecordingSink())
    assert (report.counts.done, report.counts.flagged) == (8, 0)
    d = eng.task_detail("k0005")
    assert d is not None and d.flag == ""


# -- sinks that fail ----------------------------------------------------------------------------
def _npy_spec(out: Path, **kw: Any):
    return spec(["wd_stages:double"], batch_size=4, sink={"kind": "npy_dir", "path": str(out)}, **kw)


def _leftovers(out: Path) -> list[str]:
    """Hidden files but the checksums a stopped run keeps for its resume (sinks.CHECKSUMS)."""
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.name != CHECKSUMS)


@pytest.mark.parametrize("fail_times", [1, 5])
async def test_enospc_mid_write_holds_the_write_and_burns_no_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_times: int) -> None:
    # Injected: ENOSPC on one chosen file cannot be made real beside files that must succeed
    # (tests/engine/test_outage.py fills a real tmpfs). Half the bytes reach the disk first, as
    # with a disk that fills mid-write.
    real = np.lib.format.write_array
    failed = {"n": 0}

    def filling_disk(f: Any, arr: Any, *a: Any, **kw: Any) -> None:
        if float(arr.flat[0]) == 12.0 and failed["n"] < fail_times:  # task k0006's output (2 * 6)
            failed["n"] += 1
            f.write(b"\x93NUMPY" + b"\0" * 40)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(f, arr, *a, **kw)

    monkeypatch.setattr(np.lib.format, "write_array", filling_disk)
    out = tmp_path / "out"
    report, eng = await _run(_npy_spec(out, retry={"max_attempts": 3}), IterableSource(_arrays(12)))
    assert _leftovers(out) == []
    assert (report.counts.done, report.counts.failed, report.exit_code) == (12, 0, ExitStatus.FINISHED)
    np.testing.assert_array_equal(np.load(out / "k0006.npy"), np.full(4, 12.0))
    d = eng.task_detail("k0006")
    assert d is not None and d.attempt == 1 and d.history == ()  # the disk's fault, not the task's
    assert failed["n"] == fail_times
    assert report.outages is not None and report.outages.count == 1
    assert report.outages.last == f"sink: no space left on device ({out}{os.sep})"


async def test_eacces_on_rename_holds_the_run_then_stops_it_with_nothing_failed_and_a_resume_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Injected: the tests run as root, whom permissions do not stop (the real case is below).
    real = os.replace
    refuse = {"on": True}

    def refusing(src: Any, dst: Any, *a: Any, **kw: Any) -> None:
        if refuse["on"] and str(dst).endswith("k0003.npy"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", refusing)
    out, run_dir = tmp_path / "out", tmp_path / "run"
    s = _npy_spec(out, retry={"max_attempts": 2}, faults={"outage_timeout_s": 0.3})
    report, _ = await _run(s, IterableSource(_arrays(8)), run_dir=run_dir)
    assert (report.status, report.stopped_by, report.exit_code) == ("stopped", "outage", ExitStatus.OUTAGE)
    assert report.counts.failed == 0 and report.failures == []
    assert "k0003" not in {p.stem for p in out.glob("*.npy")}
    assert report.outages is not None and report.outages.last.startswith("sink: permission denied (")
    assert _leftovers(out) == []
    refuse["on"] = False  # the operator fixed the permissions
    again, _ = await _run(s, IterableSource(_arrays(8)), run_dir=run_dir)
    assert (again.counts.failed, again.exit_code) == (0, ExitStatus.FINISHED)
    assert sorted(p.stem for p in out.glob("*.npy")) == [f"k{i:04d}" for i in range(8)]
    assert again.counts.done + again.counts.skipped_done == 8


async def test_an_output_name_taken_by_a_directory_fails_that_task_alone_for_real(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "k0003.npy" / "occupied").mkdir(parents=True)  # the OS refuses the rename, root or not
    report, eng = await _run(_npy_spec(out, retry={"max_attempts": 2}), IterableSource(_arrays(8)))
    assert (report.counts.done, report.counts.failed) == (7, 1)
    _failed_with(report, eng, "k0003", "sink: ")
    assert _leftovers(out) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory; see the injected EACCES test")
async def test_a_read_only_output_directory_is_an_outage_not_a_failure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o500)
    try:
        report, _ = await _run(_npy_spec(out, faults={"outage_timeout_s": 0.2}), IterableSource(_arrays(4)))
    finally:
        out.chmod(0o700)
    assert (report.counts.failed, report.exit_code) == (0, ExitStatus.OUTAGE)
    assert report.outages is not None and "permission denied" in report.outages.last
    assert list(out.iterdir()) == []


# -- specs --------------------------------------------------------------------------------------
def test_an_unknown_nonfinite_policy_is_refused_at_its_field() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "x", "source": {"kind": "synthetic", "count": 1, "shape": [1]},
                    "stages": [{"fn": "wd_stages:double", "colour": "red"}], "nonfinite": "ignore"})
    locs = {i.loc for i in info.value.issues}
    assert locs == {"nonfinite", "stages.0.colour"}
