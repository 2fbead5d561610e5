"""The spec sections of columnar tables: Parquet files in (``[source] kind = "parquet"``) and out
(``[sink] kind = "parquet"``), read and written with pyarrow (``pip install 'warpdeck[parquet]'``).

The decision this module protects: a table source names its array column, shape and dtype up front,
so every task has one batching key and the file's schema is checked against them when the source
opens, before any task runs; ``config.py`` stays the one tree these sections hang from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from warpdeck.engine.edges.spec_types import Dtype, Shape, SpecModel

__all__ = ["ParquetSink", "ParquetSource"]


class ParquetSource(SpecModel):
    """Rows of Parquet files as tasks: one file, or every ``.parquet`` file of a directory (sorted)."""

    kind: Literal["parquet"]
    path: Path
    """A ``.parquet`` file or a directory of them; relative paths resolve against the spec file's directory."""
    column: str = Field(min_length=1)
    """The array column: a fixed-size list (nested once per further axis for 2-D and up) or a list."""
    shape: Shape = Field(min_length=1)
    """Shape of one task's array; a fixed-size list column's sizes must be these."""
    dtype: Dtype = "float32"
    """Element type; the column's innermost values must be of this type."""
    key: str | None = Field(default=None, min_length=1)
    """The key column (strings or integers), made safe for a file name; absent: ``<file stem>-<row>``."""


class ParquetSink(SpecModel):
    """Outputs as rows ``key``, ``output`` (a fixed-size list column) of ``<path>/part-NNNNN.parquet``
    files, one per batch, each written to a temp name and renamed into place."""

    kind: Literal["parquet"]
    path: Path = Path("outputs")
    """Output directory; a relative path resolves inside the run directory."""
    row_group_size: int = Field(default=4096, ge=1, le=1 << 24)
    """Most rows per row group of a part file."""
