"""Parquet files as inputs: each row a task, one array column read by row group on the fill threads.

The decisions this module protects:
- The schema is checked when the source opens, before any task runs: the array column must exist
  and be a list (fixed-size or not) nested once per axis of ``shape``, with fixed sizes equal to
  ``shape`` and innermost values of ``dtype``; the key column must hold strings or integers. A
  mismatch is a ``SpecError`` naming the field (``source.column``, ``source.shape``,
  ``source.dtype``, ``source.key``) and the file.
- Counting reads metadata and the key column only: row counts per row group, and the keys. The
  arrays are read in ``load``, on a lane's fill threads, one row group at a time; each thread keeps
  the last row group it read (a batch's rows are contiguous in practice), so memory holds at most
  one row group's column per fill thread, never a whole table.
- A row whose value is null, holds a null, or has a list of the wrong length (possible only in a
  variable-length list column) fails alone as an ``InputError`` naming the file, the row and the
  reason; its row group's other rows load as usual.
- Keys: the key column's values (integers as decimal), characters outside ``SAFE_KEY`` as ``_``, a
  leading dot as ``_``, a key over 200 characters cut and ended with a hash of the whole value; a
  null key or two rows giving one key is a spec error naming both. Without a key column the key is
  ``<file stem>-<row in file>``.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from warpdeck.engine.edges.config import ParquetSource, SpecError, SpecIssue
from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.sources import KeyedTasks, load_each, safe_key
from warpdeck.engine.state.batches import BatchKey, TaskInput

__all__ = ["ParquetSourceImpl", "flat_values", "table_key"]



def table_key(value: object) -> str:
    """The task key a key column's ``value`` gives (see the module docstring)."""
    text = str(value)
    return safe_key((text,), text.encode("utf-8", "surrogatepass"))


def flat_values(arr: Any, shape: tuple[int, ...]) -> tuple[npt.NDArray[Any] | None, str]:
    """The innermost values of list array ``arr`` (one row per element, each of ``shape``) as one
    flat NumPy array; or None and the first reason a row cannot be used (null, wrong length)."""
    for axis, size in enumerate(shape):
        if arr.null_count:
            return None, "value is null" if axis == 0 else f"holds a null list on axis {axis}"
        if pa.types.is_fixed_size_list(arr.type):
            if arr.type.list_size != size:
                return None, f"axis {axis} has length {arr.type.list_size}, expected {size}"
        else:
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            wrong = lengths[lengths != size]
            if len(wrong):
                return None, f"axis {axis} has length {int(wrong[0])}, expected {size}"
        arr = arr.flatten()
    if arr.null_count:
        return None, "holds a null element"
    return arr.to_numpy(zero_copy_only=False), ""


def _spec_error(field: str, message: str) -> SpecError:
    return SpecError("parquet source", [SpecIssue(f"source.{field}", message)])


class ParquetSourceImpl(KeyedTasks):
    """Every row of ``path`` (a file, or the sorted ``.parquet`` files of a directory)."""

    def __init__(self, spec: ParquetSource, tasks: bool = True) -> None:
        self.spec = spec
        path = spec.path
        if path.is_dir():
            # Everything named like a part is one: a directory ``x.parquet`` is refused, named.
            self._files = sorted(path.glob("*.parquet"))
        elif path.is_file():
            self._files = [path]
        else:
            raise FileNotFoundError(f"source.path: {path} is neither a file nor a directory")
        self._shape = tuple(spec.shape)
        self._key = BatchKey("parquet", self._shape, spec.dtype)
        self._file_starts: list[int] = []
        """Global row index where each file starts, and per file where each row group starts."""
        self._group_starts: list[list[int]] = []
        self._tasks: dict[str, int] = {}
        """Key -> global row index, in file and row order (what ``items`` yields)."""
        start = 0
        for path_ in self._files:
            try:
                pf = pq.ParquetFile(path_)
            except (OSError, pa.ArrowException) as exc:
                raise _spec_error("path", f"{path_} cannot be read as Parquet: {exc}") from None
            self._check_schema(path_, pf.schema_arrow)
            meta = pf.metadata
            groups = [0]
            for g in range(meta.num_row_groups):
                groups.append(groups[-1] + meta.row_group(g).num_rows)
            self._file_starts.append(start)
            self._group_starts.append(groups)
            if tasks:  # a loader only (handles are global rows) needs the footers, not the keys
                self._add_keys(path_, pf, start, groups[-1])
            start += groups[-1]
        self.total: int | None = len(self._tasks) if tasks else None
        self._local = threading.local()

    @property
    def batch_key(self) -> BatchKey:
        """The one batching key every task of this source has."""
        return self._key

    def _check_schema(self, path: Path, schema: Any) -> None:
        spec = self.spec
        if spec.column not in schema.names:
            raise _spec_error("column", f"{path} has no column {spec.column!r} (it has {schema.names})")
        t = schema.field(spec.column).type
        for axis, size in enumerate(self._shape):
            if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
                raise _spec_error("shape" if axis else "column",
                                  f"{path}: column {spec.column!r} is {t}, not a list nested {len(self._shape)} deep")
            if pa.types.is_fixed_size_list(t) and t.list_size != size:
                raise _spec_error("shape", f"{path}: column {spec.column!r} has {t.list_size} values on axis {axis},"
                                           f" the spec's shape {list(self._shape)} {size}")
            t = t.value_type
        try:
            want = pa.from_numpy_dtype(np.dtype(spec.dtype))
        except (pa.ArrowException, NotImplementedError):
            raise _spec_error("dtype", f"{spec.dtype} has no Parquet type") from None
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            raise _spec_error("shape", f"{path}: column {spec.column!r} is nested deeper than shape"
                                       f" {list(self._shape)}")
        if t != want:
            raise _spec_error("dtype", f"{path}: column {spec.column!r} holds {t}, not {spec.dtype}")
        if spec.key is not None:
            if spec.key not in schema.names:
                raise _spec_error("key", f"{path} has no column {spec.key!r} (it has {schema.names})")
            k = schema.field(spec.key).type
            if not (pa.types.is_integer(k) or pa.types.is_string(k) or pa.types.is_large_string(k)):
                raise _spec_error("key", f"{path}: key column {spec.key!r} is {k}, not strings or integers")

    def _add_keys(self, path: Path, pf: Any, start: int, n: int) -> None:
        if self.spec.key is None:
            stem = table_key(path.stem)
            keys: list[object] = [f"{stem}-{i}" for i in range(n)]
        else:
            keys = pf.read(columns=[self.spec.key]).column(0).to_pylist()
        for i, value in enumerate(keys):
            if value is None:
                raise _spec_error("key", f"{path}: row {i} has no key (null)")
            key = table_key(value)
            other = self._tasks.setdefault(key, start + i)
            if other != start + i:
                raise _spec_error("key", f"{self._where(other)} and {path} row {i} both make task key {key!r}")

    def _locate(self, row: int) -> tuple[int, int, int]:
        """(file index, row group, row within the group) of global row ``row``."""
        f = bisect.bisect_right(self._file_starts, row) - 1
        in_file = row - self._file_starts[f]
        starts = self._group_starts[f]
        g = bisect.bisect_right(starts, in_file) - 1
        return f, g, in_file - starts[g]

    def _where(self, row: int) -> str:
        f, _, _ = self._locate(row)
        return f"{self._files[f]} row {row - self._file_starts[f]}"

    def describe(self, key: str) -> str:
        """The file, row group and row the task is read from; "" when no row gives ``key``."""
        row = self._tasks.get(key)
        if row is None:
            return ""
        f, g, _ = self._locate(row)
        return f"{self._files[f]}, row group {g}, row {row - self._file_starts[f]} (column {self.spec.column!r})"

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        """Copy item j's row into ``out[j]``; each item's error (or None). Runs on a fill thread."""
        return load_each(items, out, lambda t, dest: self._load_one(t.handle, dest))

    def _load_one(self, row: int, dest: npt.NDArray[Any]) -> None:
        f, g, i = self._locate(row)
        where = str(self._files[f])
        try:
            values, column = self._group(f, g)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(where, f"row group {g} cannot be read: {exc}") from None
        in_file = row - self._file_starts[f]
        if values is not None:
            dest[...] = values[i]
            return
        flat, reason = flat_values(column.slice(i, 1), self._shape)
        if flat is None:
            raise InputError(where, f"row {in_file} (row group {g}): {reason}")
        dest[...] = flat.reshape(self._shape)

    def _group(self, f: int, g: int) -> tuple[npt.NDArray[Any] | None, Any]:
        """Row group ``g`` of file ``f``'s array column: all its rows as one array when every row is
        usable, else the Arrow column (rows checked one by one). Cached per thread, one group."""
        local = self._local
        cached = getattr(local, "group", None)
        if cached is not None and cached[0] == (f, g):
            return cached[1], cached[2]
        local.group = None  # let the previous group go before the next is read
        handle = getattr(local, "file", None)
        if handle is None or handle[0] != f:
            if handle is not None:
                handle[1].close()
            handle = local.file = (f, pq.ParquetFile(self._files[f]))
        column = handle[1].read_row_group(g, columns=[self.spec.column]).column(0).combine_chunks()
        flat, _ = flat_values(column, self._shape)
        values = None if flat is None else flat.reshape((len(column), *self._shape))
        local.group = ((f, g), values, None if values is not None else column)
        return values, column
