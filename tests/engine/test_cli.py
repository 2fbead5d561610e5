"""The ``warpdeck`` command: exit codes, the JSON report, and errors a user can act on."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from wd_broker import Mosquitto
from wd_cli import COMMAND, cli_env, warpdeck
from wd_signals import catches


def _warpdeck(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return warpdeck(*args, cwd=cwd)


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


# -- exit statuses (cli/main.py, RunReport.exit_code) -----------------------------------------------
SLOW = """
name = "cli-slow"
backend = "numpy"
batch_size = 8
[source]
kind = "synthetic"
count = {count}
shape = [4]
dtype = "float64"
[sink]
kind = "npy_dir"
[[stages]]
fn = "wd_stages:sleep_10ms"
"""


def _until(cond: Callable[[], object], limit_s: float, what: str) -> None:
    """Wait for ``cond`` (a file to appear, a process to answer), checking every 20 ms."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {limit_s} s")
        time.sleep(0.02)


def _launch(tmp: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*COMMAND, *args], cwd=tmp, env=cli_env(120), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _end(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` if it still runs (a failed test), and reap it."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


async def test_exit_status_precedence_is_decided_by_the_report_alone() -> None:
    from wd_build import spec as small_spec

    from warpdeck.engine.api import ExitStatus, run_pipeline

    base = await run_pipeline(small_spec())
    assert base.exit_code == ExitStatus.FINISHED == 0

    def status(state: str, **counts: int) -> int:
        c = {"total": 10, "done": 10, "failed": 0, "cancelled": 0, "queued": 0, "running": 0, **counts}
        return base.model_copy(update={"status": state, "counts": base.counts.model_copy(update=c)}).exit_code

    assert status("finished", done=9, failed=1) == ExitStatus.FAILED == 1
    assert status("cancelled", done=4, cancelled=6) == ExitStatus.FAILED
    assert status("drained") == ExitStatus.DRAINED == 3
    assert status("drained", done=9, failed=1) == ExitStatus.FAILED  # failed beats drained
    assert status("drained", done=9, cancelled=1) == ExitStatus.FAILED
    assert status("stopped", done=4, queued=6) == ExitStatus.STOPPED == 4
    assert status("stopped", done=3, failed=1, running=6) == ExitStatus.STOPPED  # stopped beats failed
    assert status("stopped") == ExitStatus.STOPPED  # stopped between pulls: the source had more
    assert ExitStatus.USAGE == 2


@pytest.mark.parametrize(("command", "sig"), [("run", signal.SIGINT), ("run", signal.SIGTERM),
                                               ("demo", signal.SIGINT)])
def test_a_run_stopped_by_a_signal_exits_4_with_its_report_and_a_plain_resume_finishes_it(
        tmp_path: Path, command: str, sig: signal.Signals) -> None:
    spec = _write(tmp_path, SLOW.format(count=3000))
    count = 3000 if command == "run" else 200_000  # the demo's stage is fast: give it time to be stopped
    args = ["run", str(spec)] if command == "run" else ["demo", "--count", str(count)]
    common = ["--headless", "--json", "r.json", "--run-dir", "rd", "--broker", "none"]
    out = tmp_path / "rd" / "outputs"
    with _launch(tmp_path, *args, *common) as proc:
        try:
            _until(lambda: (out.is_dir() and any(out.glob("*.npy"))) or proc.poll() is not None, 60, "a first output")
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            _end(proc)
    assert proc.returncode == 4, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "stopped" and report["counts"]["done"] < count
    assert "stopped" in err and "Traceback" not in err
    if command == "demo":
        return
    again = _warpdeck(*args, *common, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["status"] == "finished"
    assert final["counts"]["done"] + final["counts"]["skipped_done"] == 3000


def test_a_run_drained_by_the_operator_exits_3(tmp_path: Path, mosquitto: Mosquitto) -> None:
    from warpdeck.engine.api import Drain, RemoteEngine

    secret = tmp_path / "secret"
    secret.write_text("drain-secret-0123456789abcdef")
    spec = _write(tmp_path, SLOW.format(count=3000))
    remote = RemoteEngine(mosquitto.address, "cli-slow", secret=secret.read_bytes())
    remote.start()
    with _launch(tmp_path, "run", str(spec), "--headless", "--json", "r.json", "--run-dir", "rd",
                 "--broker", mosquitto.url, "--secret-file", str(secret)) as proc:
        try:
            _until(lambda: (remote.latest is not None and remote.latest.counts.done > 0) or proc.poll() is not None,
                   60, "telemetry with a task done")
            answer = remote.send(Drain()).result(10)
            assert answer.ok, answer.message
            _, err = proc.communicate(timeout=60)
        finally:
            remote.stop()
            _end(proc)
    assert proc.returncode == 3, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "drained" and report["counts"]["failed"] == 0
    assert report["counts"]["done"] == report["counts"]["total"] < 3000


def test_help_documents_every_exit_status() -> None:
    for args in (["--help"], ["run", "--help"], ["demo", "--help"]):
        r = subprocess.run([sys.executable, "-m", "warpdeck.cli", *args], capture_output=True, text=True,
                           check=True, env={**os.environ, "COLUMNS": "120"})
        text = " ".join(r.stdout.split())
        for line in ("0 finished: every task done", "1 one or more tasks failed or were cancelled",
                     "2 bad usage or a bad spec", "3 drained by the operator",
                     "4 stopped before the end", "5 stopped by an outage", "6 the journal could not be written",
                     "the higher of 6, 5, 4 wins"):
            assert line in text, (args, line, r.stdout)


def test_the_unexpected_goes_to_the_run_log_and_stderr_names_it_once(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:noisy_double"))
    r = _warpdeck("run", str(spec), "--headless", "--run-dir", "rd", "--broker", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    log = tmp_path / "rd" / "warpdeck.log"
    assert r.stderr == f"warpdeck: something unexpected happened; details in {Path('rd') / 'warpdeck.log'}\n"
    text = log.read_text()
    assert "connection pool is full" in text and "somelib.pool" in text
    assert "ZeroDivisionError: a helper thread's own bug" in text and "somelib-helper" in text


def test_a_clean_run_leaves_stderr_empty_and_no_log(tmp_path: Path) -> None:
    spec = _write(tmp_path, SPEC.format(fn="wd_stages:double"))
    r = _warpdeck("run", str(spec), "--headless", "--run-dir", "rd", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    assert not (tmp_path / "rd" / "warpdeck.log").exists()


def test_a_spec_that_is_not_utf8_exits_2_naming_the_file_and_the_byte(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_bytes(SPEC.format(fn="wd_stages:double").encode().replace(b'"cli-test"', b'"caf\xe9"'))
    r = _warpdeck("run", str(spec), "--headless", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()  # as every spec error: the file, then the issue
    assert "Traceback" not in r.stderr and len(lines) == 2 and str(spec) in lines[0]
    assert "not UTF-8 text (byte 0xe9 on line 2)" in lines[1]


# -- every ending writes a report (issue 28, item 6) ---------------------------------------------------
def _report(tmp: Path) -> dict[str, object]:
    return json.loads((tmp / "r.json").read_text())


def test_every_refusal_writes_its_report_with_the_exit_status(tmp_path: Path) -> None:
    good = _write(tmp_path, SPEC.format(fn="wd_stages:double"))
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.format(fn="wd_stages:double").replace("count = 50", "count = -1"))
    other = tmp_path / "other.toml"
    other.write_text(SPEC.format(fn="wd_stages:add_one"))
    assert _warpdeck("run", str(good), "--headless", "--run-dir", "rd", cwd=tmp_path).returncode == 0
    cases = {
        "a bad spec": (["run", str(bad)], "source.count"),
        "a run directory made by another spec": (["run", str(other), "--run-dir", "rd"], "stages[0].fn"),
        "a trace file that cannot be written": (["run", str(good), "--trace", str(tmp_path / "no" / "such" / "t.json"),
                                                 "--run-dir", "rd2"], "t.json"),
        "a bad --metrics address": (["run", str(good), "--metrics", "nowhere", "--run-dir", "rd3"], "--metrics"),
    }
    for case, (args, named) in cases.items():
        (tmp_path / "r.json").unlink(missing_ok=True)
        r = _warpdeck(*args, "--headless", "--json", "r.json", "--broker", "none", cwd=tmp_path)
        assert r.returncode == 2, (case, r.stderr)
        report = _report(tmp_path)
        assert named in str(report["refused"]) and named in r.stderr, (case, report["refused"], r.stderr)
        assert report["status"] == "stopped" and report["counts"]["done"] == 0, case  # type: ignore[index]
        assert "Traceback" not in r.stderr, case


def test_a_file_in_the_journals_place_is_refused_with_a_report_not_a_traceback(tmp_path: Path) -> None:
    # It was a sqlite3.DatabaseError and a traceback, exit 1. (A journal whose disk refuses it, full
    # or read-only, is exit 6 and writes its report too: tests/engine/test_outage.py.)
    good = _write(tmp_path, SPEC.format(fn="wd_stages:double"))
    (tmp_path / "rd").mkdir()
    (tmp_path / "rd" / "journal.sqlite").write_bytes(b"this is not a database" * 100)
    r = _warpdeck("run", str(good), "--headless", "--json", "r.json", "--run-dir", "rd", "--broker", "none",
                  cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    report = _report(tmp_path)
    assert "not a warpdeck journal" in str(report["refused"]) and "Traceback" not in r.stderr


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal masks from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_warpdeck_itself_imports_exits_4_with_a_report(tmp_path: Path,
                                                                        sig: signal.Signals) -> None:
    # The command's first line (cli/entry.py) holds the signal; NumPy, pydantic and the engine take a
    # few hundred milliseconds more to import. Before, SIGTERM there ended the process by the signal.
    spec = _write(tmp_path, SLOW.format(count=3000))
    log = tmp_path / "stderr"
    cmd = [sys.executable, "-X", "importtime", *COMMAND[1:], "run", str(spec), "--headless", "--json", "r.json",
           "--run-dir", "rd"]
    with log.open("w") as err_f, subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(120), text=True,
                                                 stdout=subprocess.DEVNULL, stderr=err_f) as proc:
        try:
            # Python catches SIGINT from its start; warpdeck's hold on SIGTERM comes right after SIGINT's.
            _until(lambda: catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, 60, "the handler")
            imported = log.read_text()  # -X importtime: a line as each import ends
            proc.send_signal(sig)
            proc.wait(timeout=60)
        finally:
            _end(proc)
    assert "warpdeck.cli.entry" in imported and "warpdeck.cli.main" not in imported  # held from the first line
    err = log.read_text()
    assert proc.returncode == 4, err
    assert "interrupted before the run could report" in err and "Traceback" not in err
    report = _report(tmp_path)
    assert (report["status"], report["stopped_by"], report["counts"]["total"]) == ("stopped", "signal", 0)


def test_a_sigterm_while_the_run_starts_exits_4_with_a_report(tmp_path: Path) -> None:
    # Before the run's own handlers (imports done, the spec loaded, the engine starting), Python's
    # default SIGTERM ended the process without a word or a report.
    spec = _write(tmp_path, SLOW.format(count=3000).replace("wd_stages:sleep_10ms", "wd_slow_import:double"))
    stamp = tmp_path / "loading"
    env = {**cli_env(120), "WARPDECK_TEST_STAMP": str(stamp)}
    with subprocess.Popen([*COMMAND, "run", str(spec), "--headless", "--json", "r.json", "--run-dir", "rd"],
                          cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            # The stage module takes 3 s to import, before the run's own signal handlers exist.
            _until(lambda: stamp.exists() or proc.poll() is not None, 60, "the spec being checked")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            _end(proc)
    assert proc.returncode == 4, err
    report = _report(tmp_path)
    assert report["status"] == "stopped" and report["stopped_by"] == "signal"
    assert "Traceback" not in err


def test_headless_into_a_log_says_how_the_run_goes_as_it_goes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 29: with stdout not a terminal (a CI log), nothing came between the start note and the
    # final table. Now a line every 10 s or per 5 % of the run, whichever is rarer; here the clock's
    # part is shortened (the run lasts about 2 s), the rule is the same.
    from warpdeck.cli.headless import ProgressLines
    from warpdeck.cli.main import main

    monkeypatch.setattr(ProgressLines, "EVERY_S", 0.3)
    spec = _write(tmp_path, SLOW.format(count=1600))
    assert main(["run", str(spec), "--headless", "--broker", "none", "--run-dir", str(tmp_path / "rd")]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("cli-slow: ") and "/1,600 finished" in ln]
    assert len(lines) >= 3, out
    finished = [int(ln.split(": ", 1)[1].split("/")[0].replace(",", "")) for ln in lines]
    assert finished == sorted(finished) and finished[-1] < 1600
    assert all(b - a >= 0.05 * 1600 for a, b in itertools.pairwise(finished)), finished  # 5 % apart at least
    assert all("tasks/s" in ln and "device busy" in ln for ln in lines)
