"""Bad input is refused with a reason, and nothing else is lost.

Each case checks the failed (or flagged) task's reason in ``engine.task_detail`` and in the JSON
report, and that every other task finishes. Faults are real where the OS can make them (files,
a full tmpfs, a name taken by a directory, a read-only directory when not root); where it
cannot (ENOSPC and EACCES on one chosen file, tests running as root), they are injected at the
call that writes or renames, and the real path is exercised beside them.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_build import spec
from wd_stages import POISON, RecordingSink

from warpdeck.engine.api import Engine, IterableSource, RunReport, SpecError, parse_spec


def _arrays(n: int, values: dict[int, float] | None = None) -> list[tuple[str, np.ndarray]]:
    values = values or {}
    return [(f"k{i:04d}", np.full(4, values.get(i, float(i)))) for i in range(n)]


async def _run(s, source=None, sink=None) -> tuple[RunReport, Engine]:
    async with Engine(s, source=source, sink=sink) as eng:
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
def test_bad_npy_input_fails_alone_before_any_stage_with_its_reason(tmp_path: Path, case: str) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(12):
        np.save(src / f"f{i:02d}.npy", np.full(4, float(i)))
    want = _write_case(src / "f05.npy", case)
    s = spec(["wd_stages:double"], batch_size=4,
             source={"kind": "npy_dir", "path": str(src), "shape": [4], "dtype": "float64"},
             sink={"kind": "npy_dir", "path": str(tmp_path / "out")})
    report, eng = asyncio.run(_run(s))
    assert (report.counts.done, report.counts.failed) == (11, 1)
    _failed_with(report, eng, "f05", want)
    d = eng.task_detail("f05")
    # refused while filling pinned host memory: the stage (and a device) never saw it, no retry
    assert d is not None and d.error.startswith("input:") and d.attempt == 1
    assert not (tmp_path / "out" / "f05.npy").exists()


# -- non-finite outputs -------------------------------------------------------------------------
def test_nonfinite_output_is_flagged_by_default_and_the_task_finishes() -> None:
    sink = RecordingSink()
    s = spec(["wd_stages:nan_at_poison"], batch_size=4)
    assert s.nonfinite == "flag"
    report, eng = asyncio.run(_run(s, IterableSource(_arrays(12, {5: POISON, 7: -POISON})), sink))
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


def test_nonfinite_fail_policy_fails_the_task_without_writing_or_retrying() -> None:
    sink = RecordingSink()
    s = spec(["wd_stages:nan_at_poison"], batch_size=4, nonfinite="fail", retry={"max_attempts": 3})
    report, eng = asyncio.run(_run(s, IterableSource(_arrays(12, {5: POISON})), sink))
    assert (report.counts.done, report.counts.failed) == (11, 1)
    _failed_with(report, eng, "k0005", "4 of 4 values are NaN or infinite")
    d = eng.task_detail("k0005")
    assert d is not None and d.attempt == 1 and "k0005" not in sink.out
    assert report.exit_code == 1


def test_nonfinite_allow_policy_does_not_look() -> None:
    s = spec(["wd_stages:nan_at_poison"], batch_size=4, nonfinite="allow")
    report, eng = asyncio.run(_run(s, IterableSource(_arrays(8, {5: POISON})), RecordingSink()))
    assert (report.counts.done, report.counts.flagged) == (8, 0)
    d = eng.task_detail("k0005")
    assert d is not None and d.flag == ""


# -- sinks that fail ----------------------------------------------------------------------------
def _npy_spec(out: Path, **kw: Any):
    return spec(["wd_stages:double"], batch_size=4, sink={"kind": "npy_dir", "path": str(out)}, **kw)


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("fail_times", [1, 5])
def test_enospc_mid_write_is_retried_then_fails_and_never_leaves_a_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_times: int) -> None:
    # Injected: ENOSPC on one chosen file cannot be made real beside files that must succeed.
    # Half the bytes reach the disk first, as with a disk that fills mid-write.
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
    report, eng = asyncio.run(_run(_npy_spec(out, retry={"max_attempts": 3}), IterableSource(_arrays(12))))
    assert _leftovers(out) == []
    if fail_times == 1:  # a transient full disk: the retry writes it whole
        assert report.counts.done == 12
        np.testing.assert_array_equal(np.load(out / "k0006.npy"), np.full(4, 12.0))
        d = eng.task_detail("k0006")
        assert d is not None and "No space left on device" in d.history[0].reason
    else:
        assert (report.counts.done, report.counts.failed) == (11, 1)
        _failed_with(report, eng, "k0006", "No space left on device")
        assert eng.task_detail("k0006").attempt == 3  # three attempts
        assert not (out / "k0006.npy").exists()
    assert len(list(out.glob("*.npy"))) == report.counts.done


def test_eacces_on_rename_is_retried_then_fails_and_leaves_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Injected: the tests run as root, whom permissions do not stop (the real case is below).
    real = os.replace

    def refusing(src: Any, dst: Any, *a: Any, **kw: Any) -> None:
        if str(dst).endswith("k0003.npy"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", refusing)
    out = tmp_path / "out"
    report, eng = asyncio.run(_run(_npy_spec(out, retry={"max_attempts": 2}), IterableSource(_arrays(8))))
    assert (report.counts.done, report.counts.failed) == (7, 1)
    _failed_with(report, eng, "k0003", "Permission denied")
    assert _leftovers(out) == [] and not (out / "k0003.npy").exists()


def test_an_output_name_taken_by_a_directory_fails_that_task_alone_for_real(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "k0003.npy" / "occupied").mkdir(parents=True)  # the OS refuses the rename, root or not
    report, eng = asyncio.run(_run(_npy_spec(out, retry={"max_attempts": 2}), IterableSource(_arrays(8))))
    assert (report.counts.done, report.counts.failed) == (7, 1)
    _failed_with(report, eng, "k0003", "sink: ")
    assert _leftovers(out) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory; see the injected EACCES test")
def test_a_read_only_output_directory_fails_tasks_with_permission_denied(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o500)
    try:
        report, eng = asyncio.run(_run(_npy_spec(out, retry={"max_attempts": 2}), IterableSource(_arrays(4))))
    finally:
        out.chmod(0o700)
    assert report.counts.failed == 4
    _failed_with(report, eng, "k0000", "Permission denied")
    assert list(out.iterdir()) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8); the injected ENOSPC test covers the logic")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
                       check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_really_full_disk_fails_the_tasks_that_do_not_fit_and_leaves_no_partial_file(small_tmpfs: Path) -> None:
    # 20 outputs of 16 KiB into 64 KiB: the first few fit, the rest meet a real ENOSPC.
    items = [(f"k{i:04d}", np.full(2048, float(i))) for i in range(20)]
    report, eng = asyncio.run(_run(_npy_spec(small_tmpfs, retry={"max_attempts": 2}), IterableSource(items)))
    assert report.counts.done + report.counts.failed == 20
    assert 0 < report.counts.done < 20
    assert all("No space left on device" in f.reason for f in report.failures), report.failures
    _failed_with(report, eng, report.failures[0].key, "No space left on device")
    assert _leftovers(small_tmpfs) == []
    for p in small_tmpfs.glob("*.npy"):  # whatever is there is whole
        np.testing.assert_array_equal(np.load(p), np.full(2048, 2.0 * int(p.stem[1:])))


# -- specs --------------------------------------------------------------------------------------
def test_an_unknown_nonfinite_policy_is_refused_at_its_field() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"name": "x", "source": {"kind": "synthetic", "count": 1, "shape": [1]},
                    "stages": [{"fn": "wd_stages:double", "colour": "red"}], "nonfinite": "ignore"})
    locs = {i.loc for i in info.value.issues}
    assert locs == {"nonfinite", "stages.0.colour"}
