"""Reading a large Parquet file through the Parquet source: memory stays bounded by row groups.

Writes a file of random float32 rows (16 KiB each: fixed-size lists of 4096, 4 MiB row groups,
uncompressed, no dictionary, so the file is as large as its values) into a temporary folder, then
in a fresh subprocess opens it with ``ParquetSourceImpl`` (engine/edges/parquet_source.py) and loads
every row in batches of 64 as a fill thread does, checking each row's first value (its row index).

Figures:
  RSS before         /proc/self/status VmRSS after opening the source (metadata read, keys listed)
  peak RSS growth    VmHWM after loading everything - RSS before (VmHWM reset through
                     /proc/self/clear_refs just before the loads)
  Arrow pool peak    pyarrow's default memory pool's high-water mark
  read rate          file bytes / load time

Target (issue 18): a 2 GB file read within the memory budget (``feeder.memory_budget_mb``, 1024 MB
by default); shown against 256 MB of peak growth, a quarter of it. Linux only (reads /proc).

    python benchmarks/parquet_stream.py [--quick] [--gb 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, verdict, write_json

MB = 2**20
WIDTH = 4096
GROUP = 256
BATCH = 64
TARGET_MB = 256


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _write(path: Path, rows: int) -> None:
    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from warpdeck.engine.edges.parquet_sink import fixed_size_lists  # noqa: PLC0415

    rng = np.random.default_rng(0)
    schema = pa.schema([("x", pa.list_(pa.float32(), WIDTH))])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        for start in range(0, rows, GROUP):
            group = rng.random((min(GROUP, rows - start), WIDTH), np.float32)
            group[:, 0] = np.arange(start, start + len(group))
            writer.write_table(pa.table({"x": fixed_size_lists(group)}), row_group_size=GROUP)


def _child(path: Path) -> dict[str, Any]:
    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415

    from warpdeck.engine.edges.config import ParquetSource  # noqa: PLC0415
    from warpdeck.engine.edges.parquet_source import ParquetSourceImpl  # noqa: PLC0415

    src = ParquetSourceImpl(ParquetSource(kind="parquet", path=path, column="x", shape=(WIDTH,)))
    items = list(src.items())
    out = np.zeros((BATCH, WIDTH), np.float32)
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    for i in range(0, len(items), BATCH):
        batch = items[i:i + BATCH]
        if src.load(batch, out) != [None] * len(batch):
            raise RuntimeError(f"a row of batch {i // BATCH} failed to load")
        if not (out[: len(batch), 0] == np.arange(i, i + len(batch))).all():
            raise RuntimeError(f"batch {i // BATCH} holds the wrong rows")
    load_s = time.perf_counter() - t0
    return {"rows": len(items), "rss_before_mb": before / 1024, "peak_growth_mb": (_status_kb("VmHWM") - before) / 1024,
            "arrow_peak_mb": pa.default_memory_pool().max_memory() / MB, "load_s": load_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 0.2 GB file instead of 2 GB")
    ap.add_argument("--gb", type=float, help="file size in GB (overrides --quick)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    ap.add_argument("--child", metavar="FILE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(Path(args.child))))
        return 0
    gb = args.gb if args.gb is not None else (0.2 if args.quick else 2.0)
    rows = max(GROUP, int(gb * 1e9) // (WIDTH * 4))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.parquet"
        t0 = time.perf_counter()
        _write(path, rows)
        write_s = time.perf_counter() - t0
        size = path.stat().st_size
        run = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                             check=True)
    r = {**json.loads(run.stdout), "file_mb": size / MB, "write_s": write_s}
    print_table(f"parquet_stream: {r['file_mb']:,.0f} MB file, {r['rows']:,} rows of {WIDTH * 4 // 1024} KiB,"
                f" row groups of {GROUP} rows, batches of {BATCH} (fresh subprocess)",
                ["figure", "value", "target", ""], [
                    ["RSS before (source open)", f"{r['rss_before_mb']:.0f} MB", "", verdict(None)],
                    ["peak RSS growth while reading", f"{r['peak_growth_mb']:.0f} MB", f"<= {TARGET_MB} MB",
                     verdict(r["peak_growth_mb"] <= TARGET_MB)],
                    ["Arrow pool peak", f"{r['arrow_peak_mb']:.0f} MB", "", verdict(None)],
                    ["read rate", f"{r['file_mb'] / r['load_s']:.0f} MB/s", "", verdict(None)],
                ], right=[False, True, True, False])
    write_json(args.json, "parquet_stream", r)
    return 0 if r["peak_growth_mb"] <= TARGET_MB else 1


if __name__ == "__main__":
    sys.exit(main())
