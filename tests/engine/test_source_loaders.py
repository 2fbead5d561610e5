"""A source opened as a loader only (``open_source(spec, tasks=False)``), as a Ray actor with
shared data opens it: it lists no folder and reads no key column (the engine enumerated), yields
no tasks, and loads the engine's handles exactly as the full source does. Real files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from warpdeck.engine.api import parse_spec
from warpdeck.engine.edges.sources import open_source
from warpdeck.engine.state.batches import BatchKey, TaskInput


def _section(kind: str, tmp: Path) -> Any:
    if kind == "npy_dir":
        (tmp / "in").mkdir()
        for i in range(5):
            np.save(tmp / "in" / f"x{i}.npy", np.full((2, 3), i, np.float32))
        source: dict[str, Any] = {"kind": "npy_dir", "path": str(tmp / "in"), "shape": [2, 3], "dtype": "float32"}
    elif kind == "images":
        pytest.importorskip("PIL")
        from warpdeck.examples.classify import make_images

        make_images(tmp / "in", 5)
        source = {"kind": "images", "path": str(tmp / "in"), "size": [8, 8], "mode": "L", "dtype": "uint8"}
    else:
        pytest.importorskip("pyarrow")
        from warpdeck.examples.tables import make_table

        make_table(tmp / "t.parquet", 9, row_group_size=4)
        source = {"kind": "parquet", "path": str(tmp / "t.parquet"), "column": "features", "shape": [512],
                  "dtype": "float32", "key": "id"}
    return parse_spec({"name": "loader", "source": source, "stages": [{"fn": "numpy:negative"}]}).source


@pytest.mark.parametrize("kind", ["npy_dir", "images", "parquet"])
def test_a_loader_lists_nothing_and_loads_what_the_source_loads(kind: str, tmp_path: Path) -> None:
    section = _section(kind, tmp_path)
    full, loader = open_source(section), open_source(section, tasks=False)
    assert loader.total is None and list(loader.items()) == []
    items = list(full.items())
    assert len(items) == full.total and items
    key = items[0].batch_key
    want, got = (np.zeros((len(items), *key.shape), key.dtype) for _ in range(2))
    assert full.load(items, want) == [None] * len(items)
    assert loader.load(items, got) == [None] * len(items)
    np.testing.assert_array_equal(got, want)


def test_a_parquet_loader_reads_no_key_column(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = pa.table({"id": ["a", "a", "b", "c"], "x": pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), 3)})
    pq.write_table(table, tmp_path / "t.parquet")
    section = parse_spec({"name": "loader", "stages": [{"fn": "numpy:negative"}], "source": {
        "kind": "parquet", "path": str(tmp_path / "t.parquet"), "column": "x", "shape": [3], "dtype": "float32",
        "key": "id"}}).source
    with pytest.raises(Exception, match="both make task key 'a'"):
        open_source(section)  # the engine, enumerating, refuses the colliding keys
    loader = open_source(section, tasks=False)  # an actor never reads them
    out = np.zeros((1, 3), np.float32)
    assert loader.load([TaskInput("c", BatchKey("parquet", (3,), "float32"), 3)], out) == [None]
    np.testing.assert_array_equal(out[0], rows[3])
