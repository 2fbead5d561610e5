"""``warpdeck run --trace FILE --metrics HOST:PORT`` and ``replay REC --trace FILE``: the flags reach
the exporters, and a path or an address the machine refuses is a usage error naming the flag."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from wd_cli import warpdeck

SPEC = """
name = "cli-exports"
backend = "numpy"
batch_size = 8
[source]
kind = "synthetic"
count = 200
shape = [16]
dtype = "float32"
[sink]
kind = "null"
[[stages]]
fn = "wd_stages:double"
"""


def _warpdeck(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return warpdeck(*args, cwd=cwd, columns=200)


def _spec(tmp: Path) -> Path:
    p = tmp / "spec.toml"
    p.write_text(SPEC)
    return p


def _trace_events(path: Path) -> list[dict[str, object]]:
    text = path.read_text().rstrip().rstrip(",")
    return list(json.loads(text if text.endswith("]") else text + "]"))


def test_run_writes_a_trace_and_serves_metrics(tmp_path: Path) -> None:
    r = _warpdeck("run", str(_spec(tmp_path)), "--headless", "--broker", "none", "--trace", "run.trace.json",
                  "--metrics", "127.0.0.1:0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "metrics: http://127.0.0.1:" in r.stdout and "/metrics" in r.stdout
    assert "trace: run.trace.json" in r.stdout
    events = _trace_events(tmp_path / "run.trace.json")
    batches = [e for e in events if e.get("ph") == "X" and e.get("name") == "compute"]
    assert sum(int(e["args"]["tasks"]) for e in batches) == 200  # type: ignore[index,call-overload]


def test_a_metrics_address_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    r = _warpdeck("run", str(_spec(tmp_path)), "--headless", "--broker", "none", "--metrics", "9400", cwd=tmp_path)
    assert r.returncode == 2
    assert "--metrics '9400': give HOST:PORT" in r.stderr


def test_a_port_taken_is_a_usage_error_before_anything_runs(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = _warpdeck("run", str(_spec(tmp_path)), "--headless", "--broker", "none", "--run-dir", "rd",
                      "--metrics", f"127.0.0.1:{port}", cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert f"--metrics 127.0.0.1:{port}:" in r.stderr
    assert "done" not in r.stdout  # nothing ran


def test_a_trace_path_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    r = _warpdeck("run", str(_spec(tmp_path)), "--headless", "--broker", "none",
                  "--trace", str(tmp_path / "no" / "such" / "dir" / "t.json"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout
    assert "--trace" in r.stderr and "No such file or directory" in r.stderr
