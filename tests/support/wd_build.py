"""Spec builders for tests."""

from __future__ import annotations

from typing import Any

from warpdeck.engine.api import PipelineSpec, parse_spec


def spec(stages: list[str] | None = None, **kw: Any) -> PipelineSpec:
    """A small numpy spec; keyword arguments override top-level fields."""
    data: dict[str, Any] = {
        "name": "test",
        "backend": "numpy",
        "source": {"kind": "synthetic", "count": 64, "shape": [4], "dtype": "float64"},
        "sink": {"kind": "null"},
        "stages": [{"fn": s} for s in (stages or ["wd_stages:double"])],
        "batch_size": 8,
    }
    data.update(kw)
    return parse_spec(data)
