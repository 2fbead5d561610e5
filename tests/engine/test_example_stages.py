"""The example stages in ``warpdeck.examples``, called directly with xp = numpy.

Each stage is checked against its module's independent float64 ``reference`` on inputs written by
its own ``make_inputs``, with ``out`` poisoned with NaN so that an element the stage forgot to
write cannot pass for a correct one.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from warpdeck.examples import conv2d, dense, spectrogram

EXAMPLES = pytest.mark.parametrize("module", [spectrogram, dense, conv2d], ids=["spectrogram", "dense", "conv2d"])
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
RTOL, ATOL = 1e-4, 1e-5


def _batch(module: ModuleType, directory: Path, count: int = 6, seed: int = 3) -> np.ndarray:
    return np.stack([np.load(p) for p in module.make_inputs(directory, count, seed)])


def _run(module: ModuleType, batch: np.ndarray) -> np.ndarray:
    shape, dtype = module.stage.out_spec(batch.shape[1:], batch.dtype)
    out = np.full((len(batch), *shape), np.nan, dtype=dtype)  # poisoned: unwritten elements stay NaN
    module.stage(np, batch, out)
    return out


@EXAMPLES
def test_stage_writes_every_output_element(module: ModuleType, tmp_path: Path) -> None:
    out = _run(module, _batch(module, tmp_path))
    assert np.isfinite(out).all()


@EXAMPLES
def test_stage_matches_reference_for_each_task(module: ModuleType, tmp_path: Path) -> None:
    batch = _batch(module, tmp_path)
    out = _run(module, batch)
    for x, y in zip(batch, out, strict=True):
        np.testing.assert_allclose(y, module.reference(x), rtol=RTOL, atol=ATOL)


@EXAMPLES
def test_stage_matches_reference_on_synthetic_style_inputs(module: ModuleType) -> None:
    # The synthetic source feeds uniform values in [-1, 1); those must work as well as make_inputs' data.
    batch = np.random.default_rng(7).uniform(-1.0, 1.0, (4, *module.INPUT_SHAPE)).astype(np.float32)
    out = _run(module, batch)
    for x, y in zip(batch, out, strict=True):
        np.testing.assert_allclose(y, module.reference(x), rtol=RTOL, atol=ATOL)


@EXAMPLES
def test_stage_handles_a_batch_of_one(module: ModuleType, tmp_path: Path) -> None:
    batch = _batch(module, tmp_path, count=1)
    np.testing.assert_allclose(_run(module, batch)[0], module.reference(batch[0]), rtol=RTOL, atol=ATOL)


@EXAMPLES
def test_stage_leaves_its_input_unchanged(module: ModuleType, tmp_path: Path) -> None:
    batch = _batch(module, tmp_path)
    before = batch.copy()
    _run(module, batch)
    np.testing.assert_array_equal(batch, before)


@EXAMPLES
def test_out_spec_matches_reference_output(module: ModuleType, tmp_path: Path) -> None:
    x = _batch(module, tmp_path, count=1)[0]
    ref = module.reference(x)
    assert module.stage.out_spec(x.shape, x.dtype) == (ref.shape, ref.dtype.name)


@pytest.mark.parametrize(
    ("module", "bad_shape"),
    [(spectrogram, (255,)), (spectrogram, (16, 512)), (dense, (511,)), (conv2d, (4, 64)), (conv2d, (128,))],
    ids=["spectrogram-short", "spectrogram-2d", "dense-width", "conv2d-small", "conv2d-1d"],
)
def test_out_spec_rejects_inputs_the_stage_cannot_take(module: ModuleType, bad_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="got shape"):
        module.stage.out_spec(bad_shape, np.dtype(np.float32))


@EXAMPLES
def test_make_inputs_writes_count_files_with_expected_shape_and_dtype(module: ModuleType, tmp_path: Path) -> None:
    prefix = module.__name__.rsplit(".", 1)[-1]
    paths = module.make_inputs(tmp_path / "new", 5)
    assert [p.name for p in paths] == [f"{prefix}-{i:05d}.npy" for i in range(5)]
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [p.name for p in paths]
    for p in paths:
        arr = np.load(p)
        assert (arr.shape, arr.dtype) == (module.INPUT_SHAPE, np.dtype(np.float32))


@EXAMPLES
def test_make_inputs_is_reproducible_per_seed_and_varies_across_seeds(module: ModuleType, tmp_path: Path) -> None:
    a, b, c = (_batch(module, tmp_path / name, count=3, seed=seed) for name, seed in (("a", 5), ("b", 5), ("c", 6)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a[0], a[1])


def test_conv2d_inputs_are_images_in_the_unit_interval(tmp_path: Path) -> None:
    batch = _batch(conv2d, tmp_path)
    assert batch.min() >= 0.0 and batch.max() <= 1.0


@EXAMPLES
def test_synthetic_spec_feeds_the_stage_its_input_shape(module: ModuleType) -> None:
    name = module.__name__.rsplit(".", 1)[-1]
    spec = tomllib.loads((EXAMPLES_DIR / f"{name}-synthetic.toml").read_text(encoding="utf-8"))
    assert tuple(spec["source"]["shape"]) == module.INPUT_SHAPE
    assert [s["fn"] for s in spec["stages"]] == [f"warpdeck.examples.{name}:stage"]


def test_spectrogram_out_spec_drops_samples_that_do_not_fill_a_frame() -> None:
    assert spectrogram.stage.out_spec((1000,), np.dtype(np.float32)) == ((6, 129), "float32")
    assert spectrogram.stage.out_spec((256,), np.dtype(np.float32)) == ((1, 129), "float32")


def test_spectrogram_of_a_sine_peaks_at_its_bin_in_every_frame() -> None:
    t = np.arange(spectrogram.INPUT_SHAPE[0])
    batch = np.sin(2 * np.pi * 20 / spectrogram.FRAME * t).astype(np.float32)[None]  # exactly bin 20
    out = _run(spectrogram, batch)
    assert (out[0].argmax(axis=-1) == 20).all()


def test_dense_rows_are_probability_distributions(tmp_path: Path) -> None:
    out = _run(dense, _batch(dense, tmp_path))
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)


def test_dense_softmax_does_not_overflow_on_huge_logits(tmp_path: Path) -> None:
    batch = _batch(dense, tmp_path) * np.float32(1e4)  # logits in the thousands: a naive exp overflows
    out = _run(dense, batch)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)


def test_conv2d_is_a_true_convolution_scaled_to_the_ramp_slope() -> None:
    # A true convolution with the flipped-column kernel answers +1 to a left-to-right unit ramp; a
    # correlation would answer -1.
    ramp = np.broadcast_to(np.arange(32, dtype=np.float32), (32, 32))[None]
    np.testing.assert_array_equal(_run(conv2d, np.ascontiguousarray(ramp)), np.ones((1, 28, 28), np.float32))


def test_conv2d_of_a_constant_image_is_zero() -> None:
    out = _run(conv2d, np.full((2, 16, 16), 0.7, np.float32))
    np.testing.assert_allclose(out, 0.0, atol=1e-6)
