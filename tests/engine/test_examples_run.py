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


def _decode_like_the_spec(path: Path) -> np.ndarray:
    # What classify-images.toml asks the image source for, done by hand: RGB, scaled to cover
    # 64x64 and centre-cropped (bilinear), / 255 as float32, channels first.
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        fixed = ImageOps.fit(img.convert("RGB"), (64, 64), Image.Resampling.BILINEAR)
    return (np.asarray(fixed, dtype=np.uint8) / np.float32(255.0)).astype(np.float32).transpose(2, 0, 1)


async def test_classify_images_example_matches_the_model_run_directly(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("PIL")
    from warpdeck.examples import classify

    paths = classify.make_images(tmp_path / "images", 64, seed=5)
    spec = load_spec(EXAMPLES / "classify-images.toml")
    spec = spec.model_copy(update={
        "backend": "numpy", "batch_size": 24,  # 64 = 24 + 24 + 16: a partial batch too
        "source": spec.source.model_copy(update={"path": tmp_path / "images"}),
    })
    report = await run_pipeline(spec, tmp_path / "run")
    assert report.counts.done == 64 and report.exit_code == 0
    batch = torch.from_numpy(np.stack([_decode_like_the_spec(p) for p in paths]))
    with torch.inference_mode():
        want = torch.softmax(classify.make_model()(batch), dim=-1).numpy()
    got = np.stack([np.load(tmp_path / "run" / "outputs" / f"{p.stem}.npy") for p in paths])
    assert got.shape == (64, classify.CLASSES) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
