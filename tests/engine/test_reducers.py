"""Reduce steps (engine/state/reducers.py): the built-ins against NumPy, merging, user reducers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest

from warpdeck.engine.state.reducers import (
    BUILTINS,
    Acc,
    CustomReducer,
    Reducer,
    ReducerError,
    allreduce_model_s,
    builtin_reducer,
    tree_depth,
    tree_merge,
)

_HIST = {"bins": 7, "value_range": (-1.5, 2.0)}


def _data(shape: tuple[int, ...] = (40, 3, 4, 5)) -> npt.NDArray[np.float64]:
    return np.random.default_rng(0).normal(0.3, 1.2, size=shape)


def _reducer(name: str) -> Reducer:
    return builtin_reducer(name, **_HIST) if name == "histogram" else builtin_reducer(name)  # type: ignore[arg-type]


def _splits(n: int, parts: int) -> list[int]:
    """Random split points (sorted, distinct) cutting n tasks into ``parts`` non-empty batches."""
    return sorted(np.random.default_rng(0).choice(np.arange(1, n), size=parts - 1, replace=False).tolist())


def _assert_results_close(got: dict[str, npt.NDArray[Any]], want: dict[str, npt.NDArray[Any]]) -> None:
    assert got.keys() == want.keys()
    for k, value in want.items():
        if value.dtype.kind in "iu":
            np.testing.assert_array_equal(got[k], value, err_msg=k)
        else:
            np.testing.assert_allclose(got[k], value, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=k)


def test_sum_matches_numpy() -> None:
    x = _data()
    out = builtin_reducer("sum").finish(builtin_reducer("sum").combine(None, x))
    np.testing.assert_allclose(out["sum"], x.sum(axis=0), rtol=1e-12)
    assert out["count"] == 40


def test_sum_over_task_axes_matches_numpy() -> None:
    x = _data()
    r = builtin_reducer("sum", axes=(0, 2))
    out = r.finish(r.combine(None, x))
    np.testing.assert_allclose(out["sum"], x.sum(axis=(0, 1, 3)), rtol=1e-12)
    assert out["count"] == 40 * 3 * 5


def test_mean_var_matches_numpy() -> None:
    x = _data()
    r = builtin_reducer("mean_var")
    out = r.finish(r.combine(None, x))
    np.testing.assert_allclose(out["mean"], x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(out["var"], x.var(axis=0), rtol=1e-12)
    np.testing.assert_allclose(out["std"], x.std(axis=0), rtol=1e-12)
    assert out["count"] == 40


def test_mean_var_per_channel_with_axes() -> None:
    images = _data((16, 3, 8, 8))  # CHW tasks
    r = builtin_reducer("mean_var", axes=(1, 2))
    out = r.finish(r.combine(r.combine(None, images[:5]), images[5:]))
    assert out["mean"].shape == (3,)
    np.testing.assert_allclose(out["mean"], images.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(out["var"], images.var(axis=(0, 2, 3)), rtol=1e-12)
    assert out["count"] == 16 * 8 * 8


def test_mean_var_stays_accurate_when_the_mean_dwarfs_the_spread() -> None:
    x = 1e6 + np.random.default_rng(0).normal(0.0, 1e-2, size=(10_000, 2))
    r = builtin_reducer("mean_var")
    acc = tree_merge(r, [r.combine(None, b) for b in np.array_split(x, 37)])
    np.testing.assert_allclose(r.finish(acc)["var"], x.var(axis=0), rtol=1e-7)
    naive = np.square(x).mean(axis=0) - np.square(x.mean(axis=0))  # what Chan's update avoids
    assert not np.allclose(naive, x.var(axis=0), rtol=0.5)


def test_min_max_matches_numpy_exactly() -> None:
    x = _data()
    r = builtin_reducer("min_max", axes=(1,))
    out = r.finish(r.combine(None, x))
    np.testing.assert_array_equal(out["min"], x.min(axis=(0, 2)))
    np.testing.assert_array_equal(out["max"], x.max(axis=(0, 2)))
    assert out["count"] == 40 * 4
    np.testing.assert_array_equal(out["nan"], np.zeros((3, 5), dtype=np.int64))


def test_min_max_leaves_nan_out_and_counts_it() -> None:
    x = np.array([[1.0, np.nan, np.nan], [np.nan, -2.0, np.nan], [3.0, 5.0, np.nan]])
    r = builtin_reducer("min_max")
    out = r.finish(r.combine(r.combine(None, x[:1]), x[1:]))
    np.testing.assert_array_equal(out["min"], [1.0, -2.0, np.nan])
    np.testing.assert_array_equal(out["max"], [3.0, 5.0, np.nan])
    np.testing.assert_array_equal(out["nan"], [1, 1, 3])
    assert out["count"] == 3


def test_histogram_matches_numpy_exactly() -> None:
    x = _data()
    r = builtin_reducer("histogram", **_HIST)  # type: ignore[arg-type]
    out = r.finish(r.combine(None, x))
    counts, edges = np.histogram(x, bins=7, range=(-1.5, 2.0))
    np.testing.assert_array_equal(out["counts"], counts)
    np.testing.assert_array_equal(out["edges"], edges)
    assert out["counts"].dtype == np.int64
    assert out["count"] == x.size


def test_histogram_counts_out_of_range_and_nan_apart() -> None:
    x = np.array([[-5.0, 0.0, np.nan], [np.inf, -np.inf, 0.5], [9.0, np.nan, 1.0]])
    r = builtin_reducer("histogram", bins=2, value_range=(0.0, 1.0))
    out = r.finish(r.combine(None, x))
    np.testing.assert_array_equal(out["counts"], [1, 2])  # 1.0, the right edge, is in the last bin
    assert [int(out[k]) for k in ("below", "above", "nan", "count")] == [2, 2, 2, 9]


@pytest.mark.parametrize("name", BUILTINS)
def test_combining_batch_by_batch_equals_all_at_once(name: str) -> None:
    x = _data()
    r = _reducer(name)
    acc: Acc | None = None
    for batch in np.split(x, _splits(len(x), 6)):
        acc = r.combine(acc, batch)
    _assert_results_close(r.finish(acc), r.finish(r.combine(None, x)))


@pytest.mark.parametrize("name", BUILTINS)
def test_tree_merge_of_random_splits_equals_one_shot(name: str) -> None:
    x = _data()
    r = _reducer(name)
    partials = [r.combine(None, batch) for batch in np.split(x, _splits(len(x), 9))]
    _assert_results_close(r.finish(tree_merge(r, partials)), r.finish(r.combine(None, x)))


@pytest.mark.parametrize("name", BUILTINS)
def test_merge_is_associative(name: str) -> None:
    a, b, c = np.split(_data(), [7, 25])
    r = _reducer(name)
    pa, pb, pc = (r.combine(None, part) for part in (a, b, c))
    _assert_results_close(r.finish(r.merge(r.merge(pa, pb), pc)), r.finish(r.merge(pa, r.merge(pb, pc))))


@pytest.mark.parametrize("name", BUILTINS)
def test_finish_of_nothing_says_count_zero(name: str) -> None:
    out = _reducer(name).finish(None)
    assert out["count"] == 0
    for key in ("mean", "var", "std", "min", "max"):
        if key in out:
            assert np.isnan(out[key])


@pytest.mark.parametrize("name", BUILTINS)
def test_combine_keeps_no_reference_to_the_batch(name: str) -> None:
    x = _data()
    r = _reducer(name)
    acc = r.combine(None, x)
    want = r.finish(r.combine(None, x.copy()))
    x[...] = 123.0
    _assert_results_close(r.finish(acc), want)


@pytest.mark.parametrize("name", BUILTINS)
def test_scalar_tasks_give_arrays_not_numpy_scalars(name: str) -> None:
    r = _reducer(name)
    x = _data((9,))
    acc = r.merge(r.combine(None, x[:4]), r.combine(None, x[4:]))
    for out in (acc, r.finish(acc), r.finish(None)):
        assert all(type(v) is np.ndarray for v in out.values()), {k: type(v) for k, v in out.items()}


@pytest.mark.parametrize("name", BUILTINS)
def test_accumulator_survives_savez(name: str, tmp_path: Path) -> None:
    r = _reducer(name)
    acc = r.combine(None, _data())
    # The cast: NumPy's stubs let a ** dict fill savez's `allow_pickle` (a bool), so they refuse arrays.
    np.savez(tmp_path / "acc.npz", **cast("dict[str, Any]", acc))
    with np.load(tmp_path / "acc.npz", allow_pickle=False) as f:
        loaded = {k: f[k] for k in f.files}
    _assert_results_close(r.finish(loaded), r.finish(acc))


def test_integer_tasks_accumulate_in_float64() -> None:
    x = np.full((3, 2), np.iinfo(np.int32).max, dtype=np.int32)
    out = builtin_reducer("sum").finish(builtin_reducer("sum").combine(None, x))
    assert out["sum"].dtype == np.float64
    np.testing.assert_array_equal(out["sum"], [3.0 * np.iinfo(np.int32).max] * 2)


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: sum, mean_var, min_max, histogram"):
        builtin_reducer("median")


@pytest.mark.parametrize("options", [{}, {"bins": 4}, {"value_range": (0.0, 1.0)},
                                     {"bins": 0, "value_range": (0.0, 1.0)}, {"bins": 4, "value_range": (1.0, 1.0)}])
def test_histogram_needs_bins_and_a_range(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="histogram"):
        builtin_reducer("histogram", **options)


def test_options_a_reducer_does_not_take_are_refused() -> None:
    with pytest.raises(ValueError, match="no bins"):
        builtin_reducer("mean_var", bins=4)
    with pytest.raises(ValueError, match="no axes"):
        builtin_reducer("histogram", axes=(0,), bins=4, value_range=(0.0, 1.0))


def test_axes_beyond_the_task_shape_raise_in_combine() -> None:
    r = builtin_reducer("mean_var", axes=(2,))
    with pytest.raises(ValueError, match=r"axis 2 is out of range for tasks of shape \(3, 4\)"):
        r.combine(None, np.zeros((5, 3, 4)))


def _sum_combine(acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
    s = batch.sum(axis=0)
    return {"s": s if acc is None else acc["s"] + s}


def _sum_merge(a: Acc, b: Acc) -> Acc:
    return {"s": a["s"] + b["s"]}


def _sum_finish(acc: Acc | None) -> dict[str, npt.NDArray[Any]]:
    return {"total": np.array(0.0) if acc is None else acc["s"]}


def test_custom_reducer_combines_merges_and_finishes() -> None:
    x = _data((10, 3))
    r = CustomReducer(_sum_combine, _sum_finish, _sum_merge, name="mysum")
    acc = tree_merge(r, [r.combine(None, b) for b in np.split(x, [3, 4, 8])])
    assert r.can_merge
    np.testing.assert_allclose(r.finish(acc)["total"], x.sum(axis=0), rtol=1e-12)
    assert r.finish(None)["total"] == 0.0


def test_custom_reducer_returning_a_non_array_names_the_key() -> None:
    r = CustomReducer(lambda acc, batch: {"ok": batch.sum(axis=0), "bad": "text"}, _sum_finish, name="mine")
    with pytest.raises(ReducerError, match=r"'mine'.*'bad'") as caught:
        r.combine(None, np.ones((2, 3)))
    assert (caught.value.reducer, caught.value.key) == ("mine", "bad")


def test_custom_finish_returning_a_non_dict_is_refused() -> None:
    r = CustomReducer(_sum_combine, lambda acc: [1.0], name="mine")  # type: ignore[arg-type, return-value]
    with pytest.raises(ReducerError, match="finish must return a dict"):
        r.finish(None)


def test_custom_reducer_without_merge_cannot_merge() -> None:
    r = CustomReducer(_sum_combine, _sum_finish, name="serial")
    acc = r.combine(None, np.ones((2, 3)))
    assert not r.can_merge
    with pytest.raises(ReducerError, match="'serial' has no merge"):
        r.merge(acc, acc)
    assert tree_merge(r, [acc]) is acc


def test_custom_reducer_copies_views_of_the_batch() -> None:
    x = np.ones((2, 3))
    r = CustomReducer(lambda acc, batch: {"first": batch[0]}, _sum_finish, name="view")
    acc = r.combine(None, x)
    x[...] = 7.0
    np.testing.assert_array_equal(acc["first"], [1.0, 1.0, 1.0])


def test_tree_merge_of_nothing_is_none() -> None:
    assert tree_merge(builtin_reducer("sum"), []) is None


def test_tree_merge_pairs_neighbours_level_by_level() -> None:
    seen: list[str] = []

    def merge(a: Acc, b: Acc) -> Acc:
        seen.append(f"{a['id'].item()}+{b['id'].item()}")
        return {"id": np.array(9 + len(seen))}  # merged accumulators are 10, 11, ...

    r = CustomReducer(_sum_combine, _sum_finish, merge, name="order")
    tree_merge(r, [{"id": np.array(i)} for i in range(5)])
    assert seen == ["0+1", "2+3", "10+11", "12+4"]


@pytest.mark.parametrize(("n", "depth"), [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (1024, 10), (1025, 11)])
def test_tree_depth(n: int, depth: int) -> None:
    assert tree_depth(n) == depth


def test_allreduce_model() -> None:
    alpha, beta, m = 1e-5, 1e-9, 1_000_000
    assert allreduce_model_s(1, alpha, beta, m) == 0.0
    assert allreduce_model_s(2, alpha, beta, m) == pytest.approx(2 * alpha + beta * m)
    assert allreduce_model_s(4, alpha, beta, m) == pytest.approx(6 * alpha + 1.5 * beta * m)
