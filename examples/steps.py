"""Stage functions for the pipelines of several steps (docs/spec.md#steps): each takes the results
of the reduces before its step as ``params``, a mapping of step name to arrays.

- ``normalise-classify.toml``: a reduce ``stats`` (``mean_var`` per channel) over the images, then
  ``normalise`` (per channel, with those statistics) and the example classifier
  (``warpdeck.examples.classify``) in one step.
- ``spectra-gate.toml``: spectrograms, a reduce ``peak`` (``min_max`` over all of them), then an
  operator's gate, then ``to_db``: each spectrogram in decibels below the run's loudest value.

The functions run unchanged on NumPy and CuPy (``xp``); the results arrive as NumPy arrays and are
moved to the device here, once per batch (a few bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy.typing as npt

__all__ = ["DB_FLOOR", "normalise", "to_db"]

DB_FLOOR = -120.0
"""``to_db``'s value for a bin of magnitude zero (and for anything quieter)."""

Params = Mapping[str, Mapping[str, npt.NDArray[Any]]]


def normalise(xp: ModuleType, inp: Any, out: Any, params: Params) -> None:
    """``(x - mean) / std`` per channel of (n, C, H, W) images, with the ``stats`` step's per-channel
    ``mean`` and ``std`` (a channel that never varied is only centred)."""
    stats = params["stats"]
    mean = xp.asarray(stats["mean"], dtype=inp.dtype)[:, None, None]
    std = xp.asarray(stats["std"], dtype=inp.dtype)[:, None, None]
    out[...] = (inp - mean) / xp.where(std > 0, std, 1)


def to_db(xp: ModuleType, inp: Any, out: Any, params: Params) -> None:
    """Each magnitude in decibels below the ``peak`` step's ``max``: ``20 log10(x / max)``, at most 0,
    at least ``DB_FLOOR``."""
    peak = float(params["peak"]["max"])
    ratio = inp / (peak if peak > 0 else 1.0)
    floor = 10.0 ** (DB_FLOOR / 20.0)
    out[...] = 20.0 * xp.log10(xp.maximum(ratio, floor))
