"""kill -9 at seeded moments through a three-step job (a map, a reduce, a gated map that uses the
reduce's result), resumed after each: nothing lost, nothing written twice, the reduce's result that
of an uninterrupted run.

A real ``warpdeck run --headless`` subprocess. The first launches run without a decision, so the
run stops at the gate (exit status 7) once the map and the reduce are done; from then on each launch
approves the gate, as an operator would. Each kill is a SIGKILL at a seeded time after launch:
during start-up, the map, the reduce, between steps or in the gated step. At the end the run is
resumed to completion and compared with an uninterrupted run in another directory: the same outputs
byte for byte, each renamed into place exactly once (counted by the kernel through inotify), no temp
files left, the reduce's count exact and its mean and variance equal to 1e-12 (a resumed reduce
groups its tasks into other batches, so float64 sums may round differently in the last place).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from wd_inotify import RenameWatch, assert_outputs_as_reference

SUPPORT = Path(__file__).resolve().parents[1] / "support"
N = 800
KILLS = 14
WRITE_KILLS = 4
SEED = 20261128

SPEC = """
name = "crash-steps"
backend = "numpy"
batch_size = 4
lanes = 2
[source]
kind = "synthetic"
count = {n}
shape = [16]
dtype = "float32"
seed = 5
[sink]
kind = "npy_dir"
path = "outputs"
[[steps]]
name = "prep"
[[steps.stages]]
fn = "wd_stages:slow_double"
[[steps]]
name = "stats"
after = ["prep"]
[steps.reduce]
builtin = "mean_var"
[[steps]]
name = "write"
after = ["prep", "stats"]
gate = true
[[steps.stages]]
fn = "wd_steps:centre"
"""


def _launch(spec: Path, run_dir: Path, approve: bool, report: Path | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    cmd = [sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--broker", "none",
           "--run-dir", str(run_dir)]
    if approve:
        cmd += ["--approve", "write", "--note", "checked"]
    if report is not None:
        cmd += ["--json", str(report)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _progress(run_dir: Path) -> int:
    """How far the run got: the map's outputs, the reduce's tasks (a partial holds a batch of 4) and
    the gated step's outputs, each up to N."""
    def count(d: Path, glob: str) -> int:
        return sum(1 for _ in d.glob(glob)) if d.is_dir() else 0
    return (count(run_dir / "steps/prep/outputs", "[!.]*.npy")
            + 4 * count(run_dir / "steps/stats/partials", "partial-*") + count(run_dir / "outputs", "[!.]*.npy"))


def _kill_once(spec: Path, run_dir: Path, rng: np.random.Generator | None, approve: bool, watch: RenameWatch,
               moments: list[str]) -> int:
    """Launch; with ``rng``, SIGKILL it at a seeded moment (by time since launch, or by progress);
    without, let it end. Returns its exit status (-9 where the kill landed)."""
    proc = _launch(spec, run_dir, approve=approve)
    launched = time.monotonic()
    target: int | None = None
    when = float("inf")
    if rng is not None and rng.random() < 0.25:  # by time: anywhere from interpreter start to the first batches
        when = float(rng.uniform(0.0, 0.6))
        moments.append(f"t+{when:.2f}s")
    elif rng is not None:  # by progress through the three steps: a little further than now
        target, when = _progress(run_dir) + int(rng.integers(20, 260)), float(rng.uniform(0.0, 0.01))
        moments.append(f"p>={target}+{when * 1e3:.0f}ms")
    while proc.poll() is None:
        watch.poll()
        if target is None and time.monotonic() - launched >= when:
            break
        if target is not None and _progress(run_dir) >= target:
            time.sleep(when)
            break
        time.sleep(0.001)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    code = proc.wait(timeout=60)
    proc.stderr.close()  # type: ignore[union-attr]
    watch.poll()
    return code


def _outputs(out: Path) -> list[str]:
    return [p.name for p in out.iterdir() if not p.name.startswith(".")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts renames with Linux inotify")
def test_kills_through_map_reduce_and_gate_then_resume_give_the_uninterrupted_run(tmp_path: Path) -> None:
    spec = tmp_path / "crash-steps.toml"
    spec.write_text(SPEC.format(n=N))
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "crashed"
    ref = _launch(spec, ref_dir, approve=True)
    out = run_dir / "outputs"
    out.mkdir(parents=True)
    watch = RenameWatch(out)
    rng = np.random.default_rng(SEED)
    moments: list[str] = []
    exits: list[int] = []
    try:
        # Through the map and the reduce, no decision given: a launch that gets to the gate stops there (7).
        for _ in range(KILLS):
            exits.append(_kill_once(spec, run_dir, rng, approve=False, watch=watch, moments=moments))
            if exits[-1] == 7:
                break
        if exits[-1] != 7:  # every kill came before the gate: the next launch must stop there
            exits.append(_kill_once(spec, run_dir, None, approve=False, watch=watch, moments=moments))
        assert exits[-1] == 7, f"the run never stopped at its gate: exits {exits}"
        # Approved from now on: kills through the gated step.
        for _ in range(WRITE_KILLS):
            exits.append(_kill_once(spec, run_dir, rng, approve=True, watch=watch, moments=moments))
        kills = sum(1 for c in exits if c == -signal.SIGKILL)
        assert kills >= KILLS // 2, f"only {kills} kills landed: exits {exits}"
        assert 0 < len(_outputs(out)) < N or exits[-WRITE_KILLS:].count(-signal.SIGKILL) < WRITE_KILLS, \
            "no kill landed inside the gated step"
        final = _launch(spec, run_dir, approve=True, report=tmp_path / "final.json")
        _, err = final.communicate(timeout=120)
        assert final.returncode == 0, err.decode()
        watch.poll()
    finally:
        watch.close()
    ref_err = ref.communicate(timeout=120)[1]
    assert ref.returncode == 0, ref_err.decode()

    assert_outputs_as_reference(out, ref_dir / "outputs", watch, N)
    temps = [p for p in run_dir.rglob(".*") if p.is_file() and p.name.endswith(".tmp")]
    assert temps == []

    with np.load(run_dir / "steps/stats/result.npz") as got, np.load(ref_dir / "steps/stats/result.npz") as want:
        assert int(got["count"]) == int(want["count"]) == N
        for name in ("mean", "var", "std"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0)
    ledger = json.loads((run_dir / "steps.json").read_text())
    assert set(ledger["finished"]) == {"prep", "stats", "write"}
    assert ledger["gates"]["write"]["decision"] == "approved"
    report = json.loads((tmp_path / "final.json").read_text())
    assert report["gate"]["decision"] == "approved" and report["gate"]["note"] == "checked"
    print(f"steps crash test: exits {exits} (moments {', '.join(moments)})")
