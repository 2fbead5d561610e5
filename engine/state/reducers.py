"""Reduce steps: every task's output folded into one result by an associative function.

The engine calls ``combine`` once per batch (host NumPy arrays), stores each batch's accumulator
durably, and at the end merges the accumulators as a tree (``tree_merge``) and calls ``finish``.

The decisions this module protects:
- An accumulator is a flat ``dict`` of named NumPy arrays (0-d for scalars), so each one can be
  stored with ``np.savez`` and loaded back without pickle.
- The built-ins accumulate in float64, with int64 counts, whatever the tasks' dtype: a float32 sum
  over millions of tasks loses digits that a float64 one keeps.
- ``merge`` is associative and agrees with ``combine`` over both inputs (to float64 rounding), so
  stored accumulators may be merged in any grouping. Mean and variance use Chan et al.'s pairwise
  update (count, mean, M2) in both, never a running sum of squares, which cancels catastrophically
  when the mean is large against the spread.
- The histogram's edges are fixed up front (``bins``, ``value_range``): merging counts over the same
  edges is exact, where edges fitted to each batch could not be merged at all.
- ``combine`` keeps no reference to its batch (the engine reuses that buffer), and no reducer
  changes an accumulator it is handed: a stored accumulator stays what was stored.
- ``finish(None)``, no task at all, answers count 0 (NaN for mean, variance, min, max) and never
  raises: an empty run still reports.
- A user's reducer is checked where its values enter the engine (``CustomReducer``): a value that
  is not a numeric array is a ``ReducerError`` naming the reducer and the key, not a failure deep in
  ``np.savez`` or in a later step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "BUILTINS",
    "Acc",
    "CombineFn",
    "CustomReducer",
    "FinishFn",
    "MergeFn",
    "Reducer",
    "ReducerError",
    "Result",
    "allreduce_model_s",
    "builtin_reducer",
    "tree_depth",
    "tree_merge",
]

# `Any` as the element type: one accumulator mixes float64 and int64 arrays, and a user's functions
# may be typed with any numeric dtype (a dict of float32 arrays must still count as an Acc).
Acc = dict[str, npt.NDArray[Any]]
"""An accumulator: named arrays (0-d for scalars), saveable with ``np.savez``."""
Result = dict[str, npt.NDArray[Any]]
"""What ``finish`` returns: named arrays, handed to later steps as parameters."""
CombineFn = Callable[[Acc | None, npt.NDArray[Any]], Acc]
"""A user's combine: (accumulator or None to start fresh, batch of shape (n, *task_shape)) -> accumulator."""
MergeFn = Callable[[Acc, Acc], Acc]
"""A user's merge: two accumulators -> the accumulator of both inputs; must be associative."""
FinishFn = Callable[[Acc | None], Result]
"""A user's finish: the final accumulator (None: no task at all) -> the result."""

BUILTINS: tuple[str, ...] = ("sum", "mean_var", "min_max", "histogram")
"""The names ``builtin_reducer`` knows."""

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]
_REAL_KINDS = "biuf"
"""dtype kinds a built-in reads: bool, signed and unsigned ints, floats (complex has no order)."""
_NUMERIC_KINDS = "biufc"
"""dtype kinds a user's accumulator may hold: numbers ``np.load`` reads back without pickle."""


class ReducerError(ValueError):
    """A user's reducer broke its contract: it returned something that is not a dict of numeric
    arrays, or it was asked to merge without a merge function."""

    def __init__(self, reducer: str, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.reducer = reducer
        """The reducer's name."""
        self.key = key
        """The accumulator's or result's key at fault; None when no single value is."""

    def __reduce__(self) -> tuple[type[ReducerError], tuple[str, str, str | None]]:
        # Errors cross process boundaries (Ray workers): keep every field.
        return (ReducerError, (self.reducer, str(self), self.key))


class Reducer(Protocol):
    """One reduce step's function: ``combine`` per batch, ``merge`` of accumulators, ``finish``."""

    @property
    def name(self) -> str:
        """The reducer's name, as errors and reports show it (e.g. ``"mean_var"``)."""

    @property
    def can_merge(self) -> bool:
        """Whether ``merge`` works; when False the engine keeps one accumulator, combined serially."""

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """``acc`` (None: start fresh) with the outputs of n >= 1 tasks, ``batch`` of shape
        (n, *task_shape), folded in. Keeps no reference to ``batch`` and does not change ``acc``."""

    def merge(self, a: Acc, b: Acc) -> Acc:
        """The accumulator of both inputs: associative, and equal to combining both inputs (to
        float64 rounding). Changes neither argument."""

    def finish(self, acc: Acc | None) -> Result:
        """The result of ``acc``; None (no task at all) gives a result with count 0, never an error."""


def _field(name: str, acc: Acc, key: str) -> npt.NDArray[Any]:
    try:
        return acc[key]
    except KeyError:
        raise ValueError(f"{name}: the accumulator has no {key!r} (keys: {sorted(acc)}); "
                         f"was it made by another reducer?") from None


def _floats(name: str, acc: Acc, key: str) -> _F64:
    return np.asarray(_field(name, acc, key), dtype=np.float64)


def _ints(name: str, acc: Acc, key: str) -> _I64:
    return np.asarray(_field(name, acc, key), dtype=np.int64)


def _count(name: str, acc: Acc) -> int:
    return int(_ints(name, acc, "count"))


# Arithmetic on 0-d arrays gives NumPy scalars: these keep every accumulator value an ndarray.
def _f64(x: npt.ArrayLike) -> _F64:
    return np.asarray(x, dtype=np.float64)


def _i64(x: npt.ArrayLike) -> _I64:
    return np.asarray(x, dtype=np.int64)


def _same_shape(name: str, a: npt.NDArray[Any], b: npt.NDArray[Any]) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name}: cannot merge accumulators of shapes {a.shape} and {b.shape} "
                         f"(tasks of another shape, or another axes setting)")


def _real_batch(name: str, batch: npt.NDArray[Any]) -> _F64:
    arr = np.asarray(batch)
    if arr.ndim < 1:
        raise ValueError(f"{name}: a batch has shape (n, *task_shape); got a 0-d array")
    if arr.dtype.kind not in _REAL_KINDS:
        raise ValueError(f"{name}: needs real numbers; got a batch of dtype {arr.dtype}")
    # No copy when already float64: every use below is a reduction into new arrays.
    return arr.astype(np.float64, copy=False)


def _batch_axes(name: str, task_shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    """Axis 0 (the tasks) and the task axes ``axes``, shifted past it, sorted."""
    ndim = len(task_shape)
    shifted = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"{name}: axis {a} is out of range for tasks of shape {task_shape} "
                             f"(axes count within one task's shape, from 0; negative from the end)")
        shifted.append(a % ndim + 1)
    if len(set(shifted)) != len(shifted):
        raise ValueError(f"{name}: axes {axes} name one axis of tasks of shape {task_shape} twice")
    return (0, *sorted(shifted))


@dataclass(frozen=True, slots=True)
class _AxesReducer:
    """A built-in that reduces over the tasks and the task axes ``axes``."""

    axes: tuple[int, ...] = ()
    """Task axes reduced too, 0-based within one task's shape: (1, 2) on CHW tasks is per channel."""
    name: ClassVar[str] = ""
    can_merge: ClassVar[bool] = True

    def _prepare(self, batch: npt.NDArray[Any]) -> tuple[_F64, tuple[int, ...], int]:
        """The batch in float64, the axes to reduce, and the values each result element gets."""
        x = _real_batch(self.name, batch)
        red = _batch_axes(self.name, x.shape[1:], self.axes)
        n = 1
        for a in red:
            n *= x.shape[a]
        return x, red, n


@dataclass(frozen=True, slots=True)
class _Sum(_AxesReducer):
    """``sum``: result {"sum", "count"}; NaN propagates, as in ``np.sum``."""

    name: ClassVar[str] = "sum"

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """See ``Reducer.combine``."""
        x, red, n = self._prepare(batch)
        with np.errstate(over="ignore", invalid="ignore"):
            part: Acc = {"sum": _f64(x.sum(axis=red)), "count": _i64(n)}
        return part if acc is None else self.merge(acc, part)

    def merge(self, a: Acc, b: Acc) -> Acc:
        """See ``Reducer.merge``."""
        sa, sb = _floats(self.name, a, "sum"), _floats(self.name, b, "sum")
        _same_shape(self.name, sa, sb)
        with np.errstate(over="ignore", invalid="ignore"):
            return {"sum": _f64(sa + sb), "count": _i64(_count(self.name, a) + _count(self.name, b))}

    def finish(self, acc: Acc | None) -> Result:
        """See ``Reducer.finish``; with no task, a sum of 0.0 (the empty sum) and count 0."""
        if acc is None:
            return {"sum": np.array(0.0), "count": _i64(0)}
        return {"sum": _floats(self.name, acc, "sum").copy(), "count": _i64(_count(self.name, acc))}


@dataclass(frozen=True, slots=True)
class _MeanVar(_AxesReducer):
    """``mean_var``: result {"count", "mean", "var" (population, ddof=0), "std"}, by Chan et al.'s
    pairwise update (T. F. Chan, G. H. Golub, R. J. LeVeque, "Updating formulae and a pairwise
    algorithm for computing sample variances", 1979). NaN and inf propagate, as in ``np.var``."""

    name: ClassVar[str] = "mean_var"

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """See ``Reducer.combine``."""
        x, red, n = self._prepare(batch)
        shape = tuple(d for i, d in enumerate(x.shape) if i not in red)
        if n == 0:
            part: Acc = {"count": _i64(0), "mean": np.zeros(shape), "m2": np.zeros(shape)}
        else:
            # Two passes over the batch (mean, then squares about it): stable within the batch too.
            with np.errstate(over="ignore", invalid="ignore"):
                mean = _f64(x.sum(axis=red) / n)
                m2 = _f64(np.square(x - np.expand_dims(mean, red)).sum(axis=red))
            part = {"count": _i64(n), "mean": mean, "m2": m2}
        return part if acc is None else self.merge(acc, part)

    def merge(self, a: Acc, b: Acc) -> Acc:
        """See ``Reducer.merge``."""
        na, nb = _count(self.name, a), _count(self.name, b)
        mean_a, mean_b = _floats(self.name, a, "mean"), _floats(self.name, b, "mean")
        m2_a, m2_b = _floats(self.name, a, "m2"), _floats(self.name, b, "m2")
        _same_shape(self.name, mean_a, mean_b)
        n = na + nb
        if n == 0:
            return {"count": _i64(0), "mean": mean_a.copy(), "m2": m2_a.copy()}
        with np.errstate(over="ignore", invalid="ignore"):
            delta = mean_b - mean_a
            mean = _f64(mean_a + delta * (nb / n))
            m2 = _f64(m2_a + m2_b + np.square(delta) * (na * nb / n))
        return {"count": _i64(n), "mean": mean, "m2": m2}

    def finish(self, acc: Acc | None) -> Result:
        """See ``Reducer.finish``; with no value, NaN statistics (0-d when no batch gave a shape)."""
        if acc is None:
            nan = np.array(np.nan)
            return {"count": _i64(0), "mean": nan, "var": nan.copy(), "std": nan.copy()}
        n = _count(self.name, acc)
        mean = _floats(self.name, acc, "mean")
        if n == 0:
            return {"count": _i64(0), "mean": np.full(mean.shape, np.nan), "var": np.full(mean.shape, np.nan),
                    "std": np.full(mean.shape, np.nan)}
        var = _f64(_floats(self.name, acc, "m2") / n)
        return {"count": _i64(n), "mean": mean.copy(), "var": var, "std": _f64(np.sqrt(var))}


@dataclass(frozen=True, slots=True)
class _MinMax(_AxesReducer):
    """``min_max``: result {"min", "max", "count", "nan"}. NaN is left out of min and max, as in
    ``np.nanmin``, and counted per element in "nan"; an element with only NaN gives NaN. "count"
    is every value each element got, NaN included."""

    name: ClassVar[str] = "min_max"

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """See ``Reducer.combine``."""
        x, red, n = self._prepare(batch)
        # fmin/fmax skip NaN without np.nanmin's all-NaN warning; the NaN start value makes an empty
        # or all-NaN element NaN, which any later value replaces.
        part: Acc = {"min": _f64(np.fmin.reduce(x, axis=red, initial=np.nan)),
                     "max": _f64(np.fmax.reduce(x, axis=red, initial=np.nan)),
                     "nan": _i64(np.isnan(x).sum(axis=red)),
                     "count": _i64(n)}
        return part if acc is None else self.merge(acc, part)

    def merge(self, a: Acc, b: Acc) -> Acc:
        """See ``Reducer.merge``."""
        min_a, min_b = _floats(self.name, a, "min"), _floats(self.name, b, "min")
        _same_shape(self.name, min_a, min_b)
        return {"min": _f64(np.fmin(min_a, min_b)),
                "max": _f64(np.fmax(_floats(self.name, a, "max"), _floats(self.name, b, "max"))),
                "nan": _i64(_ints(self.name, a, "nan") + _ints(self.name, b, "nan")),
                "count": _i64(_count(self.name, a) + _count(self.name, b))}

    def finish(self, acc: Acc | None) -> Result:
        """See ``Reducer.finish``; with no value, NaN min and max (0-d when no batch gave a shape)."""
        if acc is None:
            return {"min": np.array(np.nan), "max": np.array(np.nan), "count": _i64(0), "nan": _i64(0)}
        return {"min": _floats(self.name, acc, "min").copy(), "max": _floats(self.name, acc, "max").copy(),
                "count": _i64(_count(self.name, acc)), "nan": _ints(self.name, acc, "nan").copy()}


@dataclass(frozen=True, slots=True)
class _Histogram:
    """``histogram``: every value of a batch counted into ``bins`` equal bins over [lo, hi], the right
    edge inclusive (``np.histogram``'s bins); below lo, above hi (infinities included) and NaN counted
    apart. Result {"counts", "edges", "below", "above", "nan", "count" (all values)}."""

    bins: int
    """Number of equal bins, >= 1."""
    lo: float
    """The first edge."""
    hi: float
    """The last edge, inclusive."""
    name: ClassVar[str] = "histogram"
    can_merge: ClassVar[bool] = True

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """See ``Reducer.combine``."""
        x = _real_batch(self.name, batch).ravel()
        inside = x[(x >= self.lo) & (x <= self.hi)]
        counts, _ = np.histogram(inside, bins=self.bins, range=(self.lo, self.hi))
        part: Acc = {"counts": counts.astype(np.int64), "below": _i64(int(np.count_nonzero(x < self.lo))),
                     "above": _i64(int(np.count_nonzero(x > self.hi))),
                     "nan": _i64(int(np.count_nonzero(np.isnan(x)))), "count": _i64(x.size)}
        return part if acc is None else self.merge(acc, part)

    def merge(self, a: Acc, b: Acc) -> Acc:
        """See ``Reducer.merge``: exact, the edges being fixed."""
        counts_a, counts_b = _ints(self.name, a, "counts"), _ints(self.name, b, "counts")
        _same_shape(self.name, counts_a, counts_b)
        out: Acc = {"counts": _i64(counts_a + counts_b)}
        for key in ("below", "above", "nan", "count"):
            out[key] = _i64(int(_ints(self.name, a, key)) + int(_ints(self.name, b, key)))
        return out

    def finish(self, acc: Acc | None) -> Result:
        """See ``Reducer.finish``; with no value, zero counts over the same edges."""
        edges = np.histogram_bin_edges(np.empty(0), bins=self.bins, range=(self.lo, self.hi)).astype(np.float64)
        if acc is None:
            return {"counts": np.zeros(self.bins, dtype=np.int64), "edges": edges, "below": _i64(0),
                    "above": _i64(0), "nan": _i64(0), "count": _i64(0)}
        out: Result = {"counts": _ints(self.name, acc, "counts").copy(), "edges": edges}
        for key in ("below", "above", "nan", "count"):
            out[key] = _i64(int(_ints(self.name, acc, key)))
        return out


_AXES_BUILTINS: dict[str, Callable[[tuple[int, ...]], Reducer]] = {
    "sum": _Sum, "mean_var": _MeanVar, "min_max": _MinMax}


def _histogram(bins: int | None, value_range: tuple[float, float] | None) -> _Histogram:
    if bins is None or value_range is None:
        raise ValueError("histogram needs bins and value_range=(lo, hi): fixed edges are what make "
                         "merging partial histograms exact")
    if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1:
        raise ValueError(f"histogram: bins must be an int >= 1, got {bins!r}")
    try:
        lo, hi = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise ValueError(f"histogram: value_range must be two numbers (lo, hi), got {value_range!r}") from None
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"histogram: value_range must be finite with lo < hi, got {value_range!r}")
    return _Histogram(int(bins), lo, hi)


def builtin_reducer(name: str, *, axes: tuple[int, ...] = (), bins: int | None = None,
                    value_range: tuple[float, float] | None = None) -> Reducer:
    """The built-in reducer ``name`` (one of ``BUILTINS``).

    ``axes``: task axes that ``sum``, ``mean_var`` and ``min_max`` reduce as well as the tasks, 0-based
    within one task's shape (negative from the end); (1, 2) on CHW tasks gives per-channel results of
    shape (C,). They are checked against each batch's task shape in ``combine``. ``bins`` and
    ``value_range`` are the histogram's, which needs both and counts every value (no ``axes``).
    Raises ValueError for an unknown name (listing the known ones) or options the reducer does not take.
    """
    if name not in BUILTINS:
        raise ValueError(f"unknown built-in reducer {name!r}; known: {', '.join(BUILTINS)}")
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, int | np.integer):
            raise ValueError(f"{name}: axes must be ints, got {axes!r}")
    if name == "histogram":
        if axes:
            raise ValueError("histogram counts every value of a batch: it takes no axes")
        return _histogram(bins, value_range)
    if bins is not None or value_range is not None:
        raise ValueError(f"{name} takes no bins or value_range (only histogram does)")
    return _AXES_BUILTINS[name](tuple(int(a) for a in axes))


def _checked(reducer: str, where: str, value: object) -> Acc:
    """``value`` as a dict of str to numeric arrays, or a ReducerError naming what is wrong."""
    if not isinstance(value, Mapping):
        raise ReducerError(reducer, f"reducer {reducer!r}: {where} must return a dict of str to numeric arrays, "
                                    f"not {type(value).__name__}")
    out: Acc = {}
    for key, v in value.items():
        if not isinstance(key, str):
            raise ReducerError(reducer, f"reducer {reducer!r}: {where} returned the key {key!r}; keys must be "
                                        f"str (np.savez names arrays by them)", key=repr(key))
        try:
            arr = np.asarray(v)
        except (TypeError, ValueError) as e:
            raise ReducerError(reducer, f"reducer {reducer!r}: {where} returned {key!r} = {type(v).__name__}, "
                                        f"not convertible to a numeric array: {e}", key=key) from e
        if arr.dtype.kind not in _NUMERIC_KINDS:
            raise ReducerError(reducer, f"reducer {reducer!r}: {where} returned {key!r} = {type(v).__name__} "
                                        f"(dtype {arr.dtype}), not a numeric array", key=key)
        out[key] = arr
    return out


class CustomReducer:
    """A reducer made of a user's functions, with the ``Reducer`` signatures. Whatever ``combine``,
    ``merge`` and ``finish`` return is checked to be a dict of str to numeric arrays (each value
    through ``np.asarray``): anything else is a ``ReducerError`` naming the reducer and the key.
    Without ``merge``, ``can_merge`` is False and ``merge`` raises ``ReducerError``.
    """

    __slots__ = ("_combine", "_finish", "_merge", "_name")

    def __init__(self, combine: CombineFn, finish: FinishFn, merge: MergeFn | None = None, *,
                 name: str = "custom") -> None:
        self._combine = combine
        self._finish = finish
        self._merge = merge
        self._name = name

    @property
    def name(self) -> str:
        """The name errors and reports show."""
        return self._name

    @property
    def can_merge(self) -> bool:
        """Whether a merge function was given."""
        return self._merge is not None

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """The user's combine, checked. An array it returns that may share memory with ``batch`` (a
        view such as ``batch[0]``) is copied: the engine reuses the batch's buffer."""
        out = _checked(self._name, "combine", self._combine(acc, batch))
        return {k: v.copy() if np.may_share_memory(v, batch) else v for k, v in out.items()}

    def merge(self, a: Acc, b: Acc) -> Acc:
        """The user's merge, checked; a ReducerError when none was given."""
        if self._merge is None:
            raise ReducerError(self._name, f"reducer {self._name!r} has no merge: give CustomReducer a merge to "
                                           f"merge accumulators, or combine into one accumulator serially")
        return _checked(self._name, "merge", self._merge(a, b))

    def finish(self, acc: Acc | None) -> Result:
        """The user's finish, checked; it is handed None when there was no task at all."""
        return _checked(self._name, "finish", self._finish(acc))


def tree_merge(reducer: Reducer, accs: Sequence[Acc]) -> Acc | None:
    """``accs`` merged pairwise, level by level (0+1, 2+3, ..., an odd last one carried up), until
    one is left: ``tree_depth(len(accs))`` levels, the same groupings for the same order. Empty gives
    None; a single accumulator is returned as it is (no merge needed, so no ``can_merge`` needed)."""
    level = list(accs)
    if not level:
        return None
    while len(level) > 1:
        merged = [reducer.merge(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            merged.append(level[-1])
        level = merged
    return level[0]


def tree_depth(n: int) -> int:
    """Levels ``tree_merge`` takes for n accumulators: ceil(log2 n), 0 for n <= 1."""
    return 0 if n <= 1 else (n - 1).bit_length()


def allreduce_model_s(p: int, alpha_s: float, beta_s_per_byte: float, m_bytes: int) -> float:
    """Seconds a ring all-reduce of ``m_bytes`` over ``p`` workers takes in the alpha-beta model:
    2(p-1)·alpha + 2(p-1)/p·beta·m (a reduce-scatter and an all-gather, each p-1 steps of m/p bytes;
    R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective Communication Operations in
    MPICH", 2005; P. Patarasuk, X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations", 2009). ``alpha_s``: latency per message; ``beta_s_per_byte``: inverse bandwidth.
    0 for p == 1; ValueError for p < 1 or a negative time or size.
    """
    if p < 1:
        raise ValueError(f"allreduce_model_s: p must be >= 1, got {p}")
    if alpha_s < 0 or beta_s_per_byte < 0 or m_bytes < 0:
        raise ValueError(f"allreduce_model_s: alpha, beta and m must be >= 0, got {alpha_s}, {beta_s_per_byte}, "
                         f"{m_bytes}")
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha_s + 2 * (p - 1) / p * beta_s_per_byte * m_bytes
