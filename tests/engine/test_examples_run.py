"""Every example runs headless on NumPy, end to end, and matches a direct NumPy computation."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from warpdeck.engine.api import load_spec, run_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["spectrogram", "dense", "conv2d"]


@pytest.mark.parametrize("name", NAMES)
async def test_example_from_files_matches_reference(name: str, tmp_path: Path) -> None:
    module = importlib.import_module(f"warpdeck.examples.{name}")
    data = tmp_path / "data"
    paths = module.make_inputs(data, 24, seed=3)
    spec = load_spec(EXAMPLES / f"{name}.toml")
    spec = spec.model_copy(update={
        "backend": "numpy", "batch_size": 5,
        "source": spec.source.model_copy(update={"path": data}),
    })
    report = await run_pipeline(spec, tmp_path / "run")
    assert report.counts.done == 24 and report.exit_code == 0
    out_dir = tmp_path / "run" / "outputs"
    for p in paths:
        got = np.load(out_dir / p.name)
        want = module.reference(np.load(p))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not list(out_dir.glob(".*"))  # no temp files left behind


@pytest.mark.parametrize("name", NAMES)
async def test_synthetic_example_matches_reference(name: str, tmp_path: Path) -> None:
    from warpdeck.engine.edges.sources import synthetic_values

    module = importlib.import_module(f"warpdeck.examples.{name}")
    spec = load_spec(EXAMPLES / f"{name}-synthetic.toml")
    spec = spec.model_copy(update={
        "backend": "numpy", "batch_size": 16, "source": spec.source.model_copy(update={"count": 40}),
    })
    report = await run_pipeline(spec, tmp_path / "run")
    assert report.counts.done == 40
    src = spec.source
    for i in (0, 17, 39):
        x = synthetic_values(src.seed, [i], tuple(src.shape), np.dtype(src.dtype))[0]
        got = np.load(tmp_path / "run" / "outputs" / f"syn-{i:08d}.npy")
        np.testing.assert_allclose(got, module.reference(x), rtol=1e-4, atol=1e-5)
