"""Sources and sinks on real files (engine/edges/sources.py, engine/edges/sinks.py)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from warpdeck.engine.edges.config import CallableSink, NpyDirSink, NpyDirSource, NullSink, SyntheticSource
from warpdeck.engine.edges.sinks import (
    CHECKSUMS,
    TMP_SUFFIX,
    CallableSinkImpl,
    NpyDirSinkImpl,
    NullSinkImpl,
    open_sink,
)
from warpdeck.engine.edges.sources import (
    InputError,
    IterableSource,
    NpyDirSourceImpl,
    SyntheticSourceImpl,
    open_source,
    synthetic_values,
)
from warpdeck.engine.state.batches import BatchKey, TaskInput


# -- synthetic ------------------------------------------------------------------------------------
def test_synthetic_rows_do_not_depend_on_batch_grouping() -> None:
    dt = np.dtype("float32")
    whole = synthetic_values(7, list(range(10)), (3, 5), dt)
    parts = [synthetic_values(7, list(chunk), (3, 5), dt) for chunk in ([0, 1, 2], [3], [4, 5, 6, 7, 8, 9])]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    # and out of order: row for task 6 is the same wherever it is asked for
    np.testing.assert_array_equal(synthetic_values(7, [6, 2], (3, 5), dt), whole[[6, 2]])


def test_synthetic_source_load_matches_synthetic_values_in_any_batch() -> None:
    src = SyntheticSourceImpl(SyntheticSource(kind="synthetic", count=6, shape=(4,), dtype="float64", seed=3))
    items = list(src.items())
    assert [t.key for t in items] == [f"syn-{i:08d}" for i in range(6)]
    out_a = np.empty((6, 4))
    out_b = np.empty((2, 4))
    assert src.load(items, out_a) == [None] * 6
    src.load([items[5], items[1]], out_b)
    np.testing.assert_array_equal(out_b, out_a[[5, 1]])


def test_different_seeds_give_different_data() -> None:
    dt = np.dtype("float32")
    a = synthetic_values(0, list(range(4)), (16,), dt)
    b = synthetic_values(1, list(range(4)), (16,), dt)
    assert not np.any(a == b)


def test_different_tasks_get_different_data() -> None:
    rows = synthetic_values(0, list(range(50)), (8,), np.dtype("float64"))
    assert len({r.tobytes() for r in rows}) == 50


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_synthetic_floats_are_in_minus_one_to_one(dtype: str) -> None:
    v = synthetic_values(11, list(range(1000)), (1000,), np.dtype(dtype))
    assert v.dtype == np.dtype(dtype)
    assert v.min() >= -1.0
    assert v.max() < 1.0
    assert v.min() < -0.99 and v.max() > 0.99  # spread over the whole interval
    assert abs(float(v.mean())) < 0.01


def test_synthetic_float16_values_stay_below_one() -> None:
    v = synthetic_values(0, list(range(2000)), (100,), np.dtype("float16"))
    assert v.max() < 1.0


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16"])
def test_synthetic_integer_dtypes_use_their_whole_range(dtype: str) -> None:
    dt = np.dtype(dtype)
    v = synthetic_values(5, list(range(64)), (64,), dt)
    assert v.dtype == dt
    info = np.iinfo(dt)
    assert v.min() >= info.min and v.max() <= info.max
    # 4096 draws reach both halves of the type's range and are not all equal
    span = float(info.max) - float(info.min)
    assert float(v.max()) - float(v.min()) > 0.9 * span
    np.testing.assert_array_equal(v, synthetic_values(5, list(range(64)), (64,), dt))


def test_synthetic_complex_values_have_both_parts() -> None:
    v = synthetic_values(2, list(range(8)), (32,), np.dtype("complex64"))
    assert v.dtype == np.complex64
    assert np.all(np.abs(v.real) <= 1.0) and np.all(np.abs(v.imag) <= 1.0)
    assert np.any(v.imag != 0)


def test_negative_seed_accepted_by_the_spec_loads() -> None:
    src = SyntheticSourceImpl(SyntheticSource(kind="synthetic", count=2, shape=(3,), seed=-1))
    out = np.zeros((2, 3), np.float32)
    assert src.load(list(src.items()), out) == [None, None]
    assert np.all(out >= -1.0) and np.all(out < 1.0)


# -- npy_dir source -----------------------------------------------------------------------------
def npy_source(path: Path, **kw: Any) -> NpyDirSourceImpl:
    return NpyDirSourceImpl(NpyDirSource(kind="npy_dir", path=path, **kw))


def test_npy_dir_enumerates_sorted_file_stems_as_keys(tmp_path: Path) -> None:
    for name in ("c", "a", "b10", "b2"):
        np.save(tmp_path / f"{name}.npy", np.zeros(3, np.float32))
    (tmp_path / "notes.txt").write_text("not an input", encoding="utf-8")
    src = npy_source(tmp_path)
    items = list(src.items())
    assert [t.key for t in items] == ["a", "b10", "b2", "c"]
    assert src.total == 4
    assert {t.batch_key for t in items} == {BatchKey("npy", (3,), "float32")}


def test_npy_dir_that_does_not_exist_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        npy_source(tmp_path / "missing")


def test_npy_dir_load_reads_files_exactly_including_fortran_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    c_arrays = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    f_array = np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32))
    assert f_array.flags.f_contiguous and not f_array.flags.c_contiguous
    np.save(tmp_path / "a.npy", c_arrays[0])
    np.save(tmp_path / "b.npy", f_array)
    np.save(tmp_path / "c.npy", c_arrays[1])
    src = npy_source(tmp_path)
    items = list(src.items())
    out = np.full((3, 3, 4), np.nan, np.float32)
    assert src.load(items, out) == [None, None, None]
    for j, name in enumerate("abc"):
        np.testing.assert_array_equal(out[j], np.load(tmp_path / f"{name}.npy"))
    np.testing.assert_array_equal(out[1], f_array)


def test_npy_dir_enumeration_marks_an_unreadable_header(tmp_path: Path) -> None:
    np.save(tmp_path / "good.npy", np.zeros(4, np.float32))
    (tmp_path / "junk.npy").write_bytes(b"this is not a numpy file at all")
    items = {t.key: t for t in npy_source(tmp_path).items()}
    assert items["good"].error == ""
    assert items["junk"].error.startswith(f"input: {tmp_path / 'junk.npy'}: corrupt .npy header")


def _bad_inputs(tmp_path: Path) -> tuple[NpyDirSourceImpl, dict[str, np.ndarray]]:
    """A directory of good and bad files, all keyed (4, 3) float32 by the spec."""
    good = {name: np.arange(12, dtype=np.float32).reshape(4, 3) + k for k, name in enumerate(["a_ok", "z_ok"])}
    for name, arr in good.items():
        np.save(tmp_path / f"{name}.npy", arr)
    np.save(tmp_path / "truncated.npy", np.ones((4, 3), np.float32))
    data = (tmp_path / "truncated.npy").read_bytes()
    (tmp_path / "truncated.npy").write_bytes(data[:-10])
    (tmp_path / "garbage.npy").write_bytes(bytes(range(256)) * 2)
    np.save(tmp_path / "shape.npy", np.ones((3, 4), np.float32))
    np.save(tmp_path / "dtype.npy", np.ones((4, 3), np.float64))
    return npy_source(tmp_path, shape=(4, 3), dtype="float32"), good


@pytest.mark.parametrize(("name", "problem"), [
    ("truncated", "truncated"),
    ("garbage", "corrupt"),
    ("shape", "shape [3, 4], expected [4, 3]"),
    ("dtype", "dtype float64, expected float32"),
])
def test_bad_input_fails_alone_with_an_input_error_naming_file_and_problem(tmp_path: Path, name: str,
                                                                            problem: str) -> None:
    src, good = _bad_inputs(tmp_path)
    items = {t.key: t for t in src.items()}
    batch = [items["a_ok"], items[name], items["z_ok"]]
    out = np.full((3, 4, 3), np.nan, np.float32)
    errors = src.load(batch, out)
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], InputError)
    assert f"{name}.npy" in str(errors[1])
    assert problem in str(errors[1])
    np.testing.assert_array_equal(out[0], good["a_ok"])
    np.testing.assert_array_equal(out[2], good["z_ok"])


def test_wrong_shape_without_a_spec_shape_is_refused_against_the_files_own_key(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((2, 2), np.float32))
    src = npy_source(tmp_path)
    (item,) = src.items()
    np.save(tmp_path / "a.npy", np.zeros((2, 3), np.float32))  # replaced after enumeration
    (err,) = src.load([item], np.zeros((1, 2, 2), np.float32))
    assert isinstance(err, InputError)
    assert "a.npy: shape [2, 3], expected [2, 2]" in str(err)


def test_truncated_fortran_order_file_is_an_input_error_naming_the_file(tmp_path: Path) -> None:
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((3, 4), np.float32)))
    data = (tmp_path / "f.npy").read_bytes()
    (tmp_path / "f.npy").write_bytes(data[:-8])
    src = npy_source(tmp_path)
    (err,) = src.load(list(src.items()), np.zeros((1, 3, 4), np.float32))
    assert isinstance(err, InputError)
    assert "f.npy" in str(err)
    assert "truncated" in str(err)


def test_big_endian_file_keyed_float32_loads_its_values(tmp_path: Path) -> None:
    arr = np.arange(5, dtype=">f4")
    np.save(tmp_path / "be.npy", arr)
    src = npy_source(tmp_path)
    (item,) = src.items()
    assert item.batch_key.dtype == "float32"
    out = np.zeros((1, 5), np.float32)
    assert src.load([item], out) == [None]
    np.testing.assert_array_equal(out[0], arr.astype(np.float32))


# -- iterable source ------------------------------------------------------------------------------
def test_iterable_source_keys_arrays_and_refuses_unsafe_keys_and_objects() -> None:
    items = list(IterableSource([np.zeros(2), ("x.1", np.ones(2)), ("../up", np.ones(2)),
                                 ("obj", np.array([None, 1], dtype=object))]).items())
    assert [t.key for t in items] == ["item-00000000", "x.1", "../up", "obj"]
    assert [bool(t.error) for t in items] == [False, False, True, True]
    assert items[3].error == "object arrays are refused"
    assert items[1].batch_key == BatchKey("array", (2,), "float64")


def test_iterable_source_load_copies_each_array_into_its_row() -> None:
    arrays = [np.full(3, i, np.int32) for i in range(3)]
    src = IterableSource(arrays)
    out = np.zeros((3, 3), np.int32)
    assert src.load(list(src.items()), out) == [None] * 3
    np.testing.assert_array_equal(out, np.stack(arrays))


def test_open_source_picks_the_implementation(tmp_path: Path) -> None:
    assert isinstance(open_source(SyntheticSource(kind="synthetic", count=1, shape=(1,))), SyntheticSourceImpl)
    assert isinstance(open_source(NpyDirSource(kind="npy_dir", path=tmp_path)), NpyDirSourceImpl)


# -- npy_dir sink -----------------------------------------------------------------------------------
def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(TMP_SUFFIX))


def test_sink_writes_key_npy_with_exact_content_and_no_temp_file(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path / "out")
    arr = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    sink.write("task-1", arr)
    got = np.load(tmp_path / "out" / "task-1.npy")
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, arr)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [CHECKSUMS, "task-1.npy"]
    crc = zlib.crc32((tmp_path / "out" / "task-1.npy").read_bytes())
    assert (tmp_path / "out" / CHECKSUMS).read_text() == f"task-1\t{crc:08x}\n"  # logged before the rename
    assert leftovers(tmp_path / "out") == []


def test_sink_writes_a_non_contiguous_view_as_its_values(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path)
    base = np.arange(20, dtype=np.float32).reshape(4, 5)
    sink.write("view", base[:, ::2])
    np.testing.assert_array_equal(np.load(tmp_path / "view.npy"), base[:, ::2])


def test_sink_overwrite_replaces_the_file_with_the_new_content(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path)
    sink.write("k", np.zeros(1000, np.float64))
    old_inode = (tmp_path / "k.npy").stat().st_ino
    sink.write("k", np.ones(3, np.float32))
    got = np.load(tmp_path / "k.npy")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.ones(3, np.float32))
    # replaced by rename, not rewritten in place: a reader holding the old file never sees a mix
    assert (tmp_path / "k.npy").stat().st_ino != old_inode
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("key", ["a/b", "../escape", ".hidden", "", "sp ace", "x" * 201])
def test_sink_refuses_keys_that_cannot_name_a_file_and_writes_nothing(tmp_path: Path, key: str) -> None:
    sink = NpyDirSinkImpl(tmp_path / "out")
    with pytest.raises(ValueError, match="cannot name an output file"):
        sink.write(key, np.zeros(2))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written, in out/ or beside it


def test_failed_write_leaves_no_temp_file_and_no_output(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path)
    with pytest.raises(ValueError, match="allow_pickle"):
        sink.write("obj", np.array([{"a": 1}, None], dtype=object))
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_previous_output(tmp_path: Path) -> None:
    sink = NpyDirSinkImpl(tmp_path)
    sink.write("k", np.arange(4))
    with pytest.raises(ValueError, match="allow_pickle"):
        sink.write("k", np.array([None], dtype=object))
    np.testing.assert_array_equal(np.load(tmp_path / "k.npy"), np.arange(4))
    assert leftovers(tmp_path) == []


def test_open_sink_resolves_a_relative_path_inside_the_run_dir(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    sink = open_sink(NpyDirSink(kind="npy_dir", path=Path("results/x")), run_dir)
    assert isinstance(sink, NpyDirSinkImpl)
    assert sink.dir == run_dir / "results" / "x"
    sink.write("t", np.ones(2))
    assert (run_dir / "results" / "x" / "t.npy").is_file()


def test_open_sink_keeps_an_absolute_path(tmp_path: Path) -> None:
    target = tmp_path / "abs-out"
    sink = open_sink(NpyDirSink(kind="npy_dir", path=target), tmp_path / "run")
    assert isinstance(sink, NpyDirSinkImpl)
    assert sink.dir == target
    assert not (tmp_path / "run").exists()


def test_open_sink_null_and_callable(tmp_path: Path) -> None:
    assert isinstance(open_sink(NullSink(kind="null"), tmp_path), NullSinkImpl)
    sink = open_sink(CallableSink(kind="callable", target="json:dumps"), tmp_path)
    assert isinstance(sink, CallableSinkImpl)


def test_callable_sink_calls_the_function_with_key_and_array() -> None:
    calls: list[tuple[str, np.ndarray]] = []
    sink = CallableSinkImpl(lambda key, arr: calls.append((key, arr)))
    arr = np.arange(3)
    sink.write("task-7", arr)
    assert len(calls) == 1
    assert calls[0][0] == "task-7"
    assert calls[0][1] is arr


def test_callable_sink_propagates_the_functions_error() -> None:
    def refuse(key: str, arr: np.ndarray) -> None:
        raise OSError(f"disk full writing {key}")

    with pytest.raises(OSError, match="disk full writing k1"):
        CallableSinkImpl(refuse).write("k1", np.zeros(1))


def test_task_input_is_immutable() -> None:
    t = TaskInput("k", BatchKey("array", (1,), "uint8"), None)
    with pytest.raises(AttributeError):
        t.key = "other"  # type: ignore[misc]
