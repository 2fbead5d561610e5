"""The command line's control plane: embedded by default, a real broker by URL, none on request;
a broker that cannot be reached never stops the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from wd_broker import Mosquitto

from warpdeck.engine.control.broker import free_port

SUPPORT = Path(__file__).resolve().parents[1] / "support"
SPEC = """
name = "cli-broker"
backend = "numpy"
batch_size = 8
[source]
kind = "synthetic"
count = 400
shape = [4]
dtype = "float64"
[sink]
kind = "null"
[[stages]]
fn = "wd_stages:sleep_10ms"
"""


def _run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    spec = tmp / "spec.toml"
    spec.write_text(SPEC)
    report = tmp / "report.json"
    proc = subprocess.run([sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--json", str(report),
                           "--run-dir", str(tmp / "run"), *args], capture_output=True, text=True, cwd=tmp,
                          env={**os.environ, "PYTHONPATH": str(SUPPORT), "COLUMNS": "160", **(env or {})},
                          timeout=120, check=False)
    return proc, json.loads(report.read_text()) if report.exists() else {}


def test_the_default_is_an_embedded_broker(tmp_path: Path) -> None:
    proc, report = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report["control"]["broker"].startswith("mqtt://127.0.0.1:")
    assert report["control"]["connected"] is True
    assert "control plane" in proc.stdout


def test_a_real_broker_by_url(tmp_path: Path, mosquitto: Mosquitto) -> None:
    proc, report = _run(tmp_path, "--broker", mosquitto.url)
    assert proc.returncode == 0, proc.stderr
    assert report["control"]["broker"] == mosquitto.url and report["control"]["connected"] is True


def test_an_unreachable_broker_never_stops_the_run(tmp_path: Path) -> None:
    proc, report = _run(tmp_path, "--broker", f"mqtt://127.0.0.1:{free_port()}")
    assert proc.returncode == 0, proc.stderr
    assert report["counts"]["done"] == 400
    assert report["control"]["connected"] is False and report["control"]["error"]


def test_none_runs_without_a_control_plane(tmp_path: Path) -> None:
    proc, report = _run(tmp_path, "--broker", "none")
    assert proc.returncode == 0, proc.stderr
    assert report["control"] is None


def test_bad_broker_flags_exit_2_and_say_why(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, "--broker", "amqp://h")
    assert proc.returncode == 2 and "--broker" in proc.stderr
    proc, _ = _run(tmp_path, "--ca-file", str(tmp_path / "spec.toml"))
    assert proc.returncode == 2 and "--ca-file needs an mqtts://" in proc.stderr
    proc, _ = _run(tmp_path, "--secret-file", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "secret file" in proc.stderr
    proc, _ = _run(tmp_path, env={"WARPDECK_SECRET": "short"})
    assert proc.returncode == 2 and "WARPDECK_SECRET" in proc.stderr
