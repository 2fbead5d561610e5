"""Torch stages (engine/run/torch_stages.py): a spec'd model with a factory gives what the model gives
in torch, its factory runs once per lane, its tensors are the slot buffers, it runs in inference
mode; the ``torch_stage`` adapter; a failing torch stage; the spec's refusals. Without torch the
torch-running tests skip, and fail under CI=true (CI must run them). The CuPy path (the lane's
compute stream as a torch ExternalStream) runs only on a card: ``test_torch_stage_on_cupy``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from wd_stages import RecordingSink

from warpdeck.engine.api import Engine, IterableSource, PipelineSpec, RunReport, parse_spec

SUPPORT = Path(__file__).resolve().parents[1] / "support"


@pytest.fixture
def wd_torch() -> Iterator[ModuleType]:
    """The torch test stages, their records cleared (skips, or fails under CI=true, without torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        msg = "PyTorch is not installed (pip install -e '.[dev]' or '.[torch]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg}: CI must run the torch tests")
        pytest.skip(msg)
    import wd_torch_stages

    for record in (wd_torch_stages.FACTORY_CALLS, wd_torch_stages.TORCH_SEEN, wd_torch_stages.NP_SEEN):
        record.clear()
    yield wd_torch_stages


def _inputs(n: int, shape: tuple[int, ...] = (1, 8, 8)) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [(f"k{i:04d}", rng.standard_normal(shape).astype(np.float32)) for i in range(n)]


def _torch_spec(stages: list[dict[str, object]], shape: tuple[int, ...] = (1, 8, 8), **kw: object) -> PipelineSpec:
    data: dict[str, object] = {"name": "torch", "backend": "numpy", "sink": {"kind": "null"}, "batch_size": 8,
                               "source": {"kind": "synthetic", "count": 1, "shape": list(shape), "dtype": "float32"},
                               "stages": stages, **kw}
    return parse_spec(data)


async def _run(s: PipelineSpec, items: list[tuple[str, np.ndarray]]) -> tuple[RunReport, Engine, RecordingSink]:
    sink = RecordingSink()
    async with Engine(s, source=IterableSource(items), sink=sink) as eng:
        return await eng.wait(), eng, sink


_CLASSIFY = {"fn": "wd_torch_stages:classify", "framework": "torch", "factory": "wd_torch_stages:make_model",
             "out_shape": [10]}


async def test_spec_torch_model_gives_what_torch_gives(wd_torch: ModuleType) -> None:
    import torch

    items = _inputs(40)
    report, _, sink = await _run(_torch_spec([_CLASSIFY], batch_size=8, lanes=2), items)
    assert report.counts.done == 40
    model = wd_torch.build_model()
    with torch.inference_mode():
        want = model(torch.from_numpy(np.stack([a for _, a in items]))).numpy()
    got = np.stack([sink.out[k] for k, _ in items])
    assert got.dtype == np.float32 and got.shape == (40, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


async def test_factory_runs_once_per_lane_on_its_compute_thread(wd_torch: ModuleType) -> None:
    await _run(_torch_spec([_CLASSIFY], batch_size=4, lanes=2), _inputs(48))
    threads = {t for *_, t in wd_torch.TORCH_SEEN}
    assert len(wd_torch.TORCH_SEEN) >= 12 > len(threads)  # at least 12 batches on at most 2 lanes, ...
    assert sorted(wd_torch.FACTORY_CALLS) == sorted(threads)  # ... one factory call per lane that ran
    assert all("compute" in t for t in threads)


async def test_torch_stage_tensors_are_the_slot_buffers(wd_torch: ModuleType) -> None:
    # array stage -> torch stage -> array stage: the torch stage's input is the first stage's output
    # buffer, its output the third stage's input buffer.
    np_stage = {"fn": "wd_torch_stages:np_addresses"}
    s = _torch_spec([np_stage, {"fn": "wd_torch_stages:scale_in_place", "framework": "torch"}, np_stage],
                    shape=(4,), batch_size=8)
    items = _inputs(24, (4,))
    report, _, sink = await _run(s, items)
    assert report.counts.done == 24
    first, third = wd_torch.NP_SEEN[0::2], wd_torch.NP_SEEN[1::2]
    assert [(i, o) for i, o, *_ in wd_torch.TORCH_SEEN] == [(f[1], t[0]) for f, t in zip(first, third, strict=True)]
    # What the torch stage wrote in place through ``out`` is what the NumPy side read on.
    for key, a in items:
        np.testing.assert_array_equal(sink.out[key], 3 * a)


async def test_torch_stage_runs_in_inference_mode(wd_torch: ModuleType) -> None:
    await _run(_torch_spec([_CLASSIFY], batch_size=8), _inputs(16))
    assert wd_torch.TORCH_SEEN
    assert all(seen[2] for seen in wd_torch.TORCH_SEEN)


async def test_adapter_over_sequential_writes_its_result_into_out(wd_torch: ModuleType) -> None:
    import torch

    items = _inputs(20)
    report, _, sink = await _run(_torch_spec([{"fn": "wd_torch_stages:adapted", "framework": "torch"}]), items)
    assert report.counts.done == 20
    with torch.inference_mode():
        want = wd_torch.SEQUENTIAL(torch.from_numpy(np.stack([a for _, a in items]))).numpy()
    np.testing.assert_allclose(np.stack([sink.out[k] for k, _ in items]), want, rtol=1e-5, atol=1e-6)


async def test_failing_torch_stage_fails_its_tasks_with_the_traceback(wd_torch: ModuleType) -> None:
    s = _torch_spec([{"fn": "wd_torch_stages:boom", "framework": "torch"}], batch_size=4, retry={"max_attempts": 1})
    report, eng, _ = await _run(s, _inputs(8))
    assert (report.counts.done, report.counts.failed) == (0, 8)
    detail = eng.task_detail("k0003")
    assert detail is not None and detail.state == "failed"
    assert "RuntimeError: torch stage exploded" in detail.error
    assert "in boom" in detail.traceback


def _warpdeck_run(tmp: Path, body: str, *, hide_torch: bool = False) -> subprocess.CompletedProcess[str]:
    (tmp / "spec.toml").write_text(body, encoding="utf-8")
    # ``sys.modules["torch"] = None`` makes ``import torch`` raise ImportError: torch not installed.
    hide = "sys.modules['torch'] = None; " if hide_torch else ""
    code = f"import sys; {hide}from warpdeck.cli.main import main; sys.exit(main(['run', 'spec.toml']))"
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp, env=env,
                          timeout=120, check=False)


_SPEC = """
name = "t"
backend = "numpy"
source = {{ kind = "synthetic", count = 4, shape = [4] }}
[[stages]]
fn = "wd_stages:double"
{extra}
"""


def test_torch_stage_without_torch_exits_2_naming_the_field(tmp_path: Path) -> None:
    r = _warpdeck_run(tmp_path, _SPEC.format(extra='framework = "torch"'), hide_torch=True)
    assert r.returncode == 2, r.stderr
    assert "stages.0.framework: needs PyTorch: pip install 'warpdeck[torch]'" in r.stderr


def test_factory_without_torch_framework_exits_2_naming_the_field(tmp_path: Path) -> None:
    r = _warpdeck_run(tmp_path, _SPEC.format(extra='factory = "wd_stages:double"'))
    assert r.returncode == 2, r.stderr
    assert "stages.0.factory" in r.stderr and 'a factory needs framework = "torch"' in r.stderr


@pytest.mark.gpu
async def test_torch_stage_on_cupy(wd_torch: ModuleType) -> None:
    import torch

    from warpdeck.engine.backends.cupy_backend import cupy_unavailable_reason

    if cupy_unavailable_reason() is not None or not torch.cuda.is_available():
        pytest.skip("needs CuPy, a CUDA device and a CUDA build of torch")
    items = _inputs(16)
    report, _, sink = await _run(_torch_spec([{**_CLASSIFY, "factory": "wd_torch_stages:make_cuda_model"}],
                                             batch_size=8, backend="cupy"), items)
    assert report.counts.done == 16
    with torch.inference_mode():
        want = wd_torch.build_model()(torch.from_numpy(np.stack([a for _, a in items]))).numpy()
    np.testing.assert_allclose(np.stack([sink.out[k] for k, _ in items]), want, rtol=1e-4, atol=1e-5)
