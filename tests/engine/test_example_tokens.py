"""The tokens example (examples/tokens.py): a user's own per-item loading in pure Python, run in
worker processes and on threads, gives the same vectors as the example's own reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from warpdeck.engine.api import Engine, load_spec
from warpdeck.examples import tokens

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class _Keep:
    def __init__(self) -> None:
        self.out: dict[str, np.ndarray] = {}

    def write(self, key: str, arr: np.ndarray) -> None:
        self.out[key] = np.array(arr)


@pytest.mark.parametrize("pool", ["processes", "threads"])
async def test_lines_become_the_vectors_the_reference_gives(tmp_path: Path, pool: str) -> None:
    text = tokens.make_lines(tmp_path / "lines.txt", 600, seed=3)
    (tmp_path / "odd.txt").write_text(text.read_text(encoding="utf-8") + "\n,,,\nÜBER über_42\n", encoding="utf-8")
    spec = load_spec(EXAMPLES / "tokens-lines.toml")
    source = spec.source.model_copy(update={"options": {"path": str(tmp_path / "odd.txt")}})
    spec = spec.model_copy(update={"source": source, "backend": "numpy", "batch_size": 64,
                                   "host": spec.host.model_copy(update={"fill_pool": pool, "fill_workers": 2})})
    assert spec.host.fill_pool == pool
    sink = _Keep()
    async with Engine(spec, sink=sink) as eng:
        report = await eng.wait()
    assert report.counts.done == 603 and report.counts.failed == 0
    lines = (tmp_path / "odd.txt").read_text(encoding="utf-8").splitlines()
    for n in (0, 1, 299, 599, 600, 601, 602):
        np.testing.assert_allclose(sink.out[f"line-{n:08d}"], tokens.reference(lines[n]), rtol=2e-5, atol=1e-6)
    assert not sink.out["line-00000601"].any()  # no words: the zero vector
    # "ÜBER über_42": lower-cased, split at the underscore: über, über, 42
    assert tokens.tokenize("ÜBER über_42") == tokens.tokenize("über über 42")
