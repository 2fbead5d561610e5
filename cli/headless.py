"""The headless display: a rich progress view per phase while the engine runs, then a summary.

It reads only snapshots and the final report (the engine never imports rich). SIGINT and SIGTERM
stop the run the way quitting the control room does: the engine stops, its report (status
"stopped") is written and summarised, and the same command resumes it. A second signal is not
caught: it interrupts the stopping itself. A worker lost, back, waiting for room or gone prints one
line as it happens (cli/worker_lines.py), and a worker still waiting at the end is in the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from warpdeck.cli.worker_lines import WorkerLines
from warpdeck.engine.api import (
    UNAUTHENTICATED,
    ControlSettings,
    Engine,
    EngineSnapshot,
    Exports,
    ExportSettings,
    OutageView,
    PipelineSpec,
    RunReport,
    exporting,
    more_lanes_words,
)

__all__ = ["drive", "render_snapshot", "run_headless", "signalled", "stop_signals", "summary_table"]

_PHASES = ("fill", "h2d", "compute", "d2h", "sink")
_SHOWN_FAILURES = 10


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else 0
    return "█" * filled + "░" * (width - filled)


def render_snapshot(snap: EngineSnapshot) -> Group:
    """One frame of the live view: progress, tasks per phase, lanes, figures."""
    c = snap.counts
    total = c.out_of
    f = snap.figures
    head = Text.assemble(
        (f"{snap.pipeline} ", "bold"), (f"[{snap.status}] ", "cyan"), f"{snap.backend} on {snap.device}  ",
        f"{_bar(c.finished_all, total)} {c.finished_all}/{total}  ", (f"{f.recent_tasks_s:,.0f} tasks/s", "green"),
    )
    phases = Table.grid(padding=(0, 2))
    for _ in range(len(_PHASES) + 4):
        phases.add_column(justify="right")
    phases.add_row(*(Text(n, style="dim") for n in ("queued", *_PHASES, "stalled", "done", "failed")))
    phases.add_row(str(c.queued), *(str(c.running[p]) for p in _PHASES), str(sum(c.stalled.values())),
                   str(c.done), Text(str(c.failed), style="red" if c.failed else ""))
    lanes = Text("  ".join(f"lane {ln.id}: k={ln.depth} fill x{ln.fill_workers} sink x{ln.sink_workers} "
                           f"{ln.status}" for ln in snap.lanes), style="dim")
    figs = Text(f"device busy {f.device_busy:.0%}   "
                f"overlap {f.overlap_efficiency:.2f} of bound {f.bound_tasks_s:,.0f}/s   "
                f"p50 {f.latency_p50_s * 1e3:.1f} ms  p99 {f.latency_p99_s * 1e3:.1f} ms   "
                f"feeder {snap.feeder.state} {snap.feeder.ready}/{snap.feeder.high}", style="dim")
    parts: list[Text | Table] = [head, phases, lanes, figs]
    if f.bottleneck:
        parts.append(Text(f.bottleneck, style="yellow" if f.device_busy < _BUSY_OK else "dim"))
    return Group(*parts)


_BUSY_OK = 0.9
"""Device busy at or above this shows the bottleneck line dim (nothing to act on), below in colour."""


def summary_table(report: RunReport) -> Table:
    """The end-of-run summary."""
    t = Table(title=f"warpdeck: {report.pipeline} {report.ended}", show_header=False, title_justify="left")
    t.add_column(style="dim")
    t.add_column()
    c = report.counts
    t.add_row("tasks", f"{c.done} done, {c.failed} failed, {c.cancelled} cancelled of {c.total}")
    t.add_row("backend", escape(f"{report.backend} on {report.device} ({report.backend_reason})"))
    if report.executor:
        t.add_row("executor", escape(report.executor))
    t.add_row("elapsed", f"{report.elapsed_s:.2f} s (first batch {report.first_batch_s or 0:.3f} s)")
    t.add_row("throughput", f"{report.throughput_tasks_s:,.1f} tasks/s, {report.throughput_bytes_s / 1e6:,.1f} MB/s"
              f" (steady {report.steady_tasks_s:,.1f} tasks/s)")
    by_lane = "  ".join(f"lane {k} {v:.0%}" for k, v in report.device_busy_by_lane.items())
    many = len(report.device_busy_by_lane) > 1
    t.add_row("device busy", f"{report.device_busy:.1%}" + (f" ({by_lane})" if many else ""))
    if report.bottleneck:
        t.add_row("bottleneck", escape(report.bottleneck.removeprefix("bottleneck: ")))
    t.add_row("bound", f"{report.bound_tasks_s:,.1f} tasks/s with host phases parallel, "
              f"{report.serial_bound_tasks_s:,.1f} serial")
    t.add_row("overlap efficiency", f"{report.overlap_efficiency:.3f}")
    t.add_row("phase means", "  ".join(f"{k} {v * 1e3:.2f}ms" for k, v in report.mean_phase_s.items()))
    for name, pools in (("fill processes", report.host_processes), ("sink processes", report.sink_processes)):
        if pools:
            t.add_row(name, "; ".join(
                f"lane {lane}: " + ", ".join(f"pid {p['pid']} busy {p['busy_share']:.0%}" for p in procs)
                for lane, procs in pools.items()))
    if report.host_threads:
        t.add_row("host threads", "; ".join(f"lane {lane}: fill {th['fill']} sink {th['sink']}"
                                            for lane, th in report.host_threads.items()))
    occ = "; ".join(f"lane {lane}: " + " ".join(f"{k} {v:.0%}" for k, v in ph.items())
                    for lane, ph in report.occupancy.items())
    t.add_row("occupancy", occ)
    t.add_row("stalls", "  ".join(f"{k} {v:.2f}s" for k, v in report.stall_s.items() if v) or "none")
    t.add_row("more lanes", more_lanes_words(report.amdahl_ceiling, report.lanes_limit).removeprefix("more lanes: "))
    t.add_row("latency", f"p50 {report.latency_p50_s * 1e3:.1f} ms, p99 {report.latency_p99_s * 1e3:.1f} ms")
    control = report.control
    if control is not None:
        refused = sum(control.commands_refused.values())
        t.add_row("control plane", f"{control.broker or 'no broker'}: {control.commands_applied} command(s) applied, "
                  f"{refused} refused, {sum(control.dropped.values())} message(s) dropped, "
                  f"{control.workers_lost_count} worker(s) lost" + (f" ({control.error})" if control.error else ""))
        for worker, note in sorted(control.workers_waiting.items()):
            t.add_row("worker waiting", escape(f"{worker}: {note}"))
    for fail in report.failures[:_SHOWN_FAILURES]:
        t.add_row(Text("failed", style="red"), Text(f"{fail.key}: {fail.reason}"))
    if len(report.failures) > _SHOWN_FAILURES:
        t.add_row("", f"... and {len(report.failures) - _SHOWN_FAILURES} more (see --json)")
    return t


async def run_headless(spec: PipelineSpec, run_dir: Path, console: Console, live: bool,
                       retry_failed: bool = False, journal: bool | None = None,
                       control: ControlSettings | None = None, exports: ExportSettings | None = None) -> RunReport:
    """Run the engine with a live display (when ``live``) and print the summary. ``exports``: a
    trace file and a metrics endpoint written while it runs (OSError where one cannot start)."""
    if control is not None and control.secret is None:
        console.print(f"note: {UNAUTHENTICATED}", markup=False, highlight=False, soft_wrap=True)
    engine = Engine(spec, run_dir, retry_failed=retry_failed, journal=journal, control=control)
    with stop_signals() as stopping, exporting(exports, engine.events, engine.publisher, spec.name) as out:
        _say_exports(out, console)
        async with engine:
            await drive(engine, console, live, stopping)
        report = signalled(engine, stopping)
    await asyncio.sleep(0)
    console.print(summary_table(report))
    return report


async def drive(engine: Engine, console: Console, live: bool, stopping: asyncio.Event) -> None:
    """Show an entered engine's run until it ends or ``stopping`` is set (leaving the engine then stops it)."""
    # What exists now lives as long as the run (imports, the task table, the lanes' buffers): a
    # full collection need not walk it. Full collections stop every thread, the control plane's
    # among them, and took up to 350 ms with a million tasks known (benchmarks/README.md).
    gc.freeze()
    lines = WorkerLines(lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    quiet = engine.events.subscribe(lines.listen)
    try:
        watch = asyncio.create_task(_watch(engine, console, live), name="warpdeck-headless")
        stop = asyncio.create_task(stopping.wait(), name="warpdeck-stop-signal")
        await asyncio.wait((watch, stop), return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, watch):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # the watch's own failure (the engine's) is raised here
    finally:
        quiet()
        gc.unfreeze()


def signalled(engine: Engine, stopping: asyncio.Event) -> RunReport:
    """The report of an engine left after ``drive``: leaving it stopped it if a signal came first;
    its report says so ("stopped"), and why."""
    report = engine.report
    assert report is not None, "the engine writes its report as it closes"
    if stopping.is_set() and report.status == "stopped" and not report.stopped_by:
        report = report.model_copy(update={"stopped_by": "signal"})
    return report


def _say_exports(out: Exports, console: Console) -> None:
    if out.metrics_url is not None:
        console.print(f"metrics: {out.metrics_url}", markup=False, highlight=False, soft_wrap=True)
    if out.trace is not None:
        console.print(f"trace: {out.trace} (Trace Event Format: open it in https://ui.perfetto.dev)",
                      markup=False, highlight=False, soft_wrap=True)


async def _watch(engine: Engine, console: Console, live: bool) -> RunReport:
    outages = OutageLines(console)
    if live:
        with Live(console=console, refresh_per_second=8, transient=False) as view:
            async for snap in engine.publisher.stream():
                outages.see(snap)
                view.update(render_snapshot(snap))
    else:
        progress = ProgressLines(console)
        async for snap in engine.publisher.stream():
            outages.see(snap)
            progress.see(snap)
    return await engine.wait()


def progress_line(snap: EngineSnapshot) -> str:
    """The run in one line, for a log: done of total, rate, device busy and the bottleneck."""
    c, f = snap.counts, snap.figures
    total = c.out_of
    share = f" ({c.finished_all / total:.0%})" if total else ""
    busy = f"device busy {f.device_busy:.0%}"
    neck = f.bottleneck.removeprefix("bottleneck: ") if f.bottleneck else ""
    earlier = f" ({c.earlier:,} in an earlier run)" if c.earlier else ""
    return (f"{snap.pipeline}: {c.finished_all:,}/{total:,} finished{share}{earlier}, {c.failed:,} failed, "
            f"{f.recent_tasks_s:,.0f} tasks/s, {busy}" + (f"; bottleneck: {neck}" if neck else ""))


class ProgressLines:
    """Headless output where stdout is not a terminal (a CI log, a file): one line every
    ``EVERY_S`` or per ``STEP`` of the run, whichever is rarer, and at least one every
    ``AT_LEAST_S`` so that a run that holds still still says so. Before (issue 29), nothing came
    between the start note and the final table, however long the run."""

    EVERY_S = 10.0
    STEP = 0.05
    AT_LEAST_S = 60.0

    def __init__(self, console: Console) -> None:
        self._console = console
        self._t: float | None = None
        self._done = 0

    def see(self, snap: EngineSnapshot) -> None:
        if snap.status != "running":
            return
        c = snap.counts
        if self._t is None:  # the clock starts with the first snapshot: the start note came just before
            self._t = snap.t
            return
        since = snap.t - self._t
        total = c.out_of
        if total and c.finished >= total:
            return  # every task has ended: the final table comes next and says it
        moved = (c.finished - self._done) / total if total else 1.0
        if since >= self.AT_LEAST_S or (since >= self.EVERY_S and moved >= self.STEP):
            self._t, self._done = snap.t, c.finished
            self._console.print(progress_line(snap), markup=False, highlight=False, soft_wrap=True)


class OutageLines:
    """One line when an outage begins and one when it ends (or stops the run), whatever the display;
    and one when the control plane stops on an error (its traceback is in the run's log)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._now: OutageView | None = None
        self._t = 0.0
        self._plane_told = False

    def see(self, snap: EngineSnapshot) -> None:
        control = snap.control
        if control is not None and control.stopped and not self._plane_told:
            self._plane_told = True
            self._say(f"control plane stopped: {control.error}; workers are no longer heard and other rooms "
                      "cannot command this run; the run goes on (traceback in the run's log)")
        running = snap.status == "running"
        view, was = snap.outage if running else None, self._now
        if view is not None and was is None:
            limit = f"stopping after {view.timeout_s:g} s" if view.timeout_s else "stopping now"
            self._say(f"outage: {view.reason}; holding the run (nothing fails), {limit} if it lasts")
        elif view is None and was is not None:
            if running:
                self._say(f"outage over after {snap.t - was.since:.1f} s: carrying on")
            else:
                self._say(f"outage lasted {snap.t - was.since:.1f} s: the run stopped; fix the disk and run the "
                          "same command again to finish it")
        self._now = view

    def _say(self, line: str) -> None:
        self._console.print(line, markup=False, highlight=False)


@contextlib.contextmanager
def stop_signals() -> Iterator[asyncio.Event]:
    """An event set by the first SIGINT or SIGTERM while the run lasts; each handler then steps
    aside, so a second signal acts as it would have without us."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    caught = (signal.SIGINT, signal.SIGTERM)

    def first(sig: signal.Signals) -> None:
        stopping.set()
        loop.remove_signal_handler(sig)

    for sig in caught:
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread: signals stay as they are
            loop.add_signal_handler(sig, first, sig)
    try:
        yield stopping
    finally:
        for sig in caught:
            loop.remove_signal_handler(sig)
