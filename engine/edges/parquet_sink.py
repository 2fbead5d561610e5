"""Outputs as Parquet: one part file per batch, each renamed into place whole, so a done row in the
journal always has its output in a part file and a resumed run writes no row twice.

The decisions this module protects:
- Exactly once, with the per-batch ``write_batch`` extension of the sink protocol (``sinks.py``):
  the sink thread writes a batch's rows (``key``, ``output``) to ``.part-NNNNN.parquet.<pid>.tmp``
  and renames it to ``part-NNNNN.parquet`` before it returns; the engine records the rows done only
  after that (as for every sink), so a done row is always in a landed part file. A kill between the
  rename and the journal's commit leaves a part file whose rows the journal does not show done: the
  journal is reconciled from the part files (``committed`` answers from the keys of the files present
  when the run began, read in ``clean_temps``), so those rows are recorded done and not run again,
  but only once the part's rows match the checksums kept in its own metadata (``warpdeck.crc32``:
  each row's CRC-32, of the output's bytes before the part is encoded). A part that does not
  match, or has none, is removed and its tasks run again: a landed part the journal never recorded
  is trusted only as far as it can be checked. A kill before the rename leaves only a temp file,
  removed at the next start.
- The cost of one file per batch: a batch is the smallest unit that becomes durable, so a run of
  small batches makes many small files (each with its own footer; readers list them all). Compact
  them after the run if that matters; ``row_group_size`` only splits a batch larger than it.
- Part numbers continue after the highest already in the directory (found at the first write, under
  the run directory's lock), so a resumed run never overwrites an earlier run's file.
- ``output`` is a fixed-size list of the output's element type, nested once per further axis (a 2-D
  output is a list of lists), so the Parquet source reads it back with the same ``shape``. Complex
  outputs have no Parquet type and fail.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import zlib
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from warpdeck.engine.edges.sinks import TMP_SUFFIX, PartNumbers

__all__ = ["CRC_KEY", "PART_GLOB", "ParquetSinkImpl", "fixed_size_lists", "part_matches"]

PART_GLOB = "part-*.parquet"
_PART = re.compile(r"^part-(\d+)\.parquet$")
CRC_KEY = b"warpdeck.crc32"
"""The part file's metadata key for its rows' checksums: CRC-32 of each output, 8 hex digits, in row order."""


def _row_sums(rows: npt.NDArray[Any]) -> bytes:
    """Each row's CRC-32 (of its values' bytes in C order), 8 hex digits, space-separated."""
    return b" ".join(b"%08x" % zlib.crc32(np.ascontiguousarray(row).data) for row in rows)


def _rows_of(column: Any) -> npt.NDArray[Any]:
    """A fixed-size-list column back as one array, a row per output (as ``fixed_size_lists`` made it)."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    n, shape = len(arr), []
    while pa.types.is_fixed_size_list(arr.type):
        shape.append(arr.type.list_size)
        arr = arr.flatten()
    return np.asarray(arr.to_numpy(zero_copy_only=False)).reshape(n, *shape)


def part_matches(path: Path) -> bool:
    """Whether every row of the part file at ``path`` matches the checksum its metadata keeps."""
    try:
        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        want = meta.get(CRC_KEY)
        return want is not None and want == _row_sums(_rows_of(table.column("output")))
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return False


def fixed_size_lists(rows: npt.NDArray[Any]) -> Any:
    """``rows`` (one output per element of the first axis) as an Arrow array of fixed-size lists,
    nested once per further axis."""
    values: Any = pa.array(np.ascontiguousarray(rows).reshape(-1))
    for size in reversed(rows.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values


class ParquetSinkImpl:
    """``<dir>/part-NNNNN.parquet`` through ``.part-NNNNN.parquet.<pid>.tmp`` and ``os.replace``."""

    def __init__(self, directory: Path, row_group_size: int = 4096) -> None:
        self.dir = directory
        self.row_group_size = row_group_size
        self._pid = os.getpid()
        self._calls = itertools.count()
        """Numbers this process's own writes' temp names (sink threads write at once)."""
        self._lock = threading.Lock()
        self._numbers = PartNumbers(directory, _PART)
        self._landed: frozenset[str] | None = None
        self._part_of: dict[str, Path] = {}
        """The part file each landed key is in, and what checking each part found."""
        self._checked: dict[Path, bool] = {}
        self.rejected = 0
        """Landed outputs (rows) whose part did not match its checksums, removed with their part."""

    def describe(self, key: str) -> str:
        """Where ``key``'s output lands, in words."""
        return f"written as a row (key {key!r}) of a part-NNNNN.parquet file in {self.dir}"

    def _part_keys(self) -> frozenset[str]:
        self._part_of = {}
        if self.dir.is_dir():
            for p in sorted(self.dir.glob(PART_GLOB)):
                for k in pq.read_table(p, columns=["key"]).column(0).to_pylist():
                    self._part_of[k] = p
        return frozenset(self._part_of)

    def committed(self, key: str) -> bool:
        """Whether a part file holds ``key``'s row, matching the checksums in its metadata: the keys
        of the part files present when the run began (read once). The rename is atomic, so a part
        file that exists is whole; a part whose rows do not match is removed (its tasks run again)."""
        with self._lock:
            if self._landed is None:
                self._landed = self._part_keys()
            part = self._part_of.get(key) if key in self._landed else None
            if part is None:
                return False
            ok = self._checked.get(part)
            if ok is None:
                ok = self._checked[part] = part_matches(part)
                if not ok:
                    gone = [k for k, p in self._part_of.items() if p == part]
                    self._landed = self._landed.difference(gone)
                    self.rejected += len(gone)
                    part.unlink(missing_ok=True)
            return ok

    def clean_temps(self) -> int:
        """Remove temp files a killed run left behind and read the landed part files' keys; returns
        how many temps. Call only while no engine writes here (the journal's run-directory lock)."""
        n = 0
        if self.dir.is_dir():
            for p in self.dir.glob(f".part-*.parquet.*{TMP_SUFFIX}"):
                p.unlink(missing_ok=True)
                n += 1
        self._landed = self._part_keys()
        return n

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        """One output as a part file of its own (callers that hold whole batches use ``write_batch``)."""
        self.write_batch([key], out[np.newaxis])

    def write_batch(self, keys: Sequence[str], outs: npt.NDArray[Any]) -> None:
        """Write ``outs[j]`` under ``keys[j]`` as one part file, renamed into place before returning;
        raises (and leaves nothing) when any of it fails."""
        self.commit(keys, self.stage(keys, outs, f"{self._pid}-{next(self._calls)}"))

    def stage(self, keys: Sequence[str], outs: npt.NDArray[Any], tag: str) -> tuple[str, ...]:
        """The batch as one temp part file ``.part-staged.parquet.<tag>.tmp``, not yet numbered
        nor renamed (``commit`` does both)."""
        if outs.dtype.kind == "c":
            raise ValueError(f"{outs.dtype} outputs have no Parquet type; write them to an npy_dir sink")
        rows = outs[: len(keys)]
        sums = _row_sums(rows)
        table = pa.table({"key": pa.array(list(keys), pa.string()), "output": fixed_size_lists(rows)},
                         metadata={CRC_KEY: sums})
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".part-staged.parquet.{tag}{TMP_SUFFIX}"
        try:
            # Through a Python file: a full disk raises OSError with its errno (an outage, not a failure).
            with tmp.open("wb") as f:
                pq.write_table(table, f, row_group_size=self.row_group_size)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return (tmp.name,)

    def commit(self, keys: Sequence[str], staged: tuple[str, ...], drop: Collection[str] = ()) -> None:
        """Rename the staged part to the next ``part-NNNNN.parquet``; rows of ``drop`` (tasks cancelled
        meanwhile) are first written out of it (rare: the part is rewritten)."""
        (name,) = staged
        tmp = self.dir / name
        try:
            if drop and any(k in drop for k in keys):
                table = pq.read_table(tmp)
                keep = [j for j, k in enumerate(keys) if k not in drop]
                if not keep:
                    tmp.unlink()
                    return
                sums = (table.schema.metadata or {}).get(CRC_KEY, b"").split(b" ")
                kept = table.take(keep).replace_schema_metadata(
                    {CRC_KEY: b" ".join(sums[j] for j in keep)} if len(sums) == len(keys) else None)
                with tmp.open("wb") as f:
                    pq.write_table(kept, f, row_group_size=self.row_group_size)
            tmp.replace(self.dir / f"part-{self._numbers.take():05d}.parquet")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
