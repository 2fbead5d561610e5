"""``advise`` where CuPy can run: it calibrates both backends and says whether the GPU pays off."""

from __future__ import annotations

from pathlib import Path

import pytest

from warpdeck.engine.api import advise, load_spec

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_advise_compares_both_backends(tmp_path: Path) -> None:
    from warpdeck.cli.advise import advice_table

    spec = load_spec(EXAMPLES / "dense-synthetic.toml")
    advice = await advise(spec, scratch=tmp_path)
    assert [r.backend for r in advice.results] == ["numpy", "cupy"]
    assert advice.gpu_speedup is not None
    assert advice.gpu_speedup == pytest.approx(advice.results[1].plan.tasks_s / advice.results[0].plan.tasks_s)
    assert "GPU" in str(advice_table(advice).caption)
