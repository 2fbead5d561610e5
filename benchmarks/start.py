"""Start-up: from launching ``warpdeck run SPEC --headless`` to its first batch done.

Each run launches ``python -m warpdeck.cli run SPEC --headless --json REPORT --run-dir DIR`` in a
subprocess on a small synthetic spec (``warpdeck.examples.dense:stage``, shape [512] float32,
2000 tasks, batch 64, NumPy backend). The spec's sink is ``callable`` ``_stages:first_write_stamp``,
which writes ``time.time()`` of its first call and of the end of its 64th call (the first batch's
last output) to a file. So, on the wall clock:

  first batch done   stamp(64th write) - t_launch   (t_launch: time.time() just before Popen)
  first output       stamp(1st write) - t_launch
  engine first batch report.first_batch_s (engine start -> first batch sunk, inside the process)
  pre-engine         first batch done - engine first batch: interpreter, imports, spec, CLI
  process wall       t_launch -> the process exited
  bare interpreter   ``python -c pass`` (the floor under everything above)

Target (DESIGN.md): first batch done <= 1 s. Median of 3 runs (1 with --quick).

    python benchmarks/start.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, verdict, write_json

TARGET_S = 1.0
BATCH = 64
HERE = Path(__file__).resolve().parent

SPEC = f"""\
name = "bench-start"
batch_size = {BATCH}
slot_depth = 2
lanes = 1
backend = "numpy"

[source]
kind = "synthetic"
count = 2000
shape = [512]
dtype = "float32"
seed = 0

[sink]
kind = "callable"
target = "_stages:first_write_stamp"

[[stages]]
fn = "warpdeck.examples.dense:stage"
"""


def _env(stamp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["WARPDECK_BENCH_STAMP"] = str(stamp)
    env["WARPDECK_BENCH_BATCH"] = str(BATCH)
    return env


def one_run(tmp: Path, i: int) -> dict[str, Any]:
    spec = tmp / "start.toml"
    spec.write_text(SPEC, encoding="utf-8")
    stamp, report = tmp / f"stamp{i}.txt", tmp / f"report{i}.json"
    cmd = [sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--json", str(report),
           "--run-dir", str(tmp / f"run{i}")]
    t_launch = time.time()
    proc = subprocess.run(cmd, env=_env(stamp), capture_output=True, text=True, check=False)
    t_exit = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"warpdeck run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    first, batch_done = (float(x) for x in stamp.read_text(encoding="utf-8").split())
    rep = json.loads(report.read_text(encoding="utf-8"))
    return {"first_batch_done_s": batch_done - t_launch, "first_output_s": first - t_launch,
            "engine_first_batch_s": rep["first_batch_s"], "pre_engine_s": batch_done - t_launch - rep["first_batch_s"],
            "process_wall_s": t_exit - t_launch, "tasks_done": rep["counts"]["done"]}


def bare_interpreter() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one run instead of three")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    runs = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="wd-bench-start-") as tmp:
        results = [one_run(Path(tmp), i) for i in range(runs)]
    bare = statistics.median(bare_interpreter() for _ in range(3))
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    spread = {k: (min(r[k] for r in results), max(r[k] for r in results)) for k in results[0]}

    def row(label: str, key: str, target: bool = False) -> list[str]:
        lo, hi = spread[key]
        return [label, f"{med[key] * 1e3:.0f} ms", f"{lo * 1e3:.0f}-{hi * 1e3:.0f} ms",
                f"<= {TARGET_S * 1e3:.0f} ms" if target else "", verdict(med[key] <= TARGET_S if target else None)]

    rows = [
        row("first batch done (launch -> 64th sink write)", "first_batch_done_s", target=True),
        row("first output (launch -> 1st sink write)", "first_output_s"),
        row("engine first batch (report.first_batch_s)", "engine_first_batch_s"),
        row("pre-engine (interpreter, imports, spec, CLI)", "pre_engine_s"),
        row("process wall (launch -> exit, 2000 tasks)", "process_wall_s"),
        ["bare interpreter (python -c pass)", f"{bare * 1e3:.0f} ms", "", "", verdict(None)],
    ]
    print_table(f"start: warpdeck run --headless, dense [512] x 2000 tasks, batch {BATCH}; median of {runs}",
                ["figure", "median", "min-max", "target", "result"], rows, right=[False, True, True, True, False])
    write_json(args.json, "start", {"runs": results, "median": med, "bare_interpreter_s": bare})
    return 0


if __name__ == "__main__":
    sys.exit(main())
