"""Non-finite outputs counted by the device: the same verdicts as the sink's host scan.

A backend that counts each row's NaN and infinite values inside the compute job (CuPy on a card:
``Backend.nonfinite_counter``) sends the counts back with the outputs, in the same d2h, and the sink
reads them instead of scanning every output byte. This runs that path on NumPy, with a counter that
does what the card's kernel does, beside the plain NumPy backend whose sink scans, over the same
inputs: float16 rows of 3 values (6 bytes: the counts' place must be rounded up to an aligned
offset) and float32, full and partial batches, the flag and the fail policies. The card's own kernel
is checked against NumPy in tests/gpu/test_cupy_backend.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from wd_build import spec
from wd_stages import RecordingSink

from warpdeck.engine.api import Engine, IterableSource, RunReport
from warpdeck.engine.backends.numpy_backend import NumpyBackend

BAD = {1: np.nan, 6: np.inf, 9: -np.inf}


class CountingBackend(NumpyBackend):
    """NumPy, but the outputs' non-finite values are counted in the compute job, as on a card."""

    def __init__(self) -> None:
        super().__init__()
        self.counted_batches = 0

    def nonfinite_counter(self, dtype: np.dtype[Any]) -> Any:
        if dtype.kind != "f":
            return None

        def count(out: Any, counts: Any) -> None:
            self.counted_batches += 1
            np.sum(~np.isfinite(out.reshape(len(out), -1)), axis=1, out=counts)

        return count


def _inputs(dtype: str, n: int = 10) -> list[tuple[str, np.ndarray]]:
    rows = []
    for i in range(n):
        row = np.full(3, float(i), dtype)
        if i in BAD:
            row[i % 3] = BAD[i]
        rows.append((f"k{i:04d}", row))
    return rows


async def _run(backend: NumpyBackend, dtype: str, policy: str) -> tuple[RunReport, RecordingSink, Engine]:
    sink = RecordingSink()
    s = spec(["wd_stages:double"], batch_size=4, nonfinite=policy, retry={"max_attempts": 1})
    async with Engine(s, source=IterableSource(_inputs(dtype)), sink=sink, backend=backend) as eng:
        return await eng.wait(), sink, eng


def _verdicts(eng: Engine) -> dict[str, tuple[str, str, str]]:
    out = {}
    for i in range(10):
        d = eng.task_detail(f"k{i:04d}")
        assert d is not None
        out[d.key] = (d.state, d.flag, d.error.splitlines()[0] if d.error else "")
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("policy", ["flag", "fail"])
async def test_counts_made_in_compute_give_the_sinks_verdicts(dtype: str, policy: str) -> None:
    backend = CountingBackend()
    counted, counted_sink, counted_eng = await _run(backend, dtype, policy)
    scanned, scanned_sink, scanned_eng = await _run(NumpyBackend(), dtype, policy)
    assert backend.counted_batches == 3  # 4 + 4 + a partial batch of 2: each counted once, on "the device"
    assert _verdicts(counted_eng) == _verdicts(scanned_eng)
    assert (counted.counts.done, counted.counts.failed, counted.counts.flagged) == \
        (scanned.counts.done, scanned.counts.failed, scanned.counts.flagged)
    bad = {f"k{i:04d}" for i in BAD}
    if policy == "flag":
        assert counted.counts.flagged == 3 and counted.counts.done == 10
        assert all("1 of 3 values are NaN or infinite" in _verdicts(counted_eng)[k][1] for k in bad)
    else:
        assert counted.counts.failed == 3 and not bad & counted_sink.out.keys()
    assert counted_sink.out.keys() == scanned_sink.out.keys()
    for key, row in scanned_sink.out.items():  # the counts' bytes never overwrite an output
        np.testing.assert_array_equal(counted_sink.out[key], row)


async def test_allow_asks_the_device_for_nothing() -> None:
    backend = CountingBackend()
    report, _, _ = await _run(backend, "float32", "allow")
    assert backend.counted_batches == 0 and report.counts.flagged == 0 and report.counts.done == 10
