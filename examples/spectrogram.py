"""Spectrogram: magnitudes of the Hann-windowed FFT over frames of a 1-D signal.

One task is a float32 signal of length N (>= ``FRAME``). It is cut into frames of ``FRAME``
samples every ``HOP`` samples (trailing samples that do not fill a frame are dropped), each frame
is multiplied by a periodic Hann window, and the output row is ``|rfft(frame)|``: an array of
shape ``(1 + (N - FRAME) // HOP, BINS)`` float32.

Generate inputs with ``python -m warpdeck.examples.spectrogram DIR --count 500``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.examples._cli import input_cli

__all__ = ["BINS", "FRAME", "HOP", "INPUT_SHAPE", "WINDOW", "main", "make_inputs", "out_spec", "reference", "stage"]

FRAME = 256
"""Samples per frame."""
HOP = 128
"""Samples between the starts of consecutive frames."""
BINS = FRAME // 2 + 1
"""Frequency bins per frame (the length of an rfft of ``FRAME`` samples)."""
INPUT_SHAPE = (8192,)
"""Shape of one input written by ``make_inputs`` (and used by the synthetic spec)."""
WINDOW = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(FRAME) / FRAME)).astype(np.float32)
"""Periodic Hann window: the variant for spectral analysis, whose overlapped copies at hop FRAME/2 sum to 1."""

# Device copies of WINDOW, one per (array module, device): the window is uploaded once, not per batch.
_DEVICE_COPIES: dict[tuple[str, int], Any] = {}


def _on(xp: ModuleType, arr: npt.NDArray[Any]) -> Any:
    """``arr`` as an array of ``xp``, uploaded once per array module and device."""
    if xp is np:
        return arr
    cuda = getattr(xp, "cuda", None)
    key = (xp.__name__, cuda.runtime.getDevice() if cuda is not None else -1)
    dev = _DEVICE_COPIES.get(key)
    if dev is None:
        dev = xp.asarray(arr)
        if cuda is not None:
            # Lanes run on different streams: finish the upload once, so that no other stream can
            # read the copy before it has landed.
            cuda.get_current_stream().synchronize()
        _DEVICE_COPIES[key] = dev
    return dev


def out_spec(in_item_shape: tuple[int, ...], in_dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    """Per-task output shape and dtype for a 1-D input of length N: ``((1 + (N - FRAME) // HOP, BINS), "float32")``.

    Raises ``ValueError`` for an input that is not 1-D or is shorter than one frame.
    """
    if len(in_item_shape) != 1 or in_item_shape[0] < FRAME:
        raise ValueError(f"spectrogram needs a 1-D signal of at least {FRAME} samples, got shape {in_item_shape}")
    return (1 + (in_item_shape[0] - FRAME) // HOP, BINS), "float32"


def stage(xp: ModuleType, inp: Any, out: Any) -> None:
    """Write the spectrogram of each signal in ``inp`` (n, N) into ``out`` (n, n_frames, BINS)."""
    n_frames = 1 + (inp.shape[-1] - FRAME) // HOP
    # One gather with a (n_frames, FRAME) index array builds every frame at once; fancy indexing
    # works the same way in NumPy and CuPy, unlike stride tricks.
    idx = (xp.arange(n_frames) * HOP)[:, None] + xp.arange(FRAME)[None, :]
    frames = inp[:, idx] * _on(xp, WINDOW)
    out[...] = xp.abs(xp.fft.rfft(frames, axis=-1))


stage.out_spec = out_spec  # type: ignore[attr-defined]  # the engine reads the output shape from here


def reference(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """The spectrogram of one signal, computed independently in float64 with NumPy's own window and strides."""
    window = np.hanning(FRAME + 1)[:-1]  # the periodic Hann window of length FRAME
    frames = np.lib.stride_tricks.sliding_window_view(np.asarray(x, np.float64), FRAME)[::HOP]
    return np.abs(np.fft.rfft(frames * window, axis=-1)).astype(np.float32)


def make_inputs(directory: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` signals ``<directory>/spectrogram-00000.npy``…, each of shape ``INPUT_SHAPE`` float32.

    Each signal is a sum of two to four sines (random frequency, amplitude and phase) plus white
    noise. File i depends only on (seed, i), so a larger ``count`` extends a smaller one.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    t = np.arange(INPUT_SHAPE[0])
    paths = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        k = int(rng.integers(2, 5))
        freqs = rng.uniform(0.005, 0.45, k)  # cycles per sample, below Nyquist
        amps = rng.uniform(0.2, 1.0, k)
        phases = rng.uniform(0.0, 2.0 * np.pi, k)
        signal = (amps[:, None] * np.sin(2.0 * np.pi * freqs[:, None] * t + phases[:, None])).sum(axis=0)
        signal += rng.normal(0.0, 0.1, t.shape)
        path = out_dir / f"spectrogram-{i:05d}.npy"
        np.save(path, signal.astype(np.float32))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m warpdeck.examples.spectrogram DIR --count N --seed S`` writes inputs."""
    return input_cli("spectrogram", "Write spectrogram example inputs (.npy signals).",
                     make_inputs, f"shape {INPUT_SHAPE} float32", argv)


if __name__ == "__main__":
    raise SystemExit(main())
