"""A source that raises part way (engine/run/feeder.py): what it yielded before runs to the end,
nothing more is admitted, the run ends stopped with the error and its traceback in the report (exit
status 4), and the same run directory resumes once the source works: through the API and the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from wd_build import spec
from wd_cli import warpdeck
from wd_stages import RecordingSink

from warpdeck.engine.api import Engine, ExitStatus, IterableSource


def _items(count: int, fail_at: int | None) -> Iterator[tuple[str, np.ndarray]]:
    for i in range(count):
        if i == fail_at:
            raise RuntimeError("the bucket went away")
        yield f"k{i:03d}", np.full(4, float(i))


async def test_a_source_that_fails_part_way_stops_the_run_after_what_it_gave_and_a_resume_finishes(
        tmp_path: Path) -> None:
    s = spec(["wd_stages:double"], name="src-fails", batch_size=4)
    first = RecordingSink()
    async with Engine(s, tmp_path, source=IterableSource(lambda: _items(40, fail_at=22)), sink=first) as eng:
        report = await eng.wait()
    assert (report.status, report.stopped_by, report.exit_code) == ("stopped", "source", ExitStatus.STOPPED)
    assert report.source_error == "RuntimeError: the bucket went away"
    assert "in _items" in report.source_traceback and report.source_traceback.rstrip().endswith(
        "RuntimeError: the bucket went away")
    c = report.counts
    assert (c.total, c.done, c.failed, c.queued + c.running) == (22, 22, 0, 0)  # all it gave, none lost
    assert sorted(first.writes) == [f"k{i:03d}" for i in range(22)]

    again = RecordingSink()
    async with Engine(s, tmp_path, source=IterableSource(lambda: _items(40, fail_at=None)), sink=again) as eng:
        resumed = await eng.wait()
    assert (resumed.status, resumed.stopped_by, resumed.source_error) == ("finished", "", "")
    assert resumed.counts.skipped_done == 22 and sorted(again.writes) == [f"k{i:03d}" for i in range(22, 40)]


_SOURCE = """
import os
import numpy as np

def items():
    for i in range(60):
        if i == 30 and not os.environ.get("WD_SOURCE_FIXED"):
            raise OSError(5, "Input/output error", "s3://bucket/part-0007")
        yield f"k{i:03d}", np.full(4, float(i))
"""

_SPEC = """
name = "src-fails"
backend = "numpy"
batch_size = 8
[source]
kind = "callable"
target = "wd_failing_source:items"
[sink]
kind = "npy_dir"
[[stages]]
fn = "wd_stages:double"
"""


def test_the_command_says_the_source_failed_exits_4_and_the_same_command_finishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wd_failing_source.py").write_text(_SOURCE)  # importable: `python -m` runs from tmp_path
    (tmp_path / "spec.toml").write_text(_SPEC)
    args = ("run", "spec.toml", "--headless", "--run-dir", "rd", "--json", "report.json")
    r = warpdeck(*args, cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert r.stderr == ("src-fails: stopped: the source failed after 30 tasks (OSError: [Errno 5] Input/output "
                        "error: 's3://bucket/part-0007'; traceback in the report), 30 done; once the source is "
                        "fixed, run the same command again to resume and finish it\n")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stopped_by"] == "source" and "raise OSError" in report["source_traceback"]
    assert len(list((tmp_path / "rd" / "outputs").glob("*.npy"))) == 30

    monkeypatch.setenv("WD_SOURCE_FIXED", "1")  # the command's environment is this one
    r = warpdeck(*args, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    assert len(list((tmp_path / "rd" / "outputs").glob("*.npy"))) == 60
