"""Where tasks come from: seeded synthetic data, a directory of ``.npy`` files, Python code.

The decision this module protects: a source only *enumerates* tasks (cheap: a key, a shape, a
dtype) and later *loads* a batch of them straight into a lane's pinned input rows. Loading
answers per task, so one corrupt or wrongly shaped input fails alone, before it reaches a device
(an items source may load a whole batch in one call, and still answers per item: item_loader.py).
"""

from __future__ import annotations

import bisect
import hashlib
import pickle
import re
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.config import (
    CallableSource,
    ImageSource,
    ItemsSource,
    NpyDirSource,
    ParquetSource,
    SyntheticSource,
    resolve_target,
)
from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.input_files import open_regular
from warpdeck.engine.edges.item_loader import ItemLoader
from warpdeck.engine.edges.npy_inputs import dtype_problem, read_header, usable
from warpdeck.engine.state.batches import BatchKey, TaskInput

__all__ = [
    "SAFE_KEY",
    "InputError",
    "ItemsSourceImpl",
    "IterableSource",
    "KeyedTasks",
    "NpyDirSourceImpl",
    "Source",
    "SyntheticSourceImpl",
    "load_each",
    "load_npy_row",
    "open_source",
    "row_loader",
    "safe_key",
    "source_describes",
    "source_produces",
]


SAFE_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
"""Task keys name output files, so they are restricted to what is safe in a file name."""


class Source(Protocol):
    """Enumerates tasks and loads them."""

    @property
    def total(self) -> int | None:
        """How many tasks the source will yield, when known up front."""
        ...

    def items(self) -> Iterator[TaskInput]:
        """Yield every task once, in order. May block (it runs off the event loop)."""
        ...

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        """Write item j's input into ``out[j]``; return each item's error or None."""
        ...

    def produces(self, key: str) -> bool | None:
        """Whether ``items`` yields a task keyed ``key``, when the source can tell cheaply (no
        enumeration); None when it cannot. Commands that name a task not admitted yet ask it."""
        ...


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


_UNSAFE_IN_KEY = re.compile(r"[^A-Za-z0-9_.\-]")
"""What a key may not hold (it names an output file): anything but letters, digits, ``_``, ``.``, ``-``."""
_MAX_KEY = 200
"""The longest key (SAFE_KEY's limit)."""


def safe_key(parts: Sequence[str], whole: bytes) -> str:
    """A task key from ``parts`` (a path's folders and stem, or one column value): each part's unsafe
    characters as ``_``, the parts joined by ``__``, a leading dot as ``_`` (a hidden output is
    refused); a key over 200 characters keeps its start and ends in a hash of ``whole`` (the name it
    came from), so it stays unique."""
    key = "__".join(_UNSAFE_IN_KEY.sub("_", part) for part in parts) or "_"
    if key.startswith("."):
        key = "_" + key[1:]
    if len(key) > _MAX_KEY:
        digest = hashlib.blake2b(whole, digest_size=8).hexdigest()
        key = f"{key[: _MAX_KEY - len(digest) - 1]}-{digest}"
    return key


def load_each(items: Sequence[TaskInput], out: npt.NDArray[Any],
              load_one: Callable[[TaskInput, npt.NDArray[Any]], None]) -> list[BaseException | None]:
    """``load_one`` for each item into its row of ``out``; each item's error (or None): a file
    source's inputs fail one at a time, never their batch."""
    errors: list[BaseException | None] = []
    for j, t in enumerate(items):
        try:
            load_one(t, out[j])
            errors.append(None)
        except Exception as exc:  # noqa: BLE001 - reported per task
            errors.append(exc)
    return errors


def _splitmix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    z = x + _GOLD
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def synthetic_values(seed: int, indices: Sequence[int], shape: tuple[int, ...],
                     dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """The inputs of tasks ``indices``: a pure function of (seed, index, element), so a task's
    data never depends on which batch it lands in. Floats are uniform in [-1, 1)."""
    n = int(np.prod(shape, dtype=np.int64))
    with np.errstate(over="ignore"):
        seed_u = np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64)  # any int seed, negative too
        base = _splitmix(np.asarray(indices, np.uint64) ^ _splitmix(seed_u))
        z = _splitmix(base[:, None] + np.arange(n, dtype=np.uint64)[None, :] * _GOLD)
    if dtype.kind == "f":
        v = ((z >> np.uint64(11)).astype(np.float64) * (2.0**-52) - 1.0).astype(dtype)
        # Rounding to a narrow float can reach 1.0; keep the promised half-open range.
        np.minimum(v, np.nextafter(dtype.type(1), dtype.type(0)), out=v)
    elif dtype.kind == "c":
        re_ = (z >> np.uint64(11)).astype(np.float64) * (2.0**-52) - 1.0
        im = (z & np.uint64(0xFFFFFFFF)).astype(np.float64) * (2.0**-31) - 1.0
        v = (re_ + 1j * im).astype(dtype)
    else:
        v = (z >> np.uint64(64 - 8 * dtype.itemsize)).astype(dtype)
    return v.reshape((len(indices), *shape))


class SyntheticSourceImpl:
    """``count`` tasks keyed ``syn-00000000``…, data from ``synthetic_values``."""

    def __init__(self, spec: SyntheticSource) -> None:
        self.spec = spec
        self.total: int | None = spec.count
        self._key = BatchKey("synthetic", tuple(spec.shape), spec.dtype)
        self._dtype = np.dtype(spec.dtype)

    def items(self) -> Iterator[TaskInput]:
        key = self._key
        for i in range(self.spec.count):
            yield TaskInput(f"syn-{i:08d}", key, i)

    def produces(self, key: str) -> bool:
        """Keys are formatted from an index: parse it back."""
        digits = key.removeprefix("syn-")
        if digits == key or not digits.isascii() or not digits.isdigit():
            return False
        i = int(digits)
        return i < self.spec.count and key == f"syn-{i:08d}"

    def describe(self, key: str) -> str:
        """The task's index and the seed its values come from."""
        if not self.produces(key):
            return ""
        return f"synthetic input {int(key.removeprefix('syn-'))} (seed {self.spec.seed})"

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        out[: len(items)] = synthetic_values(self.spec.seed, [t.handle for t in items], self._key.shape, self._dtype)
        return [None] * len(items)


_UNUSABLE = BatchKey("npy", (), "uint8")
"""The batching key of a task that fails on admission (it is never batched)."""


class NpyDirSourceImpl:
    """Every file matching ``glob`` in ``path``, sorted; each read straight into its row."""

    def __init__(self, spec: NpyDirSource, tasks: bool = True) -> None:
        self.spec = spec
        if not spec.path.is_dir():
            raise FileNotFoundError(f"source.path: {spec.path} is not a directory")
        # Everything the glob names is a task, so an odd entry fails visibly with its reason; only
        # directories not named like an input are skipped (a recursive glob yields those it visits).
        # A loader only (``tasks=False``) lists nothing: the handles it loads are paths.
        self._files = sorted(p for p in spec.path.glob(spec.glob) if p.suffix == ".npy" or not p.is_dir()) \
            if tasks else []
        self.total: int | None = len(self._files) if tasks else None
        self._stems: frozenset[str] | None = None
        self._described = ("", "")

    def exclude(self, keys: Container[str]) -> int:
        """Drop tasks by key before enumerating (a resumed run's done tasks: their files are never
        opened again); returns how many were dropped."""
        before = len(self._files)
        self._files = [p for p in self._files if p.stem not in keys]
        self.total = len(self._files)
        self._stems = None
        self._described = ("", "")
        return before - len(self._files)

    def produces(self, key: str) -> bool:
        """From the file list taken at start (a set of its names, made on the first question)."""
        if self._stems is None:
            self._stems = frozenset(p.stem for p in self._files)
        return key in self._stems

    def describe(self, key: str) -> str:
        """The file the task is read from: ``<path>/<key>.npy`` looked up in the sorted file list, else
        (a recursive glob, another suffix) the list searched for the stem; "" when it holds none."""
        if self._described[0] == key:  # a detail screen asks again with every snapshot
            return self._described[1]
        guess = self.spec.path / f"{key}.npy"
        i = bisect.bisect_left(self._files, guess)
        if i < len(self._files) and self._files[i] == guess:
            found = str(guess)
        else:
            found = next((str(p) for p in self._files if p.stem == key), "")
        self._described = (key, found)
        return found

    def items(self) -> Iterator[TaskInput]:
        fixed = None
        if self.spec.shape is not None and self.spec.dtype is not None:
            fixed = BatchKey("npy", tuple(self.spec.shape), self.spec.dtype)
        for path in self._files:
            if fixed is not None:
                yield TaskInput(path.stem, fixed, path)
                continue
            try:
                with open_regular(path) as f:
                    header = read_header(path, f)
                dtype = usable(path, header)
            except InputError as exc:  # fails that task alone, on admission
                yield TaskInput(path.stem, _UNUSABLE, path, f"input: {exc}")
                continue
            shape = tuple(self.spec.shape) if self.spec.shape is not None else header.shape
            yield TaskInput(path.stem, BatchKey("npy", shape, self.spec.dtype or dtype.name), path)

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        return load_each(items, out, lambda t, row: load_npy_row(t.handle, row))

    def row_loader(self) -> Callable[[Any, npt.NDArray[Any]], None]:
        """Loads one task's file into its row in a fill worker process (``host.fill_pool``)."""
        return load_npy_row


def load_npy_row(path: Path, row: npt.NDArray[Any]) -> None:
    """Read the ``.npy`` file at ``path`` into ``row``, which has the shape and dtype the task's
    batching key expects; an ``InputError`` when the file does not hold exactly that."""
    want_shape, want_dtype, nbytes = row.shape, row.dtype, row.nbytes
    with open_regular(path) as f:
        h = read_header(path, f)
        if h.dtype.hasobject:
            raise InputError(str(path), dtype_problem(h.dtype))
        if h.shape != want_shape:
            raise InputError(str(path), f"shape {list(h.shape)}, expected {list(want_shape)}")
        if h.dtype.newbyteorder("=") != want_dtype:
            raise InputError(str(path), f"dtype {h.dtype}, expected {want_dtype}")
        f.seek(h.offset)
        if h.fortran and len(h.shape) > 1:
            flat = np.fromfile(f, h.dtype, int(np.prod(h.shape)))
            got = flat.nbytes
            if got == nbytes:
                row[...] = flat.reshape(h.shape[::-1]).T
        else:
            got = f.readinto(row.reshape(-1).view(np.uint8).data)
            if got == nbytes and not h.dtype.isnative:
                row.byteswap(inplace=True)  # stored big-endian: the row holds native values
    if got != nbytes:
        raise InputError(str(path), f"truncated ({got} of {nbytes} data bytes)")


class KeyedTasks:
    """What a source whose tasks are all known when it opens, under one batching key, shares: its
    tasks by key (``_tasks``: key -> the handle ``load`` takes, in enumeration order), enumerated,
    asked after, and cut by a resume (the image and Parquet sources)."""

    _tasks: dict[str, Any]
    _key: BatchKey
    total: int | None

    def items(self) -> Iterator[TaskInput]:
        key = self._key
        for k, handle in self._tasks.items():
            yield TaskInput(k, key, handle)

    def exclude(self, keys: Container[str]) -> int:
        """Drop tasks by key before enumerating (a resumed run's done tasks are never opened again);
        returns how many were dropped."""
        before = len(self._tasks)
        self._tasks = {k: h for k, h in self._tasks.items() if k not in keys}
        self.total = len(self._tasks)
        return before - len(self._tasks)

    def produces(self, key: str) -> bool:
        """From the tasks known when the source opened."""
        return key in self._tasks


class IterableSource:
    """Arrays (or ``(key, array)`` pairs) from any Python iterable, for the API and ``callable``
    specs. Items are held until loaded."""

    def __init__(self, iterable: Iterable[Any] | Callable[[], Iterable[Any]], total: int | None = None) -> None:
        self._iterable = iterable
        self.total = total

    def items(self) -> Iterator[TaskInput]:
        it = self._iterable() if callable(self._iterable) else self._iterable
        for i, item in enumerate(it):
            key, arr = item if isinstance(item, tuple) else (f"item-{i:08d}", item)
            arr = np.asarray(arr)
            key = str(key)
            err = "" if SAFE_KEY.match(key) else f"key {key[:40]!r} must be letters, digits, '.', '_' or '-'"
            if arr.dtype.hasobject:
                err = err or "object arrays are refused"
            err = err or dtype_problem(arr.dtype)
            yield TaskInput(key, BatchKey("array", tuple(arr.shape), arr.dtype.name), arr, err)

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        for j, t in enumerate(items):
            np.copyto(out[j], t.handle)
        return [None] * len(items)

    def produces(self, key: str) -> bool | None:
        """An iterable's keys are known only by iterating it: it cannot say."""
        return None

    def describe(self, key: str) -> str:
        """An array from the iterable (its position, when the key is the one it was given by it)."""
        digits = key.removeprefix("item-")
        if digits != key and digits.isascii() and digits.isdigit():
            return f"item {int(digits)} of a Python iterable"
        return "an array from a Python iterable"


class ItemsSourceImpl:
    """A user's own items: ``items()`` lists ``(key, handle)`` pairs, ``load(handle, row)`` writes
    one item in place, ``load_batch(handles, out)`` a batch (on a fill thread, or in a fill worker
    process: ``row_loader``; the same ``ItemLoader`` in both, engine/edges/item_loader.py)."""

    def __init__(self, spec: ItemsSource, picklable: bool = False) -> None:
        self._list = resolve_target(spec.items)
        self._options = dict(spec.options)
        self._loader = ItemLoader(resolve_target(spec.load) if spec.load is not None else None,
                                  resolve_target(spec.load_batch) if spec.load_batch is not None else None)
        self._key = BatchKey("items", tuple(spec.shape), spec.dtype)
        self.total: int | None = None
        self.picklable = picklable
        """Handles must pickle (their loads run in worker processes): one that does not fails its task on admission,
        naming why, instead of reaching a worker."""

    def items(self) -> Iterator[TaskInput]:
        key_of = self._key
        for i, item in enumerate(self._list(**self._options)):
            key, handle = item if isinstance(item, tuple) and len(item) == 2 else (f"item-{i:08d}", item)  # noqa: PLR2004
            key = str(key)
            err = "" if SAFE_KEY.match(key) else f"input: key {key[:40]!r} must be letters, digits, '.', '_' or '-'"
            if self.picklable and not err:
                err = _unpicklable(handle)
            yield TaskInput(key, key_of, handle, err)

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        return self._loader.load_batch([t.handle for t in items], out[: len(items)])

    def row_loader(self) -> ItemLoader:
        """The loader a fill worker process runs: a batch at a time where the spec gives ``load_batch``."""
        return self._loader

    def produces(self, key: str) -> bool | None:
        """The user's list is known only by listing it: it cannot say."""
        return None


def _unpicklable(handle: Any) -> str:
    """Why ``handle`` cannot travel to a worker process ("" when it can)."""
    try:
        pickle.dumps(handle)
    except Exception as exc:  # noqa: BLE001 - whatever stops it pickling
        return (f"input: its handle {type(handle).__name__} cannot be sent to a fill worker process "
                f"({type(exc).__name__}: {exc}); hand out a path, an id or an offset instead")
    return ""


def row_loader(source: Source) -> Callable[[Any, npt.NDArray[Any]], None]:
    """The function that loads one of ``source``'s tasks into its row in a fill worker process
    (``host.fill_pool = "processes"``); a ``ValueError`` naming the source when it has none."""
    make = getattr(source, "row_loader", None)
    if make is None:
        raise ValueError(f"host.fill_pool = 'processes': a {type(source).__name__} loads in the engine's process; "
                         "use an items source (your own load function), images or npy_dir")
    loader: Callable[[Any, npt.NDArray[Any]], None] = make()
    return loader


def open_source(spec: SyntheticSource | NpyDirSource | ImageSource | ParquetSource | CallableSource | ItemsSource,
                *, tasks: bool = True, processes: bool = False) -> Source:
    """The source a spec section describes. ``tasks=False``: a loader of the handles another
    process enumerated (a Ray actor with shared data): it lists no folder and reads no key column,
    so ``items`` yields nothing and ``total`` is None; ``load`` is the same."""
    if isinstance(spec, SyntheticSource):
        return SyntheticSourceImpl(spec)
    if isinstance(spec, NpyDirSource):
        return NpyDirSourceImpl(spec, tasks)
    if isinstance(spec, ImageSource):
        # Pillow is optional (warpdeck[images]): imported only by a run that reads images.
        from warpdeck.engine.edges.image_source import ImageSourceImpl  # noqa: PLC0415

        return ImageSourceImpl(spec, tasks)
    if isinstance(spec, ParquetSource):
        # pyarrow is optional (warpdeck[parquet]): imported only by a run that reads Parquet.
        from warpdeck.engine.edges.parquet_source import ParquetSourceImpl  # noqa: PLC0415

        return ParquetSourceImpl(spec, tasks)
    if isinstance(spec, ItemsSource):
        return ItemsSourceImpl(spec, picklable=processes)
    return IterableSource(resolve_target(spec.target))


def source_describes(source: Source, key: str) -> str:
    """Where ``key``'s input comes from, in words (a path, an index); "" when the source cannot say
    (one written without a ``describe`` method)."""
    ask = getattr(source, "describe", None)
    return str(ask(key)) if ask is not None else ""


def source_produces(source: Source, key: str) -> bool | None:
    """``source.produces(key)``; None (cannot say) from a source written before that method existed."""
    ask = getattr(source, "produces", None)
    return ask(key) if ask is not None else None
