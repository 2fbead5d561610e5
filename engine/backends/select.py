"""Choosing the backend a run computes on: NumPy always, CuPy when asked for or when ``auto`` finds a device.

Importing this module loads neither CuPy nor CUDA; ``select_backend`` does, only for cupy/auto.
"""

from __future__ import annotations

from typing import Literal

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.backends.numpy_backend import NumpyBackend

__all__ = ["select_backend"]


def select_backend(name: Literal["auto", "numpy", "cupy"], device: int = 0) -> Backend:
    """The backend to run on. ``auto`` takes CuPy when a device answers; when it falls back to
    NumPy the backend's ``reason`` says why. ``cupy`` raises ``BackendError`` if it cannot run."""
    if name == "numpy":
        return NumpyBackend("requested")
    from warpdeck.engine.backends import cupy_backend  # noqa: PLC0415 - keeps CuPy out of the root

    if name == "cupy":
        return cupy_backend.CupyBackend(device, "requested")
    why = cupy_backend.cupy_unavailable_reason()
    if why is None:
        return cupy_backend.CupyBackend(device, "auto: a CUDA device is available")
    return NumpyBackend(f"auto: fell back to NumPy because {why}")
