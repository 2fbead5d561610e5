"""Stops never corrupt an output, for every sink (issue 28).

For the npy, Parquet and callable sinks, each with three sink threads, and the callable sink
written from three worker processes (issue 31, ``[host] sink_pool``): a real ``warpdeck run
--headless`` stopped by SIGTERM, by SIGINT, and by SIGTERM while an outage holds its writes, each at
20 seeded moments (by time since launch, so start-up too, or by outputs landed), resumed after
each. After every stop, every output in place holds exactly the values an uninterrupted run gives
its key (values, not only keys); every stop exits 4 with a report saying so; a stop during an
outage ends within a second or two of the signal. Then the run is resumed to the end and every
output is compared again: each key once, right, no temp file, every task done in the journal.

The uninterrupted run is made once, on the npy sink, and its values are the reference for all.
Outages are a real tmpfs that fills (mounting needs root; elsewhere those cases skip, and
tests/engine/test_outage.py covers the same logic with injected errors).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wd_cli import COMMAND, cli_env
from wd_signals import catches

N = 960
"""Enough for twenty stops that each let 1-40 more outputs land and what is in flight finish: at 480, a
fast machine reached the end after 14-17 of them and the rest found nothing left to stop."""
IN = 64  # float32 values per input; each output is SPREAD times as many (wd_stages:spread)
ROW = IN * 256  # float32 values per output: 64 KiB
BATCH = 4
STOPS = 20
_LAST_BATCHES = 8
"""Batches a run may still have in flight when its outputs show it near the end (slots and sink threads)."""
SEED = 20261127

SPEC = """
name = "stops"
backend = "numpy"
batch_size = {batch}
lanes = 1
[source]
kind = "synthetic"
count = {n}
shape = [{inp}]
dtype = "float32"
seed = 5
[sink]
{sink}
[[stages]]
fn = "wd_stages:spread"
[host]
fill_workers = 2
sink_workers = 3
{pool}
[faults]
outage_timeout_s = 60
"""

SINKS = {
    "npy": 'kind = "npy_dir"\npath = "{out}"',
    "parquet": 'kind = "parquet"\npath = "{out}"\nrow_group_size = 64',
    "callable": 'kind = "callable"\ntarget = "wd_file_sink:save"',
    "callable-in-processes": 'kind = "callable"\ntarget = "wd_file_sink:save"',
}
"""Each sink's spec section; ``-in-processes``: the same sink written from worker processes (``[host] sink_pool``)."""
ENDINGS = {"SIGTERM": (signal.SIGTERM, False), "SIGINT": (signal.SIGINT, False),
           "SIGTERM-in-outage": (signal.SIGTERM, True)}


def _spec(tmp: Path, sink: str, out: Path) -> Path:
    spec = tmp / f"{sink}.toml"
    pool = 'sink_pool = "processes"' if sink.endswith("-in-processes") else ""
    spec.write_text(SPEC.format(batch=BATCH, n=N, inp=IN, sink=SINKS[sink].format(out=out), pool=pool))
    return spec


def _launch(spec: Path, run_dir: Path, out: Path, log: Path, report: Path) -> subprocess.Popen[bytes]:
    env = {**cli_env(), "WD_SINK_DIR": str(out)}
    cmd = [*COMMAND, "run", str(spec), "--headless", "--run-dir", str(run_dir), "--json", str(report)]
    with log.open("wb") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)


class Outputs:
    """What a sink directory holds, by key, read back whatever the sink's format."""

    def __init__(self, sink: str, out: Path) -> None:
        self.sink, self.out = sink, out
        self._seen: dict[str, tuple[int, int, int]] = {}

    def landed(self) -> int:
        """Outputs in place now, as a quick count (a Parquet part counts its batch)."""
        if self.sink == "parquet":
            return BATCH * sum(1 for _ in self.out.glob("part-*.parquet"))
        return sum(1 for _ in self.out.glob("*.npy"))

    def changed(self) -> Iterator[tuple[str, np.ndarray]]:
        """Each (key, value) in a file new or rewritten since the last call."""
        pattern = "part-*.parquet" if self.sink == "parquet" else "*.npy"
        for p in sorted(self.out.glob(pattern)):
            st = p.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._seen.get(p.name) == stamp:
                continue
            self._seen[p.name] = stamp
            yield from self.read(p)

    def read(self, p: Path) -> Iterator[tuple[str, np.ndarray]]:
        if self.sink != "parquet":
            yield p.stem, np.load(p)
            return
        import pyarrow.parquet as pq

        table = pq.read_table(p)
        rows = table.column("output").combine_chunks().flatten().to_numpy().reshape(len(table), ROW)
        yield from zip(table.column("key").to_pylist(), rows, strict=True)

    def every(self) -> list[tuple[str, np.ndarray]]:
        pattern = "part-*.parquet" if self.sink == "parquet" else "*.npy"
        return [kv for p in sorted(self.out.glob(pattern)) for kv in self.read(p)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """Every key's output from an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("reference")
    out = tmp / "outputs"
    spec = _spec(tmp, "npy", out)
    proc = _launch(spec, tmp / "run", out, tmp / "log", tmp / "report.json")
    assert proc.wait(timeout=300) == 0, (tmp / "log").read_text()
    values = {p.stem: np.load(p) for p in out.glob("*.npy")}
    assert len(values) == N
    return values


@pytest.fixture
def disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """For an outage ending, a small tmpfs for the outputs (unmounted at the end); else None."""
    if not ENDINGS[request.node.callspec.params["ending"]][1]:
        yield None
        return
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("an outage needs a tmpfs, and mounting one needs root and mount(8)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _room(mnt: Path, extra: int) -> None:
    """Resize the tmpfs to what it holds now plus ``extra`` bytes."""
    st = os.statvfs(mnt)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    subprocess.run(["mount", "-o", f"remount,size={used + extra}", str(mnt)], check=True, capture_output=True)


def _wait_for(proc: subprocess.Popen[bytes], cond: Callable[[], bool], limit_s: float = 60.0) -> bool:
    """Poll ``cond()`` until it holds (True) or the process ends (False)."""
    deadline = time.monotonic() + limit_s
    while proc.poll() is None:
        if cond():
            return True
        if time.monotonic() > deadline:
            raise AssertionError("the moment to stop never came")
        time.sleep(0.002)
    return False


class Stops:
    """One sink and one ending: the run directory, its outputs, and what the stops so far found."""

    def __init__(self, tmp: Path, sink: str, ending: str, disk: Path | None) -> None:
        self.tmp, self.disk = tmp, disk
        self.sig, self.in_outage = ENDINGS[ending]
        self.out = (disk or tmp) / "outputs"
        self.out.mkdir()
        self.run_dir = tmp / "run"  # the journal on another disk: only the outputs' fills
        self.spec = _spec(tmp, sink, self.out)
        self.outputs = Outputs(sink, self.out)
        self.rng = np.random.default_rng(SEED)
        self.moments: list[str] = []
        self.stopped = 0
        self.slowest = 0.0

    def _moment(self, proc: subprocess.Popen[bytes], log: Path) -> bool:
        """Wait for this stop's seeded moment; whether the run still lives then."""
        launched = time.monotonic()
        if self.in_outage:  # a little after the outage begins
            when = float(self.rng.uniform(0.0, 0.3))
            self.moments.append(f"outage+{when * 1e3:.0f}ms")
            held = _wait_for(proc, lambda: b"outage:" in log.read_bytes())
            time.sleep(when)
            return held and proc.poll() is None
        if self.rng.random() < 0.25:  # by time: imports, journal open, first batches
            # From the moment warpdeck holds the signals (cli/entry.py, its first line): before it,
            # while the interpreter itself starts, a signal acts as Python's default (a stated limit).
            when = float(self.rng.uniform(0.0, 0.6))
            self.moments.append(f"t+{when:.2f}s")
            if not _wait_for(proc, lambda: catches(proc.pid, signal.SIGTERM)):
                return False
            launched = time.monotonic()
            return _wait_for(proc, lambda: time.monotonic() - launched >= when)
        target = self.outputs.landed() + int(self.rng.integers(1, 40))  # by outputs: a few more than now
        self.moments.append(f"n>={target}")
        return _wait_for(proc, lambda: self.outputs.landed() >= target)

    def stop(self, i: int, reference: dict[str, np.ndarray]) -> None:
        """Launch, stop at the seeded moment, and check the report and every output in place."""
        log, report = self.tmp / f"log{i}", self.tmp / f"report{i}.json"
        if self.disk is not None:
            _room(self.disk, int(self.rng.integers(2, 10)) * BATCH * ROW * 4)
        proc = _launch(self.spec, self.run_dir, self.out, log, report)
        if self._moment(proc, log):
            signalled, left = time.monotonic(), N - self.outputs.landed()
            proc.send_signal(self.sig)
            code = proc.wait(timeout=60)
            self.slowest = max(self.slowest, time.monotonic() - signalled)
            doc = json.loads(report.read_text())
            if code == 0 and doc["status"] == "finished" and left <= _LAST_BATCHES * BATCH:
                # The run ended between the moment and the signal, its last batches already in
                # flight (seen on a loaded machine): nothing was left to stop. Its outputs are
                # checked below all the same; a stop ignored with more work left still fails.
                self.moments[-1] += " (finished first)"
            else:
                self._stopped(i, code, doc, log)
        else:
            assert proc.wait(timeout=60) == 0, log.read_text()
        for key, value in self.outputs.changed():  # every output in place is its own, whole
            np.testing.assert_array_equal(value, reference[key], err_msg=f"{key} after stop {i} ({self.moments[-1]})")

    def _stopped(self, i: int, code: int, doc: dict[str, Any], log: Path) -> None:
        """A stop that landed while the run lived: exit 4, a report that says a signal stopped it."""
        assert code == 4, f"stop {i} ({self.moments[-1]}): exit {code}\n{log.read_text()}"
        assert (doc["status"], doc["stopped_by"]) == ("stopped", "signal"), log.read_text()
        assert doc["counts"]["failed"] == 0, doc["failures"]
        if self.in_outage:
            assert doc["outages"] is not None and doc["outages"]["count"] >= 1
        self.stopped += 1

    def finish(self, reference: dict[str, np.ndarray]) -> dict[str, object]:
        """Resume to the end; every key once, with its value; nothing left over; the final report."""
        if self.disk is not None:
            _room(self.disk, 4 * N * ROW * 4)
        log, report = self.tmp / "log-final", self.tmp / "report-final.json"
        proc = _launch(self.spec, self.run_dir, self.out, log, report)
        assert proc.wait(timeout=300) == 0, log.read_text()
        every = self.outputs.every()
        keys = [k for k, _ in every]
        assert sorted(set(keys)) == sorted(reference), "a key is missing"
        assert len(keys) == N, "a key was written twice"
        for key, value in every:
            np.testing.assert_array_equal(value, reference[key], err_msg=key)
        assert [p.name for p in self.out.iterdir() if p.name.startswith(".")] == []  # no temp file, no checksums
        with sqlite3.connect(self.run_dir / "journal.sqlite") as c:
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert dict(c.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall()) == {2: N}
        doc: dict[str, object] = json.loads(report.read_text())
        return doc


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("sink", list(SINKS))
def test_twenty_stops_land_only_right_values_and_the_resume_finishes_them(
        tmp_path: Path, reference: dict[str, np.ndarray], disk: Path | None, sink: str, ending: str) -> None:
    if sink == "parquet":
        pytest.importorskip("pyarrow.parquet")
    run = Stops(tmp_path, sink, ending, disk)
    for i in range(STOPS):
        run.stop(i, reference)
    assert run.stopped >= STOPS - 2, f"only {run.stopped} of {STOPS} stops landed while the run lived: {run.moments}"
    if run.in_outage:  # the promise is 1 s; this bound only catches a hang on a slow machine
        assert run.slowest < 3.0, f"a stop during an outage took {run.slowest:.2f} s"
    doc = run.finish(reference)
    print(f"{sink} x {ending}: {run.stopped} stops ({', '.join(run.moments)}); slowest exit {run.slowest:.2f} s;"
          f" resume {doc['resume']}")
