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
    from warpdeck.engine.backends.select import select_backend

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


def test_the_cards_nonfinite_count_matches_numpys() -> None:
    from warpdeck.engine.backends.cupy_backend import CupyBackend

    backend = CupyBackend()
    cp = backend.xp
    rng = np.random.default_rng()
    for dtype in (np.float16, np.float32, np.float64):
        x = rng.standard_normal((37, 5, 7)).astype(dtype)
        flat = x.reshape(37, -1)
        for row, col, value in zip(rng.integers(0, 37, 20), rng.integers(0, 35, 20),
                                   rng.choice([np.nan, np.inf, -np.inf], 20), strict=True):
            flat[row, col] = value
        counts = cp.full(37, -1, cp.int32)
        counter = backend.nonfinite_counter(np.dtype(dtype))
        assert counter is not None
        counter(cp.asarray(x), counts)
        np.testing.assert_array_equal(counts.get(), (~np.isfinite(flat)).sum(axis=1))
    assert backend.nonfinite_counter(np.dtype(np.int32)) is None


async def test_nonfinite_outputs_are_flagged_on_cupy_as_on_numpy() -> None:
    from wd_build import spec

    from warpdeck.engine.api import IterableSource
    from warpdeck.engine.backends.select import select_backend

    rows = [(f"k{i:04d}", np.full(3, np.nan if i % 4 == 1 else float(i), np.float32)) for i in range(10)]
    flagged = {}
    for name in ("cupy", "numpy"):
        s = spec(["wd_stages:double"], batch_size=4, backend=name)
        async with Engine(s, source=IterableSource(rows), sink=_Collect(), backend=select_backend(name)) as eng:
            report = await eng.wait()
        flagged[name] = sorted((f.key, f.note) for f in report.flagged)
    assert flagged["cupy"] == flagged["numpy"] and len(flagged["cupy"]) == 3
