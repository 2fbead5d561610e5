"""``warpdeck advise``: the table, the JSON figures and the exit statuses, through the command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from wd_cli import warpdeck

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _warpdeck(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return warpdeck(*args, cwd=cwd, support=False)


def test_advise_prints_the_recommendation_and_writes_every_figure(tmp_path: Path) -> None:
    r = _warpdeck("advise", str(EXAMPLES / "dense-synthetic.toml"), "--backend", "numpy", "--budget", "4",
                  "--json", "advice.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for row in ("batch_size", "fill_workers", "sink_workers", "slot_depth", "predicted", "device busy", "bottleneck"):
        assert row in r.stdout
    advice = json.loads((tmp_path / "advice.json").read_text())
    assert advice["pipeline"] == "dense-synthetic" and advice["batch_size"] == 256
    (numpy,) = advice["results"]
    assert numpy["backend"] == "numpy"
    assert [s["batch_size"] for s in numpy["samples"]] == [64, 256, 512]
    assert {f["phase"] for f in numpy["model"]["phases"]} == {"fill", "h2d", "compute", "d2h", "sink"}
    plan = numpy["plan"]
    assert plan in numpy["candidates"]
    assert plan["tasks_s"] > 0 and 0 < plan["device_busy"] <= 1
    assert plan["slot_depth"] == max(2, plan["fill_workers"] + 2, plan["sink_workers"] + 2)
    assert not list(tmp_path.glob(".warpdeck")), "advise keeps no run directory"


def test_advise_on_a_bad_spec_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text((EXAMPLES / "dense-synthetic.toml").read_text().replace("batch_size = 256", "batch_size = 0"))
    r = _warpdeck("advise", str(spec), cwd=tmp_path)
    assert r.returncode == 2
    assert "batch_size" in r.stderr
