"""Heartbeats: the monitor's cost and its verdicts with 100 and 1 000 workers at 2 Hz through Mosquitto.

For each population (``--workers``, default 100 and 1 000) the script starts a fresh Mosquitto on a
free loopback port, a real engine with its control plane on it (``_hb_monitor.py``: the monitor is
the plane's ``warpdeck-control`` thread), and the simulated workers (``_hb_sim.py``: ``--sim-procs``
processes of raw paho clients, one connection, Will, retained birth and 0.5 s heartbeats per worker,
phases spread uniformly). Then, in one run:

  monitor CPU        CPU time of the control thread over ``--cpu-s`` s of steady load, in % of one
                     core (``/proc/PID/task/TID/schedstat``); the engine's loop thread (it merges the
                     monitor's views into each 10 Hz snapshot) and the whole process beside it
  floor              a bare aiomqtt subscriber to the same topics (``_hb_floor.py``) over ``--floor-s``:
                     what the MQTT client alone costs the monitor per message
  killed             real worker processes (``python -m warpdeck.engine.control.heartbeat``) SIGKILLed:
                     from the kill to the monitor's dead verdict (its Verdict.at, CLOCK_MONOTONIC)
  frozen             the same, SIGSTOPped: only the phi-accrual detector or the backstop can tell
  false convictions  dead verdicts for any worker that was neither killed nor frozen (then or yet),
                     the simulated ones and the engine's own included

and, on the largest population, a soak (``--soak-s``): one busy loop per core saturates the CPUs
while the workers heartbeat and more kill and freeze trials run; it counts false convictions again.
Then the broker-restart case (``_hb_restart.py``, ``--restart-down``): Mosquitto stopped by SIGTERM
and by SIGKILL, down 1, 2 and 5 s, started again on its port; false convictions, and the time from
the restart until every worker's heartbeats and the engine's telemetry are back.

Targets (DESIGN.md section 9): monitor <= 10 % of a core at 1 000 x 2 Hz; killed p99 <= 0.5 s; frozen
p99 <= 3 s; 0 false convictions over 10 minutes of load (the default soak is shorter: the bound says
how long it ran; ``--soak-s 600`` runs the whole target); broker restart: 0 convicted, all back <= 5 s.

    python benchmarks/heartbeats.py [--quick] [--workers 100,1000] [--soak-s 60] [--restart-down 1,2,5]
                                    [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import print_table, verdict, write_json
from _hb_procs import Hogs, JsonChild, Monitor, Mosquitto, TrialWorker, process_cpu_s, raise_open_files
from _hb_restart import restart_rows, run_restarts

CPU_TARGET = 0.10  # of one core, at 1 000 workers x 2 Hz
CPU_TARGET_AT = 1000
KILLED_P99_S = 0.5
FROZEN_P99_S = 3.0
SOAK_TARGET_S = 600.0
INTERVAL_S = 0.5
WARMUP_S = 3.0  # a trial worker heartbeats this long before it is killed or frozen
DETECT_LIMIT_S = 10.0  # a trial not convicted this long after its action counts as undetected
SIM = "sim"


def pctl(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (with 30 samples p99 is the largest)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else math.nan


@dataclass(frozen=True, slots=True)
class Trial:
    """One killed or frozen worker: when we acted, and when the monitor convicted it (None: never
    within DETECT_LIMIT_S), with the verdict's reason (will, silent)."""

    worker_id: str
    how: str
    acted: float
    convicted: float | None
    reason: str

    @property
    def latency_s(self) -> float | None:
        return None if self.convicted is None else self.convicted - self.acted


@dataclass(slots=True)
class Population:
    """A broker, the monitor and ``n`` simulated workers; what they did is collected here."""

    n: int
    procs: int
    workdir: Path
    pipeline: str = "bench-hb"
    acted: dict[str, float] = field(default_factory=dict)
    """Trial worker id -> when we killed or froze it (or stopped it when the batch ended)."""
    trials: list[Trial] = field(default_factory=list)
    windows: list[list[float]] = field(default_factory=list)
    """The simulators' report lines: [now, max late s, sent, disconnects so far, process] per 5 s."""
    broker: Mosquitto = field(init=False)
    monitor: Monitor = field(init=False)
    sims: list[JsonChild] = field(init=False, default_factory=list)
    counters: dict[str, Any] = field(init=False, default_factory=dict)
    """The monitor's own counters (missed heartbeats, drops, reconnects), read as it stops."""
    sim_stats: list[dict[str, Any]] = field(init=False, default_factory=list)
    _next: int = 0

    def __enter__(self) -> Population:
        try:
            self._start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _start(self) -> None:
        self.broker = Mosquitto(self.workdir)
        self.monitor = Monitor(self.broker.port, self.pipeline)
        for k in range(self.procs):
            self.sims.append(JsonChild(
                [str(Path(__file__).with_name("_hb_sim.py")), "--port", str(self.broker.port), "--pipeline",
                 self.pipeline, "--prefix", SIM, "--total", str(self.n), "--first", str(k), "--step",
                 str(self.procs), "--interval", str(INTERVAL_S)], functools.partial(self._sim_line, k)))
        for s in self.sims:
            s.expect("ready", 120)
        want = self.n + 1  # the simulated workers and the engine's own
        if not self.monitor.log.wait(lambda: self.monitor.log.online >= want, 60):
            raise RuntimeError(f"the monitor hears {self.monitor.log.online} of {want} workers online")

    def _close(self) -> None:
        """The monitor first (its counters; verdicts after this are not judged), then the
        simulators (their Wills go to nobody), then the broker."""
        monitor: Monitor | None = getattr(self, "monitor", None)
        broker: Mosquitto | None = getattr(self, "broker", None)
        if monitor is not None:
            self.counters = (monitor.finish("counters") or {}).get("counters", {})
        self.sim_stats = [(s.finish("stats") or {}).get("stats", {}) for s in self.sims]
        if broker is not None:
            broker.close()

    def _sim_line(self, k: int, doc: dict[str, Any]) -> bool:
        if "w" in doc:
            self.windows.append([*doc["w"], k])
            return True
        return False

    # -- figures ---------------------------------------------------------------------------------
    def cpu_window(self, seconds: float) -> dict[str, float]:
        """CPU shares (of one core) over ``seconds`` of steady heartbeats, nothing else going on."""
        others = [self.broker.proc.pid, *(s.pid for s in self.sims)]
        m0, o0, t0 = self.monitor.cpu(), [process_cpu_s(p) for p in others], time.monotonic()
        time.sleep(seconds)
        m1, o1, t1 = self.monitor.cpu(), [process_cpu_s(p) for p in others], time.monotonic()
        wall = t1 - t0
        out = {f"{k}_share": (m1[k] - m0[k]) / wall for k in m0}
        out["broker_share"] = (o1[0] - o0[0]) / wall
        out["sims_share"] = sum(b - a for a, b in zip(o0[1:], o1[1:], strict=True)) / wall
        out["control_us_per_hb"] = (m1["control"] - m0["control"]) / (wall * self.n / INTERVAL_S) * 1e6
        out["wall_s"] = wall
        return out

    def floor_window(self, seconds: float) -> dict[str, float]:
        """A bare aiomqtt subscriber to the same topics (``_hb_floor.py``): its CPU share over
        ``seconds``, beside the monitor that keeps running."""
        sub = JsonChild([str(Path(__file__).with_name("_hb_floor.py")), "--port", str(self.broker.port),
                         "--pipeline", self.pipeline])
        try:
            sub.expect("ready", 60)
            time.sleep(1.0)  # retained births are through
            c0, t0 = process_cpu_s(sub.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = process_cpu_s(sub.pid), time.monotonic()
        finally:
            sub.finish("msgs")
        return {"share": (c1 - c0) / (t1 - t0), "us_per_hb": (c1 - c0) / ((t1 - t0) * self.n / INTERVAL_S) * 1e6}

    def trial_batch(self, kinds: list[str], rng: random.Random) -> list[Trial]:
        """Start one real worker process per kind, let them heartbeat WARMUP_S, then kill or freeze
        them one by one at random gaps (so actions land at every phase of their heartbeats), and
        wait for the verdicts."""
        workers = []
        for _ in kinds:
            self._next += 1
            workers.append(TrialWorker(self.broker.url, f"trial-{self._next:04d}", self.pipeline))
        done: list[Trial] = []
        try:
            ready = [w.ready() for w in workers]
            time.sleep(WARMUP_S)
            acted: list[tuple[TrialWorker, str, float]] = []
            for w, how, ok in zip(workers, kinds, ready, strict=True):
                if not ok:
                    continue
                time.sleep(rng.uniform(0.2, 0.6))
                t = time.monotonic()
                w.signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
                self.acted[w.worker_id] = t
                acted.append((w, how, t))
            log = self.monitor.log
            want = {(w.worker_id, w.epoch) for w, _, _ in acted}

            def convicted() -> dict[tuple[str, int], tuple[float, str]]:
                return {(v[0], v[1]): (v[4], v[3]) for v in log.dead() if (v[0], v[1]) in want}

            last = max((t for _, _, t in acted), default=time.monotonic())
            log.wait(lambda: len(convicted()) == len(want), max(0.0, last + DETECT_LIMIT_S - time.monotonic()))
            got = convicted()
            for w, how, t in acted:
                at, reason = got.get((w.worker_id, w.epoch), (None, ""))
                if at is not None and at < t:
                    continue  # convicted before we acted: no trial, and counted as a false conviction
                done.append(Trial(w.worker_id, how, t, at if at is not None and at <= t + DETECT_LIMIT_S else None,
                                  reason))
        finally:
            now = time.monotonic()
            for w in workers:
                self.acted.setdefault(w.worker_id, now)  # ended by us, not judged: its Will is no false alarm
                w.close()
        self.trials.extend(done)
        return done

    def run_trials(self, per_kind: int, batch: int, rng: random.Random, until: float | None = None) -> list[Trial]:
        """``per_kind`` killed and frozen trials in batches of ``batch`` (half of each), or batches
        until the monotonic time ``until``."""
        out: list[Trial] = []
        left = {"killed": per_kind, "frozen": per_kind}
        while (until is None and any(left.values())) or (until is not None and time.monotonic() < until):
            kinds: list[str] = []
            for how in ("killed", "frozen"):
                k = batch // 2 if until is not None else min(left[how], batch // 2)
                kinds += [how] * k
                left[how] -= k
            rng.shuffle(kinds)
            out += self.trial_batch(kinds, rng)
        return out

    def false_convictions(self, t0: float = -math.inf, t1: float = math.inf) -> list[tuple[str, int, str, str, float]]:
        """Dead verdicts in [t0, t1] for a worker we never touched, or from before we touched it."""
        return [v for v in self.monitor.log.dead() if t0 <= v[4] <= t1 and v[4] < self.acted.get(v[0], math.inf)]

    def sims_late_max(self, t0: float, t1: float) -> tuple[float, int]:
        """The latest any simulated heartbeat left in [t0, t1], and the simulators' disconnects by t1."""
        inside = [w for w in self.windows if t0 <= w[0] <= t1 + 5.0]
        disc = sum(max((int(w[3]) for w in self.windows if w[4] == k and w[0] <= t1 + 5.0), default=0)
                   for k in range(self.procs))
        return max((w[1] for w in inside), default=0.0), disc


def false_rows(label: str, false: list[Any], ran_s: float, bound: str, pop: Population) -> list[list[Any]]:
    """The false-conviction row, and when there were any, a row saying when: in how many bursts
    (verdicts less than 3 s apart) over how long, how late the simulated heartbeats left just before
    (on time: the monitor, not the workers, fell behind), and whether the engine's own in-process
    worker was convicted too (then the monitor was certainly the one behind)."""
    rows = [[label, f"{len(false)} in {ran_s:.0f} s", bound, verdict(not false)]]
    if false:
        ats = sorted(v[4] for v in false)
        bursts = 1 + sum(1 for a, b in itertools.pairwise(ats) if b - a > 3.0)
        late, _ = pop.sims_late_max(ats[0] - 5.0, ats[-1])
        own = "; own worker too" if any(v[0] == pop.monitor.worker_id for v in false) else ""
        when = f"{bursts} burst(s) over {ats[-1] - ats[0]:.1f} s; sims sent <= {late * 1e3:.0f} ms late{own}"
        rows.append(["  when", when, "", verdict(None)])
    return rows


def latency_row(label: str, trials: list[Trial], bound: float) -> list[Any]:
    lat = [t.latency_s for t in trials if t.latency_s is not None]
    miss = len(trials) - len(lat)
    if not trials:
        return [label, "no trials", f"p99 <= {bound:g} s", verdict(None)]
    p50, p99, mx = pctl(lat, 0.5), pctl(lat, 0.99), max(lat, default=math.nan)
    text = f"{p50:.3f} / {p99:.3f} / {mx:.3f} s (n={len(trials)})"
    if miss:
        text += f", {miss} undetected"
    return [label, text, f"p99 <= {bound:g} s", verdict(miss == 0 and p99 <= bound)]


def summary(trials: list[Trial]) -> dict[str, Any]:
    lat = [t.latency_s for t in trials if t.latency_s is not None]
    return {"n": len(trials), "undetected": len(trials) - len(lat), "p50_s": pctl(lat, 0.5),
            "p99_s": pctl(lat, 0.99), "max_s": max(lat, default=math.nan),
            "reasons": sorted({t.reason for t in trials}), "latencies_s": lat}


def run_soak(pop: Population, args: argparse.Namespace, rng: random.Random, soak_s: float) -> dict[str, Any]:
    """``soak_s`` seconds with one busy loop per core, kill and freeze trials going on (unless
    ``--no-soak-trials``); false convictions are counted from its start to 3 s after its end."""
    hogs = Hogs(args.hogs)
    try:
        s0 = time.monotonic()
        cpu0 = pop.monitor.cpu()["control"]
        trials = pop.run_trials(0, args.batch, rng, until=s0 + soak_s) if args.soak_trials else []
        time.sleep(max(0.0, s0 + soak_s - time.monotonic()))
        s1 = time.monotonic()
        cpu = (pop.monitor.cpu()["control"] - cpu0) / (s1 - s0)
    finally:
        hogs.close()
    time.sleep(DETECT_LIMIT_S / 2)  # a conviction for silence during the soak comes at most this late
    late, disc = pop.sims_late_max(s0, s1)
    return {"seconds": s1 - s0, "hogs": args.hogs, "false": [list(v) for v in pop.false_convictions(s0, s1 + 3.0)],
            "control_share": cpu, "sims_late_max_s": late, "sims_disconnects": disc,
            "killed": [t for t in trials if t.how == "killed"], "frozen": [t for t in trials if t.how == "frozen"]}


def run_population(n: int, args: argparse.Namespace, workdir: Path, rng: random.Random, soak_s: float,
                   rows: list[list[Any]], figures: dict[str, Any], downs: list[float]) -> None:
    """One population: CPU window, trials, the soak when ``soak_s`` and a broker restart for each
    of ``downs``; its rows and figures."""
    tag = f"{n:,} workers".replace(",", " ")
    with Population(n, args.sim_procs, workdir) as pop:
        t_start = time.monotonic()
        time.sleep(2.0)  # the births' burst is over
        cpu = pop.cpu_window(args.cpu_s)
        floor = pop.floor_window(args.floor_s) if args.floor_s > 0 else {}
        trials = pop.run_trials(args.trials, args.batch, rng)
        t_trials = time.monotonic()
        false = pop.false_convictions(t_start, t_trials)
        late, disc = pop.sims_late_max(t_start, t_trials)
        soak = run_soak(pop, args, rng, soak_s) if soak_s > 0 else {}
        restarts = run_restarts(pop, downs)
    killed = [t for t in trials if t.how == "killed"]
    frozen = [t for t in trials if t.how == "frozen"]
    bound = f"<= {CPU_TARGET:.0%} of a core" if n >= CPU_TARGET_AT else ""
    rows += [
        [f"{tag}: monitor (control thread) CPU", f"{cpu['control_share']:.1%} of a core",
         bound, verdict(cpu["control_share"] <= CPU_TARGET if bound else None)],
        [f"{tag}: control thread per heartbeat", f"{cpu['control_us_per_hb']:.0f} us", "", verdict(None)],
        *([[f"{tag}: bare aiomqtt subscriber (plane's read path)", f"{floor['share']:.1%} of a core, "
            f"{floor['us_per_hb']:.0f} us/hb", "", verdict(None)]] if floor else []),
        [f"{tag}: engine loop thread / whole monitor process CPU",
         f"{cpu['engine_loop_share']:.1%} / {cpu['process_share']:.1%}", "", verdict(None)],
        [f"{tag}: mosquitto / simulators CPU", f"{cpu['broker_share']:.1%} / {cpu['sims_share']:.1%}", "",
         verdict(None)],
        latency_row(f"{tag}: killed -> dead, p50 / p99 / max", killed, KILLED_P99_S),
        latency_row(f"{tag}: frozen -> dead, p50 / p99 / max", frozen, FROZEN_P99_S),
        *false_rows(f"{tag}: false convictions", false, t_trials - t_start, "0", pop),
        [f"{tag}: simulated heartbeats, latest", f"{late * 1e3:.0f} ms late, {disc} disconnects", "",
         verdict(None)],
    ]
    if soak:
        ran = soak["seconds"]
        rows += [
            *false_rows(f"{tag} + {args.hogs} busy loops: false convictions", soak["false"], ran,
                        f"0 over {SOAK_TARGET_S:.0f} s (ran {ran:.0f} s)", pop),
            latency_row(f"{tag} + busy loops: killed -> dead", soak["killed"], KILLED_P99_S),
            latency_row(f"{tag} + busy loops: frozen -> dead", soak["frozen"], FROZEN_P99_S),
            [f"{tag} + busy loops: monitor (control thread) CPU", f"{soak['control_share']:.1%} of a core", "",
             verdict(None)],
            [f"{tag} + busy loops: simulated heartbeats, latest",
             f"{soak['sims_late_max_s'] * 1e3:.0f} ms late, {soak['sims_disconnects']} disconnects", "",
             verdict(None)],
        ]
        soak["killed"], soak["frozen"] = summary(soak["killed"]), summary(soak["frozen"])
    rows += restart_rows(tag, restarts)
    c = pop.counters
    rows.append([f"{tag}: the monitor counted", f"missed hb {c.get('missed_heartbeats', '?')}, dropped "
                 f"{sum(c.get('dropped', {}).values())}, reconnects {c.get('reconnects', '?')}", "", verdict(None)])
    figures[str(n)] = {"cpu": cpu, "floor": floor, "killed": summary(killed), "frozen": summary(frozen),
                       "false_convictions": [list(v) for v in false], "soak": soak, "monitor_counters": c,
                       "sims": pop.sim_stats, "sim_windows": pop.windows, "trials": [asdict(t) for t in pop.trials],
                       "restarts": [asdict(r) for r in restarts]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="100 workers only, 10 s CPU window, 4 trials of each kind, a 15 s soak, restarts down 1 s")
    ap.add_argument("--workers", help="populations, comma-separated (default 100,1000)")
    ap.add_argument("--cpu-s", type=float, help="CPU window per population (default 30 s)")
    ap.add_argument("--floor-s", type=float,
                    help="window for the bare-subscriber floor per population (default 15 s; 0: none)")
    ap.add_argument("--trials", type=int, help="killed and frozen trials each, per population (default 30)")
    ap.add_argument("--batch", type=int, default=10, help="trial worker processes at a time (default 10)")
    ap.add_argument("--soak-s", type=float, help="soak on the largest population (default 60 s; target 600)")
    ap.add_argument("--no-soak-trials", dest="soak_trials", action="store_false",
                    help="no kill and freeze trials during the soak")
    ap.add_argument("--hogs", type=int, help="busy-loop processes during the soak (default: one per core)")
    ap.add_argument("--restart-down", metavar="S,S,...", help="broker restarts on the largest population, each "
                    "by SIGTERM and by SIGKILL: seconds down (default 1,2,5; --quick 1; '': none)")
    ap.add_argument("--sim-procs", type=int, default=2, help="simulator processes (default 2)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    q = args.quick
    pops = [int(x) for x in (args.workers or ("100" if q else "100,1000")).split(",")]
    args.cpu_s = args.cpu_s or (10.0 if q else 30.0)
    args.floor_s = args.floor_s if args.floor_s is not None else (5.0 if q else 15.0)
    args.trials = args.trials if args.trials is not None else (4 if q else 30)
    soak_s = args.soak_s if args.soak_s is not None else (15.0 if q else 60.0)
    down = args.restart_down if args.restart_down is not None else ("1" if q else "1,2,5")
    downs = [float(x) for x in down.split(",") if x.strip()]
    args.hogs = args.hogs or _cores()
    raise_open_files(4 * max(pops) + 1024)  # a socket per worker in the broker, the simulators and paho's
    rng = random.Random(args.seed)
    commit = _engine_commit()
    rows: list[list[Any]] = []
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wd-bench-hb-") as d:
        for n in pops:
            last = n == max(pops)
            run_population(n, args, Path(d), rng, soak_s if last else 0.0, rows, figures, downs if last else [])
    end_commit = _engine_commit()
    if end_commit != commit:
        commit = f"{commit}..{end_commit}"
    print_table(f"heartbeats: {', '.join(map(str, pops))} simulated workers at {1 / INTERVAL_S:g} Hz through "
                f"Mosquitto, {args.trials} killed and {args.trials} frozen real workers per population, "
                f"{_cores()} CPUs, engine at {commit}", ["figure", "measured", "bound", "result"], rows,
                right=[False, True, True, False])
    write_json(args.json, "heartbeats", {"engine_commit": commit, "populations": pops, "interval_s": INTERVAL_S,
                                         "cpu_s": args.cpu_s, "trials": args.trials, "soak_s": soak_s,
                                         "restart_down_s": downs,
                                         "hogs": args.hogs, "results": figures})
    return 0


def _engine_commit() -> str:
    """The commit the engine ran at, ``+dirty`` when ``engine/`` has uncommitted changes: figures of a
    monitor that others are changing are only comparable at the same commit."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "engine"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _cores() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
