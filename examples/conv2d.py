"""2-D convolution: a 5x5 Sobel-style horizontal-gradient filter over images.

One task is a float32 image of shape (H, W), H and W >= 5. The output is its 'valid' **true
convolution** with ``KERNEL`` (the kernel flipped in both axes, as in
``scipy.signal.convolve2d(image, KERNEL, mode="valid")``), shape (H - 4, W - 4) float32:

    out[i, j] = sum over a, b of KERNEL[a, b] * image[i + 4 - a, j + 4 - b]

``KERNEL`` is binomial smoothing down the rows times a derivative across the columns, scaled so
that an image brightening by 1 per pixel from left to right gives exactly 1 everywhere.

Generate inputs with ``python -m warpdeck.examples.conv2d DIR --count 500``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.examples._cli import input_cli

__all__ = ["INPUT_SHAPE", "KERNEL", "main", "make_inputs", "out_spec", "reference", "stage"]

INPUT_SHAPE = (128, 128)
"""Shape of one input written by ``make_inputs`` (and used by the synthetic spec)."""
# Columns are reversed ([1, 2, 0, -2, -1], not [-1, -2, 0, 2, 1]) because a true convolution flips
# the kernel; 128 = 16 (row weights) * 8 (derivative of a unit ramp) makes the ramp response 1.
# Every entry is a multiple of 1/128, so float32 holds the kernel exactly.
KERNEL = (np.outer([1, 4, 6, 4, 1], [1, 2, 0, -2, -1]) / 128.0).astype(np.float32)
"""The 5x5 kernel, float32."""
_KH, _KW = KERNEL.shape
# (row offset, column offset, weight) for every non-zero tap. Offsets are into the input and
# already flipped for a true convolution; the zero centre column is left out (20 passes, not 25).
# Weights are Python floats, so a float32 slice times a weight stays float32 in NumPy and CuPy.
_TAPS = tuple(
    (_KH - 1 - a, _KW - 1 - b, float(KERNEL[a, b])) for a in range(_KH) for b in range(_KW) if KERNEL[a, b] != 0
)


def out_spec(in_item_shape: tuple[int, ...], in_dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    """Per-task output shape and dtype for an (H, W) image: ``((H - 4, W - 4), "float32")``.

    Raises ``ValueError`` for an input that is not 2-D or is smaller than the kernel.
    """
    if len(in_item_shape) != KERNEL.ndim or in_item_shape[0] < _KH or in_item_shape[1] < _KW:
        raise ValueError(f"conv2d needs a 2-D image of at least {_KH}x{_KW}, got shape {in_item_shape}")
    return (in_item_shape[0] - _KH + 1, in_item_shape[1] - _KW + 1), "float32"


def stage(xp: ModuleType, inp: Any, out: Any) -> None:
    """Write the 'valid' convolution of each image in ``inp`` (n, H, W) into ``out`` (n, H - 4, W - 4)."""
    h, w = inp.shape[-2] - _KH + 1, inp.shape[-1] - _KW + 1
    # A sum of shifted slices: plain slicing and arithmetic, identical in NumPy and CuPy, and the
    # first tap assigns every element of ``out``, so nothing left over from a previous batch survives.
    (r0, c0, k0), *rest = _TAPS
    out[...] = inp[:, r0 : r0 + h, c0 : c0 + w] * k0
    for r, c, k in rest:
        out += inp[:, r : r + h, c : c + w] * k


stage.out_spec = out_spec  # type: ignore[attr-defined]  # the engine reads the output shape from here


def reference(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """The convolution of one image, computed independently in float64: windows times the flipped kernel."""
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(x, np.float64), KERNEL.shape)
    result: npt.NDArray[np.float64] = np.einsum("ijab,ab->ij", windows, KERNEL.astype(np.float64)[::-1, ::-1])
    return result.astype(np.float32)


def make_inputs(directory: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` images ``<directory>/conv2d-00000.npy``…, shape ``INPUT_SHAPE`` float32, values in [0, 1].

    Each image is a linear brightness gradient in a random direction, a few discs and rectangles
    of random brightness, and a little noise, clipped to [0, 1]: edges for the filter to find.
    File i depends only on (seed, i), so a larger ``count`` extends a smaller one.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    h, w = INPUT_SHAPE
    rows, cols = np.mgrid[0:h, 0:w] / np.array([h, w])[:, None, None]
    paths = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        angle = rng.uniform(0.0, 2.0 * np.pi)
        img = 0.2 + 0.3 * (np.cos(angle) * rows + np.sin(angle) * cols)
        for _ in range(int(rng.integers(2, 6))):
            cy, cx, size = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.25)
            if rng.integers(2):  # a disc or a rectangle, evenly
                mask = (rows - cy) ** 2 + (cols - cx) ** 2 < size**2
            else:
                mask = (np.abs(rows - cy) < size) & (np.abs(cols - cx) < size)
            img[mask] = rng.uniform(0.0, 1.0)
        img += rng.normal(0.0, 0.02, img.shape)
        path = out_dir / f"conv2d-{i:05d}.npy"
        np.save(path, np.clip(img, 0.0, 1.0).astype(np.float32))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m warpdeck.examples.conv2d DIR --count N --seed S`` writes inputs."""
    return input_cli("conv2d", "Write conv2d example inputs (.npy images).",
                     make_inputs, f"shape {INPUT_SHAPE} float32", argv)


if __name__ == "__main__":
    raise SystemExit(main())
