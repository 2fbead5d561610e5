"""A hostile input directory beside good inputs fails file by file, never the run.

The spec fixes neither ``shape`` nor ``dtype`` (as every shipped example), so each file's own
header decides its batch. Every case is a real file (or FIFO, link, directory) on disk, run
through the real engine. What each case is:
- usable, converted while read: big-endian float32 (byte order is layout), Fortran order (a
  layout), float16 and complex128 (element types a spec can name), another shape (its own batch);
- input errors, failed at once and never retried: object (pickled; never loaded), unicode,
  bytes, structured, void, datetime64, timedelta64, bool (stages cannot store arithmetic back
  into bool), clongdouble (no spec names it), 9 dimensions (a spec allows 8), a zero-size array,
  a header claiming more data than the file has (never allocated), truncated data, bad magic,
  an empty file, a header over NumPy's safety limit, a symlink loop, a FIFO (never opened for a
  blocking read), a directory named ``x.npy``, a file removed between listing and reading.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from wd_build import spec
from wd_stages import POISON

from warpdeck.engine.api import Engine, PipelineSpec, RunReport, SpecMismatch

SUPPORT = Path(__file__).resolve().parents[1] / "support"
GOOD = 8


class _Payload:
    """Pickled inside the object array: unpickling it would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return (os.mkdir, (str(self.marker),))


def _raw_npy(path: Path, header: str, data: bytes = b"", version: int = 1) -> None:
    """A .npy file with a header written by hand (what np.save would refuse to write)."""
    magic = b"\x93NUMPY" + bytes([version, 0])
    fmt, base = ("<H", 10) if version == 1 else ("<I", 12)
    text = header.encode("latin1")
    pad = (-(base + len(text) + 1)) % 64
    path.write_bytes(magic + struct.pack(fmt, len(text) + pad + 1) + text + b" " * pad + b"\n" + data)


# key -> the array written; its output must be 2 * that array
USABLE: dict[str, np.ndarray] = {
    "u_big_endian": np.arange(4, dtype=">f4"),
    "u_fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "u_float16": np.arange(4, dtype=np.float16),
    "u_complex": np.arange(4) * (1 + 2j),
    "u_other_shape": np.arange(4.0).reshape(2, 2),
}

# key -> a word the failure's reason must hold
BAD: dict[str, str] = {
    "b_object": "pickled data is never loaded", "b_unicode": "unicode text", "b_bytes": "byte strings",
    "b_structured": "structured records", "b_void": "structured records", "b_datetime": "datetime64",
    "b_timedelta": "timedelta64", "b_bool": "booleans", "b_clongdouble": "is not supported",
    "b_nine_dims": "9 dimensions", "b_zero_size": "empty array", "b_lying_header": "truncated",
    "b_truncated": "truncated", "b_bad_magic": "corrupt .npy header", "b_empty": "empty file",
    "b_huge_header": "corrupt .npy header (declares 200116 bytes, over NumPy's 10000-byte limit",
    "b_loop_a": "unreadable", "b_loop_b": "unreadable",
    "b_fifo": "not a regular file (a FIFO)", "b_dir": "not a regular file (a directory)",
    "b_vanished": "no such file",
}


def _hostile_dir(root: Path) -> tuple[Path, Path]:
    """The inputs, and the marker that unpickling the object array would create."""
    src = root / "in"
    src.mkdir()
    for i in range(GOOD):
        np.save(src / f"g{i:02d}.npy", np.full(4, float(i)))
    for key, arr in USABLE.items():
        np.save(src / f"{key}.npy", arr)
    marker = root / "unpickled"
    np.save(src / "b_object.npy", np.array([_Payload(marker), None], dtype=object), allow_pickle=True)
    np.save(src / "b_unicode.npy", np.array(["ab", "cd"]))
    np.save(src / "b_bytes.npy", np.array([b"ab", b"cd"]))
    np.save(src / "b_structured.npy", np.zeros(4, [("a", "<i4"), ("b", "<f8")]))
    np.save(src / "b_void.npy", np.zeros(4, "V4"))
    np.save(src / "b_datetime.npy", np.arange(4).astype("datetime64[s]"))
    np.save(src / "b_timedelta.npy", np.arange(4).astype("timedelta64[s]"))
    np.save(src / "b_bool.npy", np.array([True, False, True, False]))
    np.save(src / "b_clongdouble.npy", np.zeros(4, np.clongdouble))
    np.save(src / "b_nine_dims.npy", np.zeros((1,) * 9))
    np.save(src / "b_zero_size.npy", np.zeros((0, 4)))
    _raw_npy(src / "b_lying_header.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }",
             b"\0" * 64)
    np.save(src / "b_truncated.npy", np.full(4, 1.0))
    (src / "b_truncated.npy").write_bytes((src / "b_truncated.npy").read_bytes()[:-5])
    (src / "b_bad_magic.npy").write_bytes(b"\x93NUMPZ\x01\x00" + b"\0" * 100)
    (src / "b_empty.npy").write_bytes(b"")
    _raw_npy(src / "b_huge_header.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), " + " " * 200_000
             + "}", np.zeros(4).tobytes(), version=2)
    (src / "b_loop_a.npy").symlink_to(src / "b_loop_b.npy")
    (src / "b_loop_b.npy").symlink_to(src / "b_loop_a.npy")
    os.mkfifo(src / "b_fifo.npy")
    (src / "b_dir.npy").mkdir()
    np.save(src / "b_vanished.npy", np.full(4, 1.0))
    return src, marker


def _spec(tmp: Path, src: Path, **kw: object) -> PipelineSpec:
    return spec(["wd_stages:double"], batch_size=4, retry={"max_attempts": 3},
                source={"kind": "npy_dir", "path": str(src)}, sink={"kind": "npy_dir", "path": "outputs"}, **kw)


async def _run(s: PipelineSpec, run_dir: Path, before: Callable[[], None] = lambda: None) -> tuple[RunReport, Engine]:
    eng = Engine(s, run_dir)  # lists the input directory
    before()  # what happens between listing and reading
    async with eng:
        return await eng.wait(), eng


async def test_a_hostile_directory_fails_file_by_file_and_every_good_input_is_done(tmp_path: Path) -> None:
    src, marker = _hostile_dir(tmp_path)
    run_dir = tmp_path / "rd"
    report, eng = await _run(_spec(tmp_path, src), run_dir, (src / "b_vanished.npy").unlink)

    out = run_dir / "outputs"
    for i in range(GOOD):
        np.testing.assert_array_equal(np.load(out / f"g{i:02d}.npy"), np.full(4, 2.0 * i))
    for key, arr in USABLE.items():
        got = np.load(out / f"{key}.npy")
        assert got.dtype == arr.dtype.newbyteorder("=") and got.flags.c_contiguous, key
        np.testing.assert_array_equal(got, arr * 2)
    assert (report.counts.done, report.counts.failed) == (GOOD + len(USABLE), len(BAD))
    reasons = {f["key"]: f["reason"] for f in json.loads(report.model_dump_json())["failures"]}
    assert reasons.keys() == BAD.keys()
    for key, word in BAD.items():
        name = "b_dir.npy" if key == "b_dir" else f"{key}.npy"
        assert reasons[key].startswith(f"input: {src / name}: ") and word in reasons[key], (key, reasons[key])
        d = eng.task_detail(key)
        assert d is not None and d.state == "failed" and d.attempt == 1 and d.history == (), (key, d)
        assert not (out / f"{key}.npy").exists()
    assert not marker.exists()  # the object array's pickle was never loaded
    assert report.exit_code == 1

    # a resume reads no good input again and keeps every bad one still listed failed, with its reason
    again, _ = await _run(_spec(tmp_path, src), run_dir)
    still = BAD.keys() - {"b_vanished"}
    assert (again.counts.done, again.counts.failed, again.counts.skipped_done) == (0, len(still), GOOD + len(USABLE))
    assert {f.key: f.reason for f in again.failures} == {k: reasons[k] for k in still}
    assert not marker.exists()


async def test_a_fixable_input_is_done_by_a_resume_with_retry_failed(tmp_path: Path) -> None:
    src, _ = _hostile_dir(tmp_path)
    run_dir = tmp_path / "rd"
    await _run(_spec(tmp_path, src), run_dir, (src / "b_vanished.npy").unlink)
    np.save(src / "b_vanished.npy", np.full(4, 5.0))  # the user puts the file back
    async with Engine(_spec(tmp_path, src), run_dir, retry_failed=True) as eng:
        report = await eng.wait()
    assert report.counts.done == 1 and report.counts.failed == len(BAD) - 1
    np.testing.assert_array_equal(np.load(run_dir / "outputs" / "b_vanished.npy"), np.full(4, 10.0))


async def test_a_stage_error_is_still_retried_beside_an_input_error_that_is_not(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        np.save(src / f"g{i}.npy", np.full(4, POISON if i == 2 else float(i)))
    np.save(src / "void.npy", np.zeros(4, "V8"))
    s = spec(["wd_stages:poison"], batch_size=4, retry={"max_attempts": 3},
             source={"kind": "npy_dir", "path": str(src)}, sink={"kind": "null"})
    report, eng = await _run(s, tmp_path / "rd")
    assert (report.counts.done, report.counts.failed) == (5, 2)
    poisoned, void = eng.task_detail("g2"), eng.task_detail("void")
    assert poisoned is not None and poisoned.attempt == 3 and "poisoned input" in poisoned.error
    assert [h.outcome for h in poisoned.history] == ["failed", "failed"]
    assert void is not None and void.attempt == 1 and void.history == ()


def test_the_command_line_finishes_a_directory_with_an_object_array_and_writes_its_report(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        np.save(src / f"g{i}.npy", np.full(4, float(i)))
    np.save(src / "obj.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
    (tmp_path / "spec.toml").write_text(
        'name = "hostile"\nbackend = "numpy"\nbatch_size = 4\n[source]\nkind = "npy_dir"\npath = "in"\n'
        '[sink]\nkind = "npy_dir"\n[[stages]]\nfn = "wd_stages:double"\n')
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "COLUMNS": "120"}
    r = subprocess.run([sys.executable, "-m", "warpdeck.cli", "run", "spec.toml", "--headless", "--json", "r.json",
                        "--run-dir", "rd"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
                       check=False)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["counts"]["done"], report["counts"]["failed"]) == (6, 1)
    assert report["failures"][0]["reason"].startswith(f"input: {src / 'obj.npy'}: object array")


# -- a refused resume names what changed ----------------------------------------------------------
def _journal_spec(tmp: Path, fn: str, **kw: object) -> PipelineSpec:
    return spec([fn], name="conv2d", source={"kind": "synthetic", "count": 8, "shape": [4], "dtype": "float64"},
                sink={"kind": "npy_dir", "path": "outputs"}, **kw)


async def test_a_refused_resume_lists_the_fields_that_differ_and_how_to_start_afresh(tmp_path: Path) -> None:
    await _run(_journal_spec(tmp_path, "wd_stages:double"), tmp_path)
    other = _journal_spec(tmp_path, "wd_stages:add_one", batch_size=2, nonfinite="fail")  # batch size: tuning
    with pytest.raises(SpecMismatch) as info:
        await _run(other, tmp_path)
    msg = str(info.value)
    assert ("the specs differ in:\n  nonfinite: flag → fail\n"
            "  stages[0].fn: wd_stages:double → wd_stages:add_one\n") in msg
    assert "batch_size" not in msg
    assert f"pass another --run-dir, or remove {tmp_path}" in msg


async def test_a_journal_older_than_the_stored_spec_says_so(tmp_path: Path) -> None:
    await _run(_journal_spec(tmp_path, "wd_stages:double"), tmp_path)
    with sqlite3.connect(tmp_path / "journal.sqlite") as c:
        c.execute("DELETE FROM meta WHERE name = 'spec'")  # as a journal written before it was stored
    with pytest.raises(SpecMismatch) as info:
        await _run(_journal_spec(tmp_path, "wd_stages:add_one"), tmp_path)
    msg = str(info.value)
    assert "made by spec 'conv2d' (identity" in msg and "(this journal predates field-level comparison)" in msg
    assert "pass another --run-dir" in msg
