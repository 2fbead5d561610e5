"""The Parquet-to-Parquet example: a table written by ``warpdeck.examples.tables`` runs headless
through the dense stage into Parquet part files, every row once, matching the dense reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from warpdeck.examples import dense

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_parquet_example_runs_from_the_readme_commands(tmp_path: Path) -> None:
    table = tmp_path / "data" / "dense.parquet"
    made = subprocess.run([sys.executable, "-m", "warpdeck.examples.tables", str(table), "--count", "600"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert made.returncode == 0, made.stderr
    spec = tmp_path / "dense-parquet.toml"  # the example's spec beside its data, as in examples/
    spec.write_text((EXAMPLES / "dense-parquet.toml").read_text().replace('backend = "auto"', 'backend = "numpy"'))
    run = subprocess.run([sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--broker", "none",
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, check=False,
                         timeout=300, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stdout + run.stderr
    parts = sorted((tmp_path / "run" / "outputs").glob("part-*.parquet"))
    assert parts
    got = pq.read_table(parts).to_pydict()
    assert sorted(got["key"]) == [f"dense-{i:05d}" for i in range(600)]  # every row once
    source = pq.read_table(table).to_pydict()
    features = dict(zip(source["id"], source["features"], strict=True))
    for key, out in zip(got["key"], got["output"], strict=True):
        x = np.asarray(features[key], np.float32)
        np.testing.assert_allclose(np.asarray(out, np.float32), dense.reference(x), rtol=1e-4, atol=1e-5)
