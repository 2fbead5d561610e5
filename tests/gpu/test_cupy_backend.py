"""The CuPy backend computes what the NumPy backend computes (overlap on a card: see issue 6)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

from warpdeck.engine.api import Engine, load_spec

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class _Collect:
    def __init__(self) -> None:
        self.out: dict[str, np.ndarray] = {}

    def write(self, key: str, out: np.ndarray) -> None:
        self.out[key] = np.array(out, copy=True)


async def _run(spec, backend_name: str) -> _Collect:
    from warpdeck.engine.backends import select_backend

    sink = _Collect()
    async with Engine(spec.model_copy(update={"backend": backend_name}), sink=sink,
                      backend=select_backend(backend_name)) as eng:
        report = await eng.wait()
    assert report.counts.done == report.counts.total
    return sink


@pytest.mark.parametrize("name", ["spectrogram", "dense", "conv2d"])
async def test_cupy_matches_numpy_on_every_example(name: str) -> None:
    spec = load_spec(EXAMPLES / f"{name}-synthetic.toml")
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"count": 300, "seed": 11})})
    gpu = await _run(spec, "cupy")
    cpu = await _run(spec, "numpy")
    assert gpu.out.keys() == cpu.out.keys()
    for key in cpu.out:
        assert np.isfinite(gpu.out[key]).all()
        np.testing.assert_allclose(gpu.out[key], cpu.out[key], rtol=1e-3, atol=1e-5)
    module = importlib.import_module(f"warpdeck.examples.{name}")
    assert module is not None
