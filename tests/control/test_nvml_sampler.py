"""The heartbeat's NVML sampler reads what nvidia-smi shows.

On a card (benchmarks/gpu.py, part nvml) its figures were read beside nvidia-smi's: utilisation,
memory, temperature and power equal. Here NVML is a stand-in module, because the cases are the
driver's and the bindings' differences, which one machine cannot show: memory counted the way
nvidia-smi counts it (version 2, the driver's reserve neither used nor free) where the bindings
have it, and no power where the board has no sensor.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from warpdeck.engine.control.heartbeat import NvmlSampler


class _NVMLError(Exception):
    pass


def _nvml(v2: bool, power_mw: int | None) -> ModuleType:
    nv = ModuleType("pynvml")
    nv.NVMLError = _NVMLError  # type: ignore[attr-defined]
    nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nv.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=99)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 45  # type: ignore[attr-defined]
    v1 = SimpleNamespace(used=4436 * 2**20, total=143_771 * 2**20)  # the reserve counted as used
    if v2:
        nv.nvmlMemory_v2 = 2  # type: ignore[attr-defined]

    def memory(h: str, version: int | None = None) -> SimpleNamespace:
        if version is None:
            return v1
        if not v2:
            raise TypeError("unexpected keyword argument 'version'")
        return SimpleNamespace(used=3821 * 2**20, total=143_771 * 2**20)

    def power(h: str) -> int:
        if power_mw is None:
            raise _NVMLError("Not Supported")
        return power_mw

    nv.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPowerUsage = power  # type: ignore[attr-defined]
    return nv


@pytest.mark.parametrize(("v2", "used"), [(True, 3821), (False, 4436)])
def test_memory_is_counted_as_nvidia_smi_counts_it_where_the_bindings_can(
        monkeypatch: pytest.MonkeyPatch, v2: bool, used: int) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(v2, 275_674))
    stats = NvmlSampler(0)()
    assert stats is not None
    assert (stats.util_pct, stats.mem_used_mb, stats.mem_total_mb, stats.temp_c) == (99, used, 143_771, 45)
    assert stats.power_w == pytest.approx(275.674)


def test_a_board_without_a_power_sensor_reports_no_power(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _nvml(True, None))
    stats = NvmlSampler(0)()
    assert stats is not None and stats.power_w is None and stats.util_pct == 99
