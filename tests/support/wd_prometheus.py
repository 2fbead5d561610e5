"""A real Prometheus server and promtool for tests: Debian's ``prometheus`` on a free loopback port,
scraping the targets a test names, its data in the test's tmp_path.

With ``CI=true`` a missing binary is a failure, not a skip: the metrics endpoint's tests against a
real Prometheus must run in CI (.ci/run installs it). Waits are on Prometheus's own HTTP API
(``/-/ready``, ``/api/v1/targets``, ``/api/v1/query``), checked until true, never a bare sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from warpdeck.engine.control.broker import free_port

Samples = list[tuple[dict[str, str], float]]
"""One answer of an instant query: each series' labels and value."""


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``; skips (fails under CI=true) when missing."""
    debian = Path("/usr/bin") / name  # where Debian's package puts both, should PATH lack /usr/bin
    found = shutil.which(name) or (str(debian) if debian.is_file() else None)
    if found is None:
        msg = f"{name} is not installed (apt install prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg}: CI must test the metrics endpoint against a real Prometheus")
        pytest.skip(msg)
    return found


def poll(cond: Callable[[], object], limit_s: float, what: str, step: float = 0.05) -> None:
    """Check ``cond`` until true (an exception counts as false until the limit, then is raised)."""
    end = time.monotonic() + limit_s
    while True:
        try:
            if cond():
                return
        except OSError:
            if time.monotonic() > end:
                raise
        if time.monotonic() > end:
            raise AssertionError(f"{what} not met within {limit_s} s")
        time.sleep(step)


class Prometheus:
    """``prometheus`` scraping ``targets`` (HOST:PORT, path /metrics) every 0.5 s as job warpdeck."""

    def __init__(self, workdir: Path, targets: Sequence[str]) -> None:
        self.binary = tool("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.config = workdir / "prometheus.yml"
        self.log = workdir / "prometheus.log"
        self.config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "500ms", "scrape_timeout": "500ms", "evaluation_interval": "500ms"},
            "scrape_configs": [{"job_name": "warpdeck", "static_configs": [{"targets": list(targets)}]}],
        }, indent=2))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, limit_s: float = 30.0) -> None:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        poll(self._ready, limit_s, f"prometheus ready on {self.url}")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()}")
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
            return bool(r.status == 200)

    def get(self, path: str, **params: str) -> Any:
        """The ``data`` of an API answer (``/api/v1/...``); fails on an error answer."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def targets_up(self) -> bool:
        """Whether every target's last scrape succeeded."""
        active = self.get("/api/v1/targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def target_errors(self) -> str:
        return "; ".join(f"{t['scrapeUrl']}: {t['health']} {t['lastError']}"
                         for t in self.get("/api/v1/targets")["activeTargets"])

    def query(self, expr: str) -> Samples:
        """An instant query's series: labels (without ``__name__``) and value."""
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return [({k: v for k, v in s["metric"].items() if k != "__name__"}, float(s["value"][1]))
                for s in data["result"]]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def promtool(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` (its input on stdin when given), output captured as text."""
    return subprocess.run([tool("promtool"), *args], input=stdin.decode() if stdin is not None else None,
                          capture_output=True, text=True, cwd=cwd, timeout=60, check=False)
