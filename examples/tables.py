"""Tables in and out: the dense example's vectors as a Parquet table, for the Parquet-to-Parquet
pipeline (``examples/dense-parquet.toml``).

Row i holds the same vector as the dense example's file i (``dense.make_inputs``, same seed): an
``id`` column (``dense-00000``…) and a ``features`` column of fixed-size lists of ``D_IN`` float32.
The pipeline reads it by row group, runs the dense stage, and writes ``key`` and ``output``
columns to Parquet part files in the run directory.

Write the table with ``python -m warpdeck.examples.tables examples/data/dense.parquet --count 5000``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from warpdeck.examples.dense import INPUT_SHAPE

__all__ = ["main", "make_table"]


def make_table(path: str | Path, count: int, seed: int = 0, row_group_size: int = 1024) -> Path:
    """Write ``count`` rows to the Parquet file ``path`` (its folder made if missing); row i depends
    only on (seed, i), as the dense example's file i does."""
    import pyarrow as pa  # type: ignore[import-untyped]  # noqa: PLC0415 - the parquet extra
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # noqa: PLC0415

    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rows = np.stack([np.random.default_rng([seed, i]).standard_normal(INPUT_SHAPE).astype(np.float32)
                     for i in range(count)]) if count else np.zeros((0, *INPUT_SHAPE), np.float32)
    table = pa.table({
        "id": pa.array([f"dense-{i:05d}" for i in range(count)], pa.string()),
        "features": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), INPUT_SHAPE[0]),
    })
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out, row_group_size=row_group_size)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m warpdeck.examples.tables FILE --count N --seed S``."""
    parser = argparse.ArgumentParser(prog="python -m warpdeck.examples.tables",
                                     description="Write the dense example's vectors as a Parquet table.")
    parser.add_argument("path", type=Path, help="the .parquet file to write")
    parser.add_argument("--count", type=int, default=5000, help="how many rows (default 5000)")
    parser.add_argument("--seed", type=int, default=0, help="non-negative random seed (default 0)")
    args = parser.parse_args(argv)
    if args.count < 0 or args.seed < 0:
        parser.error("--count and --seed must be non-negative")
    make_table(args.path, args.count, args.seed)
    print(f"wrote {args.count} rows of {INPUT_SHAPE[0]} float32 features to {args.path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
