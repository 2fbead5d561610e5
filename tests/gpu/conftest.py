"""GPU tests run only where CuPy finds a CUDA device; elsewhere they skip with the reason."""

from __future__ import annotations

import pytest

from warpdeck.engine.backends.cupy_backend import cupy_unavailable_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = cupy_unavailable_reason()
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
