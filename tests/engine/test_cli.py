"""The ``warpdeck`` command: exit codes, the JSON report, and errors a user can act on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[1] / "support"


def _warpdeck(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "warpdeck.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120, check=False)


def _write(tmp: Path, body: str) -> Path:
    p = tmp / "spec.toml"
    p.write_text(body)
    return p


SPEC = """
name = "cli-test"
backend = "numpy"
batch_size = 8
[source]
kind = "synthetic"
count = 50
shape = [4]
dtype = "float64"
[sink]
kind = "npy_dir"
[[stages]]
fn = "{fn}"
"""


def test_run_headless_writes_report_and_outputs(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:double"))
    r = _warpdeck("run", str(spec), "--headless", "--json", "report.json", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["counts"]["done"] == 50 and report["status"] == "finished"
    for field in ("throughput_tasks_s", "bound_tasks_s", "overlap_efficiency", "occupancy", "stall_s",
                  "amdahl_ceiling", "latency_p50_s", "latency_p99_s"):
        assert field in report
    assert len(list((tmp_path / "rd" / "outputs").glob("*.npy"))) == 50
    assert "50 done" in r.stdout


def test_failed_task_exits_1_and_names_the_reason(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:poison").replace("count = 50\n", "")
                  .replace('kind = "synthetic"', 'kind = "callable"\ntarget = "wd_poison_source:items"')
                  .replace("shape = [4]\n", "").replace('dtype = "float64"\n', ""))
    (tmp_path / "wd_poison_source.py").write_text(
        "import numpy as np\n"
        "def items():\n"
        "    return [np.full(4, 999.0 if i == 5 else float(i)) for i in range(8)]\n")
    r = _warpdeck("run", str(spec), "--headless", "--json", "r.json", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"] == {"total": 8, "done": 7, "failed": 1, "cancelled": 0, "queued": 0, "running": 0,
                                "skipped_done": 0, "flagged": 0}
    assert "poisoned input" in report["failures"][0]["reason"]


def test_bad_spec_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:double").replace("batch_size = 8", "batch_size = 0"))
    r = _warpdeck("run", str(spec), "--headless", cwd=tmp_path)
    assert r.returncode == 2
    assert "spec.toml" in r.stderr and "batch_size" in r.stderr


def test_unimportable_stage_exits_2_before_any_work(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="no_such_module:fn"))
    r = _warpdeck("run", str(spec), "--headless", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 2
    assert "stages.0.fn" in r.stderr and "no_such_module" in r.stderr
    assert not (tmp_path / "rd").exists()


def test_cupy_backend_without_cuda_exits_2_with_reason(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:double"))
    r = _warpdeck("run", str(spec), "--headless", "--backend", "cupy", cwd=tmp_path)
    try:
        import cupy  # noqa: F401
        has_cupy = True
    except ImportError:
        has_cupy = False
    if not has_cupy:
        assert r.returncode == 2
        assert "cupy" in r.stderr.lower() and "install" in r.stderr.lower()


def test_version() -> None:
    r = subprocess.run([sys.executable, "-m", "warpdeck.cli", "--version"], capture_output=True, text=True, check=True)
    assert r.stdout.startswith("warpdeck ")


def test_second_run_resumes_and_another_spec_in_the_same_run_dir_exits_2(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:double"))
    assert _warpdeck("run", str(spec), "--headless", "--run-dir", "rd", cwd=tmp_path).returncode == 0
    r = _warpdeck("run", str(spec), "--headless", "--json", "r.json", "--run-dir", "rd", "--retry-failed",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"]["skipped_done"] == 50 and report["resume"]["resumed"] is True
    other = tmp_path / "other.toml"
    other.write_text(SPEC.format(fn="wd_stages:double").replace('name = "cli-test"', 'name = "other-test"'))
    r = _warpdeck("run", str(other), "--headless", "--run-dir", "rd", cwd=tmp_path)
    assert r.returncode == 2
    assert "rd" in r.stderr and "'cli-test'" in r.stderr and "'other-test'" in r.stderr
    assert "Traceback" not in r.stderr
