"""``warpdeck check SPEC`` on local specs: a ready spec exits 0, each problem is one line and exits 2,
the source's tasks are counted, and ``--json`` has a stable shape. Real files, the real command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from wd_cli import warpdeck

from warpdeck.cli.main import main

SPEC = """
name = "check-test"
backend = "numpy"
batch_size = 8
[source]
kind = "npy_dir"
path = "inputs"
[sink]
kind = "npy_dir"
[[stages]]
fn = "{fn}"
"""


def _inputs(tmp: Path, n: int) -> None:
    (tmp / "inputs").mkdir(exist_ok=True)
    for i in range(n):
        np.save(tmp / "inputs" / f"x{i:03d}.npy", np.full(4, float(i)))


def _spec(tmp: Path, body: str) -> Path:
    p = tmp / "spec.toml"
    p.write_text(body)
    return p


def _check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return warpdeck("check", *args, cwd=cwd, columns=100, timeout=60)


def test_a_ready_spec_exits_0_and_counts_the_npy_inputs(tmp_path: Path) -> None:
    _inputs(tmp_path, 5)
    spec = _spec(tmp_path, SPEC.format(fn="wd_stages:double"))
    r = _check(str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert "stages: 1 imported (wd_stages:double)" in r.stdout
    assert f"source: npy_dir {tmp_path / 'inputs'}: 5 tasks" in r.stdout
    assert "executor: local" in r.stdout and "ok: ready to run" in r.stdout
    assert not (tmp_path / ".warpdeck").exists(), "check never makes a run directory"


def test_json_has_every_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _inputs(tmp_path, 3)
    spec = _spec(tmp_path, SPEC.format(fn="warpdeck.examples.dense:stage"))
    assert main(["check", str(spec), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"spec", "ok", "problems", "pipeline", "stages", "source", "executor"}
    assert out["ok"] is True and out["problems"] == [] and out["pipeline"] == "check-test"
    assert out["stages"] == [{"fn": "warpdeck.examples.dense:stage", "framework": "array", "factory": None}]
    assert out["source"] == {"kind": "npy_dir", "where": str(tmp_path / "inputs"), "tasks": 3, "counted": "total"}
    assert out["executor"] == {"kind": "local"}


def test_a_bad_field_is_named_on_one_line_and_exits_2(tmp_path: Path) -> None:
    _inputs(tmp_path, 2)
    spec = _spec(tmp_path, SPEC.format(fn="wd_stages:double").replace("batch_size = 8", "batch_size = 0"))
    r = _check(str(spec), "--json", cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "batch_size" in lines[0], r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] is False and out["pipeline"] is None and len(out["problems"]) == 1


def test_an_unimportable_stage_is_named_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _inputs(tmp_path, 2)
    spec = _spec(tmp_path, SPEC.format(fn="wd_no_such_module_here:stage"))
    assert main(["check", str(spec)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "stages.0.fn" in err[0] and "wd_no_such_module_here" in err[0], err


def test_an_empty_or_missing_source_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, SPEC.format(fn="wd_stages:double"))
    assert main(["check", str(spec)]) == 2  # no inputs folder at all
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "source (npy_dir): cannot be opened" in err[0], err
    (tmp_path / "inputs").mkdir()
    assert main(["check", str(spec), "--json"]) == 2
    captured = capsys.readouterr()
    assert "no tasks" in captured.err
    assert json.loads(captured.out)["source"]["tasks"] == 0


def test_a_callable_source_without_a_total_is_enumerated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "wd_check_items.py").write_text(
        "import numpy as np\n"
        "def items():\n"
        "    return (np.zeros(4) for _ in range(11))\n")
    body = SPEC.format(fn="wd_stages:double").replace('kind = "npy_dir"\npath = "inputs"',
                                                       'kind = "callable"\ntarget = "wd_check_items:items"')
    assert main(["check", str(_spec(tmp_path, body)), "--json"]) == 0
    src = json.loads(capsys.readouterr().out)["source"]
    assert (src["kind"], src["tasks"], src["counted"]) == ("callable", 11, "enumerated")
