"""``warpdeck run`` of a spec with steps (``cli/steps.py``), as a person runs it: the real command in a
subprocess, on the examples (``spectra-gate.toml`` with fewer tasks, ``normalise-classify.toml`` on
a few generated images); exit statuses 0, 7 (held at a gate), 8 (rejected) and 2 (refused)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_cli import warpdeck

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
COUNT = 100
"""Tasks of the spectra-gate copy (the example has 2,000)."""


def _spectra_gate(tmp: Path) -> Path:
    """The example, with ``COUNT`` tasks and otherwise as it is."""
    text = (EXAMPLES / "spectra-gate.toml").read_text(encoding="utf-8")
    assert "count = 2000\n" in text
    spec = tmp / "spectra-gate.toml"
    spec.write_text(text.replace("count = 2000\n", f"count = {COUNT}\n", 1), encoding="utf-8")
    return spec


def _run(tmp: Path, spec: Path, run_dir: str, *args: str) -> subprocess.CompletedProcess[str]:
    return warpdeck("run", str(spec), "--headless", "--broker", "none", "--run-dir", run_dir, *args, cwd=tmp)


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_a_gate_holds_with_7_and_approve_goes_on_to_the_sink(tmp_path: Path) -> None:
    from warpdeck.examples.steps import DB_FLOOR

    spec = _spectra_gate(tmp_path)
    held = _run(tmp_path, spec, "D", "--json", "held.json")
    assert held.returncode == 7, held.stderr
    report = _json(tmp_path / "held.json")
    assert report["gate"]["step"] == "write" and report["gate"]["decision"] == "waiting"
    assert [(s["name"], s["status"]) for s in report["segments"]] == [
        ("spectra", "finished"), ("peak", "finished"), ("write", "held at gate")]
    assert any(line.strip().startswith("max = ") for line in report["gate"]["produced"])
    assert "--approve write" in held.stdout  # how to go on
    assert "step 2 of 3: peak (reduce); waiting for it at a barrier: write (gate)" in held.stdout
    assert not (tmp_path / "D" / "outputs").exists()

    approved = _run(tmp_path, spec, "D", "--json", "approved.json", "--approve", "write", "--note", "ok")
    assert approved.returncode == 0, approved.stderr
    report = _json(tmp_path / "approved.json")
    assert report["gate"]["decision"] == "approved" and report["gate"]["note"] == "ok"
    assert report["gate"]["by"] == "command line"
    assert [(s["name"], s["status"]) for s in report["segments"]] == [
        ("spectra", "finished earlier"), ("peak", "finished earlier"), ("write", "finished")]
    out = tmp_path / "D" / "outputs"
    names = sorted(p.name for p in out.glob("*.npy"))
    assert names == [f"syn-{i:08d}.npy" for i in range(COUNT)]
    peak = float(np.load(tmp_path / "D" / "steps" / "peak" / "result.npz")["max"])
    db = np.stack([np.load(out / n) for n in names])
    spectra = np.stack([np.load(tmp_path / "D" / "steps" / "spectra" / "outputs" / n) for n in names])
    assert db.shape == (COUNT, 63, 129) and peak == pytest.approx(float(spectra.max()))
    assert db.max() <= 0.0 and db.min() >= DB_FLOOR
    assert db.max() == pytest.approx(0.0, abs=1e-4)  # the loudest bin of the run is the peak
    want = 20 * np.log10(np.maximum(spectra.astype(np.float64) / peak, 10 ** (DB_FLOOR / 20)))
    np.testing.assert_allclose(db, want, atol=1e-3)


def test_reject_ends_with_8_and_writes_nothing_to_the_sink(tmp_path: Path) -> None:
    spec = _spectra_gate(tmp_path)
    r = _run(tmp_path, spec, "D", "--json", "r.json", "--reject", "write", "--note", "no")
    assert r.returncode == 8, r.stderr
    report = _json(tmp_path / "r.json")
    assert report["gate"]["decision"] == "rejected" and report["gate"]["note"] == "no"
    assert report["segments"][-1]["status"] == "rejected"
    assert not (tmp_path / "D" / "outputs").exists()
    # The rejection is kept in the run directory: the same command without a decision ends there too.
    again = _run(tmp_path, spec, "D", "--json", "again.json")
    assert again.returncode == 8, again.stderr
    assert _json(tmp_path / "again.json")["gate"]["note"] == "no"


def test_approving_a_step_with_no_gate_exits_2_naming_the_gated_steps(tmp_path: Path) -> None:
    spec = _spectra_gate(tmp_path)
    r = _run(tmp_path, spec, "D", "--json", "r.json", "--approve", "nosuch")
    assert r.returncode == 2
    assert "nosuch" in r.stderr and "gated steps: write" in r.stderr
    assert "nosuch" in _json(tmp_path / "r.json")["refused"]
    assert not (tmp_path / "D" / "steps.json").exists()


def test_approving_and_rejecting_one_step_exits_2(tmp_path: Path) -> None:
    spec = _spectra_gate(tmp_path)
    r = _run(tmp_path, spec, "D", "--approve", "write", "--reject", "write")
    assert r.returncode == 2 and "both approved and rejected" in r.stderr


@pytest.mark.parametrize("flag", [("--trace", "x.json"), ("--metrics", "127.0.0.1:0")])
def test_trace_and_metrics_are_refused_for_steps(tmp_path: Path, flag: tuple[str, str]) -> None:
    spec = _spectra_gate(tmp_path)
    r = _run(tmp_path, spec, "D", *flag)
    assert r.returncode == 2
    assert flag[0] in r.stderr and "steps" in r.stderr
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "D" / "steps.json").exists()


def test_normalise_classify_runs_on_images(tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    pytest.importorskip("torch")
    from warpdeck.examples.classify import make_images

    n = 40
    make_images(tmp_path / "data" / "images", n)  # where the spec's relative path points
    spec = tmp_path / "normalise-classify.toml"
    shutil.copy(EXAMPLES / "normalise-classify.toml", spec)
    r = _run(tmp_path, spec, "D", "--json", "r.json")
    assert r.returncode == 0, r.stderr
    report = _json(tmp_path / "r.json")
    assert [(s["name"], s["status"], s["done"]) for s in report["segments"]] == [
        ("stats", "finished", n), ("classify", "finished", n)]
    stats = report["segments"][0]["result"]
    assert stats["count"] == [n * 64 * 64] and len(stats["mean"]) == 3
    assert all(0.0 < m < 1.0 for m in stats["mean"]) and all(s > 0 for s in stats["std"])
    out = sorted((tmp_path / "D" / "outputs").glob("*.npy"))
    assert len(out) == n
    probs = np.stack([np.load(p) for p in out])
    assert probs.shape == (n, 10) and probs.dtype == np.float32
    assert (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)


def test_sigint_in_a_step_stops_the_run_with_4_and_the_same_command_finishes_it(tmp_path: Path) -> None:
    import os
    import signal
    import sys
    import time

    text = (EXAMPLES / "spectra-gate.toml").read_text(encoding="utf-8").replace("count = 2000\n", "count = 4000\n")
    spec = tmp_path / "spectra-gate.toml"
    spec.write_text(text, encoding="utf-8")
    run_dir, report = tmp_path / "D", tmp_path / "stopped.json"
    cmd = [sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--broker", "none", "--run-dir",
           str(run_dir), "--json", str(report)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outputs = run_dir / "steps" / "spectra" / "outputs"
    end = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < end:
        if outputs.is_dir() and sum(1 for _ in outputs.glob("*.npy")) >= 100:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before the signal"
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err  # stopped: the same command resumes
    stopped = _json(report)
    assert [s["status"] for s in stopped["segments"]] == ["stopped", "not started", "not started"]
    assert stopped["segments"][0]["report"]["stopped_by"] == "signal"
    assert "spectra-gate.spectra stopped" in out
    done = _run(tmp_path, spec, str(run_dir), "--approve", "write")
    assert done.returncode == 0, done.stderr
    assert sum(1 for _ in (run_dir / "outputs").glob("*.npy")) == 4000
