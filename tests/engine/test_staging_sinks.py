"""Staging sinks (npy_dir, Parquet, null): ``stage`` writes one attempt's outputs under temp names
and nothing lands; ``commit`` renames them into place, less the dropped keys; a failed stage
leaves nothing; a killed run's staged temps are removed by ``clean_temps``. Real files."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from warpdeck.engine.edges.sinks import CHECKSUMS, NpyDirSinkImpl, NullSinkImpl, StagingSink


def test_npy_stage_lands_nothing_until_commit(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path / "out")
    outs = np.arange(12, dtype=np.float32).reshape(3, 4)
    staged = sink.stage(["a", "b", "c"], outs, "ray-1-e7-b3")
    assert isinstance(sink, StagingSink)
    # Each temp name carries its file's checksum, for the process that commits it to log.
    sums = {k: zlib.crc32((tmp_path / "out" / name).read_bytes()) for k, name in zip("abc", staged, strict=True)}
    assert list(staged) == [f".{k}.npy.ray-1-e7-b3-{sums[k]:08x}.tmp" for k in "abc"]
    assert not any(sink.committed(k) for k in "abc")
    sink.commit(["a", "b", "c"], staged, drop={"b"})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [CHECKSUMS, "a.npy", "c.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "c.npy"), outs[2])
    assert (tmp_path / "out" / CHECKSUMS).read_text() == "".join(
        f"{k}\t{sums[k]:08x}\n" for k in "ac")
    resumed = NpyDirSinkImpl(tmp_path / "out")  # a resume checks what it finds against the log
    assert resumed.committed("a") and resumed.committed("c") and not resumed.committed("b")
    assert resumed.rejected == 0


def test_npy_stage_that_fails_leaves_nothing(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path / "out")
    with pytest.raises(ValueError, match="cannot name an output file"):
        sink.stage(["good", "../bad"], np.zeros((2, 2)), "t")
    assert list((tmp_path / "out").iterdir()) == []


def test_staged_temps_of_a_killed_attempt_are_cleaned(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path / "out")
    sink.stage(["a"], np.zeros((1, 2)), "ray-0-e1-b9")
    assert sink.clean_temps() == 1
    assert list((tmp_path / "out").iterdir()) == []


def test_parquet_stage_is_one_temp_part_numbered_at_commit(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from warpdeck.engine.edges.parquet_sink import ParquetSinkImpl

    sink = ParquetSinkImpl(tmp_path / "out")
    sink.write_batch(["x"], np.ones((1, 2)))  # part 0, written in this process
    first = sink.stage(["a", "b"], np.arange(4.0).reshape(2, 2), "ray-1-e2-b1")
    second = sink.stage(["c", "d"], np.arange(4.0, 8.0).reshape(2, 2), "ray-0-e2-b2")
    assert first != second and len(first) == len(second) == 1
    assert sorted(p.name for p in (tmp_path / "out").glob("part-*")) == ["part-00000.parquet"]
    sink.commit(["c", "d"], second, drop={"d"})
    sink.commit(["a", "b"], first)
    parts = sorted((tmp_path / "out").glob("part-*"))
    assert [p.name for p in parts] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert pq.read_table(parts[1]).column("key").to_pylist() == ["c"]
    assert pq.read_table(parts[2]).column("output").to_pylist() == [[0.0, 1.0], [2.0, 3.0]]
    resumed = ParquetSinkImpl(tmp_path / "out")  # the checksums of a part less its dropped rows still hold
    resumed.clean_temps()
    assert all(resumed.committed(k) for k in "xabc") and resumed.rejected == 0
    sink.commit(["e"], sink.stage(["e"], np.ones((1, 2)), "t"), drop={"e"})  # all dropped: no part
    assert len(list((tmp_path / "out").iterdir())) == 3


def test_null_sink_stages_nothing(tmp_path: Path) -> None:
    sink = NullSinkImpl()
    assert isinstance(sink, StagingSink)
    assert sink.stage(["a"], np.zeros((1, 1)), "t") == ()
    sink.commit(["a"], ())
