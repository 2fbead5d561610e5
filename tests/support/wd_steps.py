"""Stage functions for the steps tests: a stage that takes a reduce's result as ``params``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def centre(xp: Any, inp: Any, out: Any, params: Mapping[str, Mapping[str, Any]]) -> None:
    """out = inp - the ``stats`` step's mean (per element)."""
    out[...] = inp - xp.asarray(params["stats"]["mean"], dtype=inp.dtype)
