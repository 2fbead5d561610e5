"""kill -9 at 20 seeded random moments, resume after each: nothing lost, nothing written twice.

Run three times: with one loading and one writing thread per lane, with three of each (issue 16:
parallel sinks finish out of order, so a kill leaves later outputs written before earlier ones), and
with the fill and the sink in worker processes (issue 31: a user's load function, ``[host] fill_pool``,
and the npy sink written from workers, ``[host] sink_pool``; each kill leaves the workers to end by
themselves and their shared memory to the next start).
And on a Parquet sink (issue 18): one part file per batch, so at the end every key is a row of
exactly one part file, each part file renamed into place once, with the reference's values (stops
by SIGTERM and SIGINT, on every sink: test_stop_resume.py).

A real ``warpdeck run --headless`` subprocess on a real npy sink and journal; each kill is a
SIGKILL, at a moment chosen by output count (mid-run) or by time since launch (often during
start-up, before or while the journal opens). At the end the run is resumed to completion and
compared with an uninterrupted run in another directory: the same outputs byte for byte, each
renamed into place exactly once (counted by the kernel through inotify, not by the killed
process), no temp files left, the journal intact and every task in it done.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from wd_inotify import RenameWatch, assert_outputs_as_reference

SUPPORT = Path(__file__).resolve().parents[1] / "support"
N = 800
KILLS = 20
SEED = 20240605

SPEC = """
name = "crash"
backend = "numpy"
batch_size = 4
lanes = 2
{source}
[sink]
kind = "{sink}"
path = "{out}"
[[stages]]
fn = "wd_stages:slow_double"
{host}"""

HOSTS = {"one thread": "", "parallel": "[host]\nfill_workers = 3\nsink_workers = 3\n",
         "processes": '[host]\nfill_pool = "processes"\nsink_pool = "processes"\nfill_workers = 2\nsink_workers = 2\n'}
SYNTHETIC = '[source]\nkind = "synthetic"\ncount = {n}\nshape = [64]\ndtype = "float32"\nseed = 11'
ITEMS = ('[source]\nkind = "items"\nitems = "wd_fill:items_seeded"\nload = "wd_fill:load_seeded"\n'
         'shape = [64]\ndtype = "float32"\noptions = {{ count = {n} }}')
"""The same tasks and inputs through a user's items and load functions, which may run in processes."""


def _launch(spec: Path, run_dir: Path, report: Path | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    cmd = [sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--run-dir", str(run_dir)]
    if report is not None:
        cmd += ["--json", str(report)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _outputs(out: Path) -> list[str]:
    return [p.name for p in out.iterdir() if not p.name.startswith(".")]


def _spec(tmp: Path, name: str, host: str = "", sink: str = "npy_dir",
          source: str = SYNTHETIC) -> tuple[Path, Path, Path]:
    run_dir = tmp / name
    out = run_dir / "outputs"
    out.mkdir(parents=True)
    spec = tmp / f"{name}.toml"
    spec.write_text(SPEC.format(n=N, out=out, host=host, sink=sink, source=source.format(n=N)))
    return spec, run_dir, out


def _kill_repeatedly(spec: Path, run_dir: Path, out: Path, watch: RenameWatch,
                     per_output: int = 1, sig: signal.Signals = signal.SIGKILL) -> tuple[int, list[str]]:
    """Launch, send ``sig`` at a seeded random moment, repeat KILLS times; how many hit a live run.
    ``per_output``: tasks per output file (a Parquet part holds a batch), to keep the moments mid-run."""
    rng = np.random.default_rng(SEED)
    landed = 0
    moments: list[str] = []
    for _ in range(KILLS):
        proc = _launch(spec, run_dir)
        launched = time.monotonic()
        if rng.random() < 0.25:  # by time: anywhere from interpreter start to the first batches
            when = float(rng.uniform(0.0, 0.6))
            target = None
            moments.append(f"t+{when:.2f}s")
        else:  # by output count: a few more outputs than there are now, then a little later
            target = len(_outputs(out)) + max(1, int(rng.integers(1, 25)) // per_output)
            when = float(rng.uniform(0.0, 0.01))
            moments.append(f"n>={target}+{when * 1e3:.0f}ms")
        while proc.poll() is None:
            watch.poll()
            if target is None and time.monotonic() - launched >= when:
                break
            if target is not None and len(_outputs(out)) >= target:
                time.sleep(when)
                break
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(sig)
            landed += 1
        proc.wait(timeout=30)
        proc.stderr.close()  # type: ignore[union-attr]
        watch.poll()
    return landed, moments


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts renames with Linux inotify")
@pytest.mark.parametrize("threads", list(HOSTS))
def test_twenty_kills_then_resume_gives_the_uninterrupted_outputs_each_written_once(tmp_path: Path,
                                                                                   threads: str) -> None:
    t_start = time.perf_counter()
    source = ITEMS if threads == "processes" else SYNTHETIC
    ref_spec, ref_dir, ref_out = _spec(tmp_path, "reference", source=SYNTHETIC)
    ref = _launch(ref_spec, ref_dir)

    spec, run_dir, out = _spec(tmp_path, "crashed", HOSTS[threads], source=source)
    watch = RenameWatch(out)
    try:
        landed, moments = _kill_repeatedly(spec, run_dir, out, watch)
        assert landed == KILLS, f"only {landed} of {KILLS} kills landed before the run ended: {moments}"
        done_before_final = len(_outputs(out))
        assert done_before_final < N, "the kills came too late to interrupt anything"

        final = _launch(spec, run_dir, tmp_path / "final.json")
        _, err = final.communicate(timeout=120)
        assert final.returncode == 0, err.decode()
        watch.poll()
    finally:
        watch.close()
    ref_err = ref.communicate(timeout=120)[1]
    assert ref.returncode == 0, ref_err.decode()
    elapsed = time.perf_counter() - t_start

    assert_outputs_as_reference(out, ref_out, watch, N)

    with sqlite3.connect(run_dir / "journal.sqlite") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        states = dict(c.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall())
    assert states == {2: N}
    report = json.loads((tmp_path / "final.json").read_text())
    assert report["counts"]["skipped_done"] + report["counts"]["done"] == N
    assert report["resume"]["resumed"] is True
    if threads == "parallel":
        assert report["host_threads"] == {"0": {"fill": 3, "sink": 3}, "1": {"fill": 3, "sink": 3}}
    if threads == "processes":  # the final run's fills and writes ran in two processes per lane
        assert {lane: len(workers) for lane, workers in report["host_processes"].items()} == {"0": 2, "1": 2}
        assert {lane: len(workers) for lane, workers in report["sink_processes"].items()} == {"0": 2, "1": 2}
    print(f"crash test: {KILLS} kills ({', '.join(moments)}); {done_before_final} outputs before the final run;"
          f" {elapsed:.1f} s in all")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts renames with Linux inotify")
@pytest.mark.parametrize(("sig", "threads"), [(signal.SIGKILL, "one thread")], ids=["SIGKILL"])
def test_twenty_stops_then_resume_leave_every_key_in_exactly_one_parquet_row_with_its_values(
        tmp_path: Path, sig: signal.Signals, threads: str) -> None:
    # SIGTERM and SIGINT, on every sink, with three sink threads: tests/engine/test_stop_resume.py.
    pq = pytest.importorskip("pyarrow.parquet")
    from warpdeck.engine.edges.sources import synthetic_values

    spec, run_dir, out = _spec(tmp_path, "crashed", HOSTS[threads], sink="parquet")
    watch = RenameWatch(out)
    try:
        landed, moments = _kill_repeatedly(spec, run_dir, out, watch, per_output=4, sig=sig)
        assert landed == KILLS, f"only {landed} of {KILLS} kills landed before the run ended: {moments}"
        final = _launch(spec, run_dir, tmp_path / "final.json")
        _, err = final.communicate(timeout=120)
        assert final.returncode == 0, err.decode()
        watch.poll()
    finally:
        watch.close()

    parts = sorted(_outputs(out))
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp files left
    assert not watch.overflowed and set(watch.counts) == set(parts) and set(watch.counts.values()) == {1}
    keys: list[str] = []
    values: list[np.ndarray] = []
    for part in parts:
        table = pq.read_table(out / part)
        keys += table.column("key").to_pylist()
        values.append(table.column("output").combine_chunks().flatten().to_numpy().reshape(len(table), 64))
    assert len(keys) == len(set(keys)) == N, "a key is missing or written twice"
    got = dict(zip(keys, np.concatenate(values), strict=True))
    expected = synthetic_values(11, range(N), (64,), np.dtype("float32")) * 2 + 1
    for i in range(N):
        np.testing.assert_array_equal(got[f"syn-{i:08d}"], expected[i])
    with sqlite3.connect(run_dir / "journal.sqlite") as c:
        states = dict(c.execute("SELECT state, COUNT(*) FROM tasks GROUP BY state").fetchall())
    assert states == {2: N}
    report = json.loads((tmp_path / "final.json").read_text())
    print(f"parquet crash test: {KILLS} x {sig.name} ({', '.join(moments)}); {len(parts)} part files;"
          f" {report['resume']}")
