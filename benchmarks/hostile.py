"""Hostile traffic: a run's throughput while a separate process floods its topics, against the same run clean.

The same headless CLI run (``warpdeck run SPEC --headless --broker mqtt://...`` with a command
secret) of the dense example (``warpdeck.examples.dense:stage``: a 512 -> 256 dense layer and
softmax per task, batches of 256, one lane, NumPy backend, one ``.npy`` output per task), on a
fresh Mosquitto on a free loopback port, three ways, in ``--rounds`` rounds (forwards, then
backwards, so a drift in the machine's load falls on all three alike; default 3 rounds of 24 000
tasks, about 2 minutes on 2 cores), after a short warm-up run:

  clean     nothing else on the broker
  aside     the flood sends to another pipeline's topics: the machine and the broker are shared
            as in the flooded run, but the engine hears none of it
  flooded   the flood sends to the engine's own topics

The engine is its own process; so is the flood (``_hostile_flood.py``), which publishes ``--rate``
messages a second (default 5 000) of mixed hostile traffic on every topic the engine subscribes to
(``cmd`` and each worker's ``birth``, ``hb``, ``death``): unsigned commands, commands with made-up
signatures or signed with another secret, malformed JSON, wrong kinds and schema versions,
out-of-range fields, JSON nested 3 000 deep and oversized payloads (20 KB commands, 70 KB
heartbeats); QoS 1 where the engine subscribes at QoS 1.

Figures:
  tasks/s             tasks done over the runs' elapsed time (the reports'), each way, all rounds
  ratio               flooded / clean, against the bound (>= 0.8: issue 20); flooded / aside is the
                      engine's own cost of reading and refusing, aside / clean the machine's sharing
  flood rate          messages the flood sent per second while the engine ran
  CPU                 the flood process's own (user + system, all its threads, over its send time),
                      Mosquitto's and the engine process's, in % of one core; and the engine's CPU
                      per task, which other work on the machine moves far less than tasks/s
  counted             refusals and drops the engine counted (its report), over messages sent
  events              the refusal and drop events the engine published in the flooded runs, the
                      shortest time between two of one reason (bound: 1 s; each reason's last,
                      told when the engine stops, left out), and their counts added up against
                      what the reports counted (bound: at least as many; the plane counts on
                      between the report and its stop, and tells those too)
  input lag,          the worst input lag the plane measured, and workers convicted in each run
  convicted
  pending publishes   aiomqtt's "pending publish calls" warnings in the engine's stderr (bound: 0)
  load average        the machine's, before and after: read the figures beside it

On a small machine the flood's own CPU and the broker's are taken from the engine as well: the
aside run says how much.

    python benchmarks/hostile.py [--quick] [--tasks N] [--rounds N] [--rate 5000] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, verdict, write_json
from _hb_procs import HERE, JsonChild, Mosquitto, process_cpu_s
from _hostile_flood import SUMMARISED

RATIO_BOUND = 0.8
RATE = 5000.0
GAP_BOUND_S = 1.0
SECRET = "hostile-benchmark-secret-0123456789"
PIPELINE = "hostile"
ELSEWHERE = "elsewhere"
"""Where the "aside" run's flood goes: the same broker, topics the engine never hears."""
KINDS = ("clean", "aside", "flooded")
SPEC = """
name = "{name}"
batch_size = 256
slot_depth = 2
lanes = 1
backend = "numpy"

[source]
kind = "synthetic"
count = {count}
shape = [512]
dtype = "float32"
seed = 0

[sink]
kind = "npy_dir"
path = "outputs"

[[stages]]
fn = "warpdeck.examples.dense:stage"
"""


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_engine(workdir: Path, broker: Mosquitto, count: int, tag: str) -> dict[str, Any]:
    """One headless CLI run to the end; its report, wall time, the engine's and Mosquitto's CPU over
    it, and the warnings on its stderr."""
    run_dir = workdir / f"run-{tag}"
    spec = workdir / f"{tag}.toml"
    spec.write_text(SPEC.format(name=PIPELINE, count=count), encoding="utf-8")
    secret = workdir / "secret"
    secret.write_text(SECRET, encoding="utf-8")
    report_path = workdir / f"report-{tag}.json"
    argv = [sys.executable, "-m", "warpdeck.cli", "run", str(spec), "--headless", "--json", str(report_path),
            "--broker", broker.url, "--run-dir", str(run_dir), "--secret-file", str(secret)]
    cpu0, b0, t0 = _children_cpu_s(), broker.cpu_s(), time.perf_counter()
    # Reaped by run() before any other child of ours ends: the children's CPU delta is the engine's.
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall, cpu, broker_cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0, broker.cpu_s() - b0
    if proc.returncode != 0 or not report_path.exists():
        raise RuntimeError(f"the {tag} run exited with {proc.returncode}: {proc.stderr[-3000:]}")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    if report["counts"]["done"] != count:
        raise RuntimeError(f"the {tag} run did not finish every task: {report['counts']}")
    shutil.rmtree(run_dir, ignore_errors=True)  # 1 KB per task: do not keep them
    return {"report": report, "wall_s": wall, "engine_cpu_s": cpu, "broker_cpu_s": broker_cpu,
            "pending_publish_warnings": proc.stderr.count("pending publish calls"),
            "stderr_tail": proc.stderr[-2000:]}


def run_flooded(workdir: Path, broker: Mosquitto, count: int, rate: float, target: str, tag: str
                ) -> dict[str, Any]:
    """The run while the flood sends ``rate`` messages a second to ``target``'s topics: the run's
    figures, with the flood's own (``flood``; its CPU from ``/proc`` too, over the run)."""
    flood = JsonChild([str(HERE / "_hostile_flood.py"), "--port", str(broker.port), "--pipeline", target,
                       "--rate", str(rate)])
    try:
        pid = int(flood.expect("ready", 30)["pid"])
        f0 = process_cpu_s(pid)
        run = run_engine(workdir, broker, count, tag)
        flood_cpu = process_cpu_s(pid) - f0
    finally:
        stats = flood.finish("sent", 30)
    if stats is None:
        raise RuntimeError(f"the flood did not report: {flood.stderr_tail}")
    stats["proc_cpu_s_during_run"] = flood_cpu
    run["flood"] = stats
    return run


def measure(count: int, rate: float, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` of the three runs, in turn forwards and backwards (so a drift in the machine's load
    falls on all three alike), after a warm-up run."""
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="wd-hostile-") as tmp:
        workdir = Path(tmp)
        broker = Mosquitto(workdir)
        try:
            run_engine(workdir, broker, max(count // 10, 2560), "warmup")  # imports, caches, the disk
            for i in range(rounds):
                for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                    tag = f"{kind}-{i}"
                    if kind == "clean":
                        runs[kind].append(run_engine(workdir, broker, count, tag))
                    else:
                        target = PIPELINE if kind == "flooded" else ELSEWHERE
                        runs[kind].append(run_flooded(workdir, broker, count, rate, target, tag))
        finally:
            broker.close()
    return runs


def _control(run: dict[str, Any]) -> dict[str, Any]:
    return run["report"].get("control") or {}


def _tasks_s(runs: list[dict[str, Any]]) -> float:
    """Tasks done over the runs' elapsed time, all rounds together."""
    return sum(r["report"]["counts"]["done"] for r in runs) / sum(r["report"]["elapsed_s"] for r in runs)


def _core_pct(runs: list[dict[str, Any]], key: str) -> float:
    return 100 * sum(r[key] for r in runs) / sum(r["wall_s"] for r in runs)


def _load_average() -> float:
    """The machine's 1-minute load average: other work on it moves every figure here."""
    return os.getloadavg()[0]


def _cpu_us_per_task(runs: list[dict[str, Any]]) -> float:
    return 1e6 * sum(r["engine_cpu_s"] for r in runs) / sum(r["report"]["counts"]["done"] for r in runs)


def _shortest_gap_s(times: dict[str, list[float]]) -> float | None:
    """The shortest time between two events of one reason, each reason's last event left out (the
    engine tells what is left at once when it stops)."""
    gaps = [b - a for ts in times.values() for a, b in itertools.pairwise(sorted(ts)[:-1])]
    return min(gaps) if gaps else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one round of 12 000 tasks per run, not three of 24 000")
    ap.add_argument("--tasks", type=int, help="tasks per run (overrides --quick)")
    ap.add_argument("--rounds", type=int, help="rounds of the three runs (overrides --quick)")
    ap.add_argument("--rate", type=float, default=RATE, help="flood messages per second")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    count = args.tasks or (12_000 if args.quick else 24_000)
    rounds = args.rounds or (1 if args.quick else 3)
    load0 = _load_average()
    runs = measure(count, args.rate, rounds)
    load1 = _load_average()
    flooded = runs["flooded"]

    tps = {kind: _tasks_s(rs) for kind, rs in runs.items()}
    ratio = tps["flooded"] / tps["clean"]
    floods = [r["flood"] for r in flooded]
    sent, send_s = sum(f["sent"] for f in floods), sum(f["seconds"] for f in floods)
    flood_core = sum(f["cpu_s"] for f in floods) / send_s
    ctls = [_control(r) for r in flooded]
    counted = sum(sum(c.get("commands_refused", {}).values()) + sum(c.get("dropped", {}).values()) for c in ctls)
    told = sum(sum(f["told_by_key"].values()) for f in floods)
    summaries = sum(n for f in floods for k, n in f["events_by_key"].items() if k.startswith(SUMMARISED))
    gaps = [g for f in floods if (g := _shortest_gap_s(f["times_by_key"])) is not None]
    gap = min(gaps) if gaps else None
    run_s = sum(r["report"]["elapsed_s"] for r in flooded)
    lost = {kind: sum(len(_control(r).get("workers_lost", [])) for r in rs) for kind, rs in runs.items()}
    warnings = sum(r["pending_publish_warnings"] for rs in runs.values() for r in rs)
    worst_lag = max(c.get("worst_input_lag_s", 0.0) for c in ctls)
    figures = {"tasks_s": tps, "ratio": ratio, "aside_ratio": tps["aside"] / tps["clean"],
               "flood_msgs_s": sent / send_s, "flood_cpu_core": flood_core, "counted": counted, "told": told,
               "summary_events": summaries, "shortest_gap_s": gap,
               "workers_lost": lost, "pending_publish_warnings": warnings, "worst_input_lag_s": worst_lag,
               "engine_cpu_us_per_task": {k: _cpu_us_per_task(runs[k]) for k in KINDS},
               "load_average": [load0, load1]}

    def each(key: str) -> str:
        return " / ".join(f"{_core_pct(runs[k], key):.0f} %" for k in KINDS)

    rows: list[list[Any]] = [
        ["clean: tasks/s", f"{tps['clean']:,.0f}", "", verdict(None)],
        ["aside (flood on another pipeline): tasks/s", f"{tps['aside']:,.0f}  ({tps['aside'] / tps['clean']:.3f})",
         "", verdict(None)],
        ["flooded: tasks/s", f"{tps['flooded']:,.0f}", "", verdict(None)],
        ["flooded / clean", f"{ratio:.3f}", f">= {RATIO_BOUND}", verdict(ratio >= RATIO_BOUND)],
        ["flooded / aside (the engine's own cost)", f"{tps['flooded'] / tps['aside']:.3f}", "", verdict(None)],
        ["flood rate (msg/s)", f"{sent / send_s:,.0f}", f">= {0.95 * args.rate:,.0f}",
         verdict(sent / send_s >= 0.95 * args.rate)],
        ["flood process CPU (of one core)", f"{100 * flood_core:.0f} %", "", verdict(None)],
        ["Mosquitto CPU: clean / aside / flooded", each("broker_cpu_s"), "", verdict(None)],
        ["engine process CPU: clean / aside / flooded", each("engine_cpu_s"), "", verdict(None)],
        ["engine CPU per task: clean / aside / flooded",
         " / ".join(f"{_cpu_us_per_task(runs[k]):.0f} us" for k in KINDS), "", verdict(None)],
        ["refused + dropped, counted by the engine", f"{counted:,} of {sent:,} sent", "", verdict(None)],
        ["refusal and drop events", f"{summaries:,} in {run_s:.0f} s ({summaries / run_s:.1f}/s)", "",
         verdict(None)],
        ["  shortest time between two of one reason", "n/a" if gap is None else f"{gap:.3f} s",
         f">= {GAP_BOUND_S:g} s", verdict(gap is None or gap >= GAP_BOUND_S * 0.99)],
        ["  their counts added up, against the reports' count", f"{told:,} / {counted:,}", ">= counted",
         verdict(told >= counted)],
        ["worst input lag (flooded)", f"{worst_lag:.2f} s", "", verdict(None)],
        ["workers convicted: clean / aside / flooded", " / ".join(str(lost[k]) for k in KINDS), "", verdict(None)],
        ["'pending publish calls' warnings", warnings, "0", verdict(warnings == 0)],
        ["machine load average (1 min): start / end", f"{load0:.2f} / {load1:.2f}", "", verdict(None)],
    ]
    print_table(f"hostile: {rounds} x {count:,} dense tasks per run; flood {args.rate:,.0f} msg/s; Mosquitto; "
                f"{os.cpu_count()} CPUs", ["figure", "measured", "bound", "result"], rows,
                right=[False, True, True, False])
    for rs in runs.values():
        for r in rs:
            r.pop("stderr_tail", None)
    write_json(args.json, "hostile", {"tasks": count, "rounds": rounds, "rate": args.rate, "figures": figures,
                                      "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
