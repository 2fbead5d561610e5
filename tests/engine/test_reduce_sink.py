"""The reduce step's sink (engine/edges/reduce_sink.py): a batch lands as one partial of its keys and
its accumulator, numbered after what the directory holds, distinct under concurrent sink threads; a
resume takes the keys of checked partials as done and removes a partial that fails its check (its
keys run again) and a killed run's temps; ``partials`` hands back the accumulators in part order and
refuses a key folded twice; a batch whose fold or write fails lands nothing. Real files."""

from __future__ import annotations

import errno
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from warpdeck.engine.edges.reduce_sink import (
    ACC_PREFIX,
    CRC_NAME,
    KEYS_NAME,
    Acc,
    BadPartial,
    KeyFoldedTwice,
    ReduceSinkImpl,
    read_partial,
)
from warpdeck.engine.edges.sinks import DurableSink, batch_writer, rejected_outputs


class SumCount:
    """The test's reducer: the outputs' sum (float64) and how many there were."""

    name = "sum_count"

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        assert acc is None  # the sink always folds a batch into a fresh accumulator
        return {"sum": batch.sum(axis=0, dtype=np.float64), "count": np.asarray(len(batch))}


class Raises(SumCount):
    """A reducer whose fold fails."""

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        raise ArithmeticError("the reducer could not fold this batch")


def _rows(n: int, start: int = 0) -> npt.NDArray[np.float32]:
    return np.arange(start * 3, (start + n) * 3, dtype=np.float32).reshape(n, 3)


def _landed(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _resumed(directory: Path) -> ReduceSinkImpl:
    """A sink as a resumed run opens it: temps cleaned, the landed partials' keys read."""
    sink = ReduceSinkImpl(directory, SumCount())
    sink.clean_temps()
    return sink


def _write(sink: ReduceSinkImpl, keys: Sequence[str], start: int = 0) -> npt.NDArray[np.float32]:
    rows = _rows(len(keys), start)
    sink.write_batch(keys, rows)
    return rows


def test_a_batch_lands_as_one_partial_of_its_keys_and_its_accumulator(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path / "out", SumCount())
    rows = _write(sink, ["a", "b", "c"])
    assert _landed(tmp_path / "out") == ["partial-00000.npz"]
    with np.load(tmp_path / "out" / "partial-00000.npz", allow_pickle=False) as z:
        assert sorted(z.files) == sorted([KEYS_NAME, CRC_NAME, f"{ACC_PREFIX}sum", f"{ACC_PREFIX}count"])
    keys, acc = read_partial(tmp_path / "out" / "partial-00000.npz")
    assert keys == ("a", "b", "c")
    np.testing.assert_array_equal(acc["sum"], rows.sum(axis=0, dtype=np.float64))
    assert acc["sum"].dtype == np.float64 and int(acc["count"]) == 3


def test_write_is_a_batch_of_one(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path, SumCount())
    sink.write("solo", np.array([1.0, 2.0], np.float32))
    keys, acc = read_partial(tmp_path / "partial-00000.npz")
    assert keys == ("solo",) and int(acc["count"]) == 1
    np.testing.assert_array_equal(acc["sum"], [1.0, 2.0])


def test_outputs_past_the_keys_are_not_folded(tmp_path: Path) -> None:
    # The lanes hand a batch's whole buffer; only its first len(keys) rows are outputs.
    ReduceSinkImpl(tmp_path, SumCount()).write_batch(["a", "b"], _rows(5))
    _, acc = read_partial(tmp_path / "partial-00000.npz")
    assert int(acc["count"]) == 2
    np.testing.assert_array_equal(acc["sum"], _rows(2).sum(axis=0))


def test_part_numbers_continue_after_the_highest_landed(tmp_path: Path) -> None:
    _write(ReduceSinkImpl(tmp_path, SumCount()), ["a"])
    (tmp_path / "partial-00000.npz").rename(tmp_path / "partial-00007.npz")
    later = _resumed(tmp_path)
    _write(later, ["b"])
    _write(later, ["c"])
    assert _landed(tmp_path) == ["partial-00007.npz", "partial-00008.npz", "partial-00009.npz"]


def test_sink_threads_writing_at_once_land_distinct_parts(tmp_path: Path) -> None:
    threads, batches = 8, 12
    barrier = threading.Barrier(threads, timeout=30)

    class AllAtOnce(SumCount):
        def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
            barrier.wait()  # every thread folds, then writes and renames, in the same instant
            return super().combine(acc, batch)

    sink = ReduceSinkImpl(tmp_path, AllAtOnce())

    def run(t: int) -> None:
        for b in range(batches):
            _write(sink, [f"t{t}-b{b}-{j}" for j in range(3)], start=t)

    with ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(run, t) for t in range(threads)]:
            f.result()
    assert _landed(tmp_path) == [f"partial-{i:05d}.npz" for i in range(threads * batches)]
    accs = sink.partials()
    assert sink.covered() == threads * batches * 3 and sum(int(a["count"]) for a in accs) == threads * batches * 3
    want = sum(_rows(3, t).sum(axis=0, dtype=np.float64) for t in range(threads)) * batches
    np.testing.assert_array_equal(sum(a["sum"] for a in accs), want)


def test_clean_temps_removes_a_killed_runs_temp_files_and_counts_them(tmp_path: Path) -> None:
    _write(ReduceSinkImpl(tmp_path, SumCount()), ["a"])
    (tmp_path / ".partial-staged.npz.4242-0.tmp").write_bytes(b"PK\x03\x04 cut short by a kill")
    (tmp_path / ".partial-staged.npz.4242-1.tmp").write_bytes(b"")
    assert ReduceSinkImpl(tmp_path, SumCount()).clean_temps() == 2
    assert _landed(tmp_path) == ["partial-00000.npz"]


def test_committed_is_true_for_the_keys_of_a_landed_partial_and_false_for_others(tmp_path: Path) -> None:
    _write(ReduceSinkImpl(tmp_path, SumCount()), ["a", "b"])
    sink = _resumed(tmp_path)
    assert isinstance(sink, DurableSink) and batch_writer(sink) is not None
    assert [sink.committed(k) for k in ["a", "b", "c"]] == [True, True, False]
    assert sink.rejected == 0 and sink.rejected_parts == []


def test_committed_answers_from_the_partials_present_when_the_run_began(tmp_path: Path) -> None:
    sink = _resumed(tmp_path)
    _write(sink, ["new"])
    assert not sink.committed("new")  # this run's own output: the journal records it, not the sink


def test_a_partial_with_a_flipped_byte_is_removed_counted_and_its_keys_run_again(tmp_path: Path) -> None:
    first = ReduceSinkImpl(tmp_path, SumCount())
    rows = _write(first, ["a", "b", "c"])
    _write(first, ["d"], start=3)
    part = tmp_path / "partial-00000.npz"
    data = bytearray(part.read_bytes())
    at = bytes(data).find(rows.sum(axis=0, dtype=np.float64).tobytes())
    assert at > 0
    data[at + 3] ^= 0x10  # one bit of the accumulator's sum
    part.write_bytes(bytes(data))
    sink = _resumed(tmp_path)
    assert [sink.committed(k) for k in "abcd"] == [False, False, False, True]
    assert not part.exists() and sink.rejected == 3 and rejected_outputs(sink) == 3
    assert sink.rejected_parts == ["partial-00000.npz"]


def test_a_truncated_partial_is_removed_when_the_run_opens_and_named(tmp_path: Path) -> None:
    _write(ReduceSinkImpl(tmp_path, SumCount()), ["a", "b"])
    part = tmp_path / "partial-00000.npz"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    sink = _resumed(tmp_path)
    assert not part.exists() and sink.rejected_parts == ["partial-00000.npz"]
    # Its keys cannot be read, so they cannot be counted as outputs; they answer False all the same.
    assert not sink.committed("a") and sink.rejected == 0


def test_every_flipped_bit_is_refused_or_reads_back_the_same_values(tmp_path: Path) -> None:
    _write(ReduceSinkImpl(tmp_path, SumCount()), ["a", "bb", "c"])
    part = tmp_path / "partial-00000.npz"
    good = part.read_bytes()
    want_keys, want = read_partial(part)
    refused = 0
    for i in range(len(good)):
        for bit in (0x01, 0x80):
            bad = bytearray(good)
            bad[i] ^= bit
            part.write_bytes(bytes(bad))
            try:
                keys, acc = read_partial(part)
            except BadPartial:
                refused += 1
                continue
            # Only bits outside what is read can flip unseen (a zip header's timestamp, say).
            assert keys == want_keys and acc.keys() == want.keys(), (i, bit)
            for name, arr in acc.items():
                assert arr.dtype == want[name].dtype and np.array_equal(arr, want[name]), (i, bit)
    assert refused > len(good)  # every bit of the arrays' bytes and headers is among them


def test_partials_are_the_accumulators_in_part_number_order(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path, SumCount())
    for i, keys in enumerate([["a"], ["b", "c"], ["d", "e", "f"]]):
        _write(sink, keys, start=i)
    # Past 99999 a part number has six digits: the order is the numbers', not the names'.
    (tmp_path / "partial-00000.npz").rename(tmp_path / "partial-99999.npz")
    (tmp_path / "partial-00001.npz").rename(tmp_path / "partial-100000.npz")
    assert [int(acc["count"]) for acc in sink.partials()] == [3, 1, 2]
    assert sorted(sink.partials()[0]) == ["count", "sum"]


def test_covered_counts_the_outputs_of_every_landed_partial(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path, SumCount())
    assert sink.covered() == 0
    _write(sink, ["a", "b"])
    _write(sink, ["c"])
    assert sink.covered() == 3


def test_a_key_in_two_partials_is_refused_naming_the_key_and_both_files(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path, SumCount())
    _write(sink, ["a", "b"])
    _write(sink, ["c"])
    shutil.copy(tmp_path / "partial-00000.npz", tmp_path / "partial-00005.npz")  # a copy made by hand
    with pytest.raises(KeyFoldedTwice) as err:
        sink.partials()
    assert (err.value.key, err.value.first, err.value.second) == ("a", "partial-00000.npz", "partial-00005.npz")
    assert "'a'" in str(err.value) and "partial-00000.npz" in str(err.value) and "partial-00005.npz" in str(err.value)


def test_partials_refuses_a_partial_that_fails_its_check_and_leaves_it(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path, SumCount())
    _write(sink, ["a"])
    part = tmp_path / "partial-00000.npz"
    with np.load(part, allow_pickle=False) as z:
        members = {name: z[name] for name in z.files}
    members[f"{ACC_PREFIX}sum"] = members[f"{ACC_PREFIX}sum"] + 1  # another value under the same checksum
    with part.open("wb") as f:
        np.savez(f, allow_pickle=False, **members)
    with pytest.raises(BadPartial, match="does not match its checksum") as err:
        sink.partials()
    assert err.value.path == str(part) and part.exists()


def test_a_batch_whose_fold_raises_lands_nothing(tmp_path: Path) -> None:
    sink = ReduceSinkImpl(tmp_path / "out", Raises())
    with pytest.raises(ArithmeticError):
        _write(sink, ["a", "b"])
    assert not (tmp_path / "out").exists()  # folded before anything is opened: not even the directory


def test_a_write_that_fails_midway_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(b"PK\x03\x04 the first bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    sink = ReduceSinkImpl(tmp_path, SumCount())
    monkeypatch.setattr(np, "savez", disk_full)
    with pytest.raises(OSError, match="No space left") as err:
        _write(sink, ["a"])
    assert err.value.errno == errno.ENOSPC and _landed(tmp_path) == []


def test_an_accumulator_of_python_objects_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    class Objects(SumCount):
        def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
            return {"labels": np.array([{"n": len(batch)}], dtype=object)}

    with pytest.raises(TypeError, match="without pickle"):
        _write(ReduceSinkImpl(tmp_path / "out", Objects()), ["a"])
    assert not (tmp_path / "out").exists()


def test_describe_names_the_reducer_and_the_directory(tmp_path: Path) -> None:
    said = ReduceSinkImpl(tmp_path, SumCount()).describe("k1")
    assert "'sum_count'" in said and str(tmp_path) in said and "'k1'" in said
