"""Dense layer with a softmax: class probabilities for batches of feature vectors.

One task is a float32 vector of ``D_IN`` features. The output is
``softmax(x @ WEIGHTS + BIAS)``, a float32 vector of ``D_OUT`` probabilities that sum to 1,
computed the numerically stable way (the row maximum is subtracted before ``exp``).

Generate inputs with ``python -m warpdeck.examples.dense DIR --count 500``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.examples._cli import input_cli

__all__ = ["BIAS", "D_IN", "D_OUT", "INPUT_SHAPE", "WEIGHTS", "main", "make_inputs", "out_spec", "reference", "stage"]

D_IN = 512
"""Input features per task."""
D_OUT = 256
"""Output classes per task."""
INPUT_SHAPE = (D_IN,)
"""Shape of one input."""

_rng = np.random.default_rng(1234)
# Scaled by 1/sqrt(D_IN) so that logits of unit-variance inputs are O(1): the softmax stays spread
# out rather than one-hot, which keeps the example (and its check against the reference) meaningful.
WEIGHTS = (_rng.standard_normal((D_IN, D_OUT)) / np.sqrt(D_IN)).astype(np.float32)
"""Layer weights, shape (D_IN, D_OUT) float32, fixed by seed 1234."""
BIAS = (0.1 * _rng.standard_normal(D_OUT)).astype(np.float32)
"""Layer bias, shape (D_OUT,) float32, drawn after ``WEIGHTS`` from the same generator."""
del _rng

# Device copies of (WEIGHTS, BIAS), one per (array module, device): uploaded once, not per batch.
_DEVICE_COPIES: dict[tuple[str, int], tuple[Any, Any]] = {}


def _params(xp: ModuleType) -> tuple[Any, Any]:
    """``(WEIGHTS, BIAS)`` as arrays of ``xp``, uploaded once per array module and device."""
    if xp is np:
        return WEIGHTS, BIAS
    cuda = getattr(xp, "cuda", None)
    key = (xp.__name__, cuda.runtime.getDevice() if cuda is not None else -1)
    dev = _DEVICE_COPIES.get(key)
    if dev is None:
        dev = (xp.asarray(WEIGHTS), xp.asarray(BIAS))
        if cuda is not None:
            # Lanes run on different streams: finish the upload once, so that no other stream can
            # read the copies before they have landed.
            cuda.get_current_stream().synchronize()
        _DEVICE_COPIES[key] = dev
    return dev


def out_spec(in_item_shape: tuple[int, ...], in_dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    """Per-task output shape and dtype: ``((D_OUT,), "float32")``; raises ``ValueError`` unless the input is (D_IN,)."""
    if tuple(in_item_shape) != INPUT_SHAPE:
        raise ValueError(f"dense needs inputs of shape {INPUT_SHAPE}, got shape {in_item_shape}")
    return (D_OUT,), "float32"


def stage(xp: ModuleType, inp: Any, out: Any) -> None:
    """Write ``softmax(inp @ WEIGHTS + BIAS)`` for each row of ``inp`` (n, D_IN) into ``out`` (n, D_OUT)."""
    w, b = _params(xp)
    # Everything after the matmul happens in place in ``out``: no further temporaries of batch size.
    out[...] = xp.matmul(inp, w)
    out += b
    # Subtracting the row maximum leaves the softmax unchanged and keeps exp from overflowing.
    out -= xp.max(out, axis=-1, keepdims=True)
    xp.exp(out, out=out)
    out /= xp.sum(out, axis=-1, keepdims=True)


stage.out_spec = out_spec  # type: ignore[attr-defined]  # the engine reads the output shape from here


def reference(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """The probabilities for one vector, computed independently in float64 through log-sum-exp."""
    logits: npt.NDArray[np.float64] = np.asarray(x, np.float64) @ WEIGHTS.astype(np.float64) + BIAS.astype(np.float64)
    m = logits.max()
    log_z = m + np.log(np.exp(logits - m).sum())
    probs: npt.NDArray[np.float64] = np.exp(logits - log_z)
    return probs.astype(np.float32)


def make_inputs(directory: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` vectors ``<directory>/dense-00000.npy``…, standard normal, shape ``(D_IN,)`` float32.

    File i depends only on (seed, i), so a larger ``count`` extends a smaller one.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        x = np.random.default_rng([seed, i]).standard_normal(INPUT_SHAPE).astype(np.float32)
        path = out_dir / f"dense-{i:05d}.npy"
        np.save(path, x)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m warpdeck.examples.dense DIR --count N --seed S`` writes inputs."""
    return input_cli("dense", "Write dense-layer example inputs (.npy vectors).",
                     make_inputs, f"shape {INPUT_SHAPE} float32", argv)


if __name__ == "__main__":
    raise SystemExit(main())
