"""``warpdeck run`` of a spec with steps, headless: each segment's progress and summary as for a run of one, then
the steps in one table, and at a gate what the steps before it produced and how to go on.

SIGINT and SIGTERM stop the segment running (its report says ``stopped``, by a signal), and the run
with it; the same command resumes: finished steps are not run again, and the stopped one resumes
from its journal.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from warpdeck.cli.headless import drive, signalled, stop_signals, summary_table
from warpdeck.cli.reports import refuse, write_report
from warpdeck.cli.run_log import LOG_NAME, RunLog
from warpdeck.engine.api import (
    UNAUTHENTICATED,
    BackendError,
    ControlSettings,
    Engine,
    ExportSettings,
    GateDecision,
    JournalError,
    LedgerError,
    PipelineSpec,
    RunDirError,
    RunReport,
    Segment,
    SpecError,
    StepRun,
    StepsReport,
    not_run,
    plan_steps,
    result_words,
    run_steps,
    step_words,
)

__all__ = ["gate_lines", "run_steps_command", "run_steps_headless", "say_steps", "steps_command", "steps_table"]


async def run_steps_headless(spec: PipelineSpec, run_dir: Path, console: Console, live: bool, *,
                             decisions: dict[str, GateDecision], retry_failed: bool = False,
                             control: ControlSettings | None = None) -> StepsReport:
    """Run ``spec``'s steps with the headless display; print each segment's summary and the steps' table."""
    if control is not None and control.secret is None:
        console.print(f"note: {UNAUTHENTICATED}", markup=False, highlight=False, soft_wrap=True)
    with stop_signals() as stopping:

        plan = plan_steps(spec)

        async def show(engine: Engine, seg: Segment) -> None:
            console.print(step_words(plan, seg), markup=False, highlight=False)
            await drive(engine, console, live, stopping)

        def reported(engine: Engine) -> RunReport:
            """The step's report once its engine closed (a signal's stop included), and its summary."""
            if engine.report is None:  # left before its run began
                report = not_run(engine.spec.name, stopped_by="signal" if stopping.is_set() else "")
            else:
                report = signalled(engine, stopping)
            console.print(summary_table(report))
            return report

        how = StepRun(decisions=decisions, drive=show, reported=reported, retry_failed=retry_failed,
                      control=control)
        report = await run_steps(spec, run_dir, how)
    await asyncio.sleep(0)
    console.print(steps_table(report))
    return report


def steps_table(report: StepsReport) -> Group:
    """The steps of a run: a table of how each ended, its time, its waits and counts, then each reduce's result."""
    t = Table(title=f"warpdeck: {report.pipeline} {report.ended}", title_justify="left")
    for name in ("step", "kind", "ended", "time", "barrier wait", "gate wait", "done", "failed"):
        t.add_column(name, justify="left" if name in ("step", "kind", "ended") else "right")
    for s in report.segments:
        t.add_row(escape(" + ".join(s.steps)), s.kind, s.status, f"{s.seconds:.2f} s", f"{s.barrier_wait_s:.2f} s",
                  f"{s.gate_wait_s:.2f} s", f"{s.done:,}", f"{s.failed:,}")
    ceiling = report.amdahl_ceiling.get("x inf", 1.0)
    t.caption = (f"elapsed {report.elapsed_s:.2f} s; critical path {' -> '.join(report.critical_path)}: "
                 f"{report.critical_path_s:.2f} s of steps' time (earlier runs' included); serial "
                 f"{report.serial_fraction:.0%}: more lanes at most x{ceiling:.1f}")
    results = [Text(f"{s.name}: " + "; ".join(f"{k} {result_words(v)}" for k, v in s.result.items()))
               for s in report.segments if s.result]
    notes = [Text(f"{s.name}: {s.note}", style="red") for s in report.segments if s.note]
    return Group(t, *results, *notes)


def gate_lines(report: StepsReport, command: str) -> list[Text]:
    """What a gate the run reached says: the decision, or what to approve and how."""
    gate = report.gate
    if gate is None:
        return []
    if gate.decision == "waiting":
        lines = [Text(f"held at the gate of step {gate.step}: the steps before it produced", style="bold")]
        lines += [Text(f"  {line}") for line in gate.produced]
        lines.append(Text(f"to go on: {command} --approve {gate.step} [--note TEXT]; "
                          f"to end it: --reject {gate.step} --note TEXT"))
        return lines
    by = f" by {gate.by}" if gate.by else ""
    note = f": {gate.note}" if gate.note else ""
    return [Text(f"gate of step {gate.step} {gate.decision}{by} at {gate.at}{note}")]


def run_steps_command(spec: PipelineSpec, run_dir: Path, args: argparse.Namespace, control: ControlSettings | None,
                      exports: ExportSettings, err: Console,
                      control_room: Callable[[dict[str, GateDecision]], int] | None = None) -> int:
    """``warpdeck run`` of a spec with steps: in ``control_room`` where given (a gate without a decision
    asks there), else headless, each gate decided on the command line (``--approve``, ``--reject``,
    ``--note``) or the run held there; returns the exit status."""
    try:
        decisions = _decisions(spec, args.approve, args.reject, args.note)
        if exports.trace is not None or exports.metrics is not None:
            raise ValueError("--trace and --metrics follow one engine; a spec with steps runs one per step: "
                             "not yet")
    except ValueError as exc:
        return refuse(not_run(spec.name, refused=str(exc)), err, args.json)
    if control_room is not None:
        return control_room(decisions)
    console = Console(stderr=False)
    try:
        with RunLog(run_dir / LOG_NAME).installed():
            report = asyncio.run(run_steps_headless(spec, run_dir, console, live=console.is_terminal,
                                                    decisions=decisions, retry_failed=args.retry_failed,
                                                    control=control))
    except JournalError as exc:
        return refuse(not_run(spec.name, journal_error=str(exc)), err, args.json)
    except (BackendError, RunDirError, SpecError, LedgerError) as exc:
        return refuse(not_run(spec.name, refused=str(exc)), err, args.json)
    for line in gate_lines(report, steps_command(args.spec, args.run_dir)):
        console.print(line)
    write_report(report, args.json, err)
    return int(report.exit_code)


def steps_command(spec_file: Path | None, run_dir: Path | None) -> str:
    """The command that goes on with a run of steps, for a gate's lines."""
    return " ".join(["warpdeck", "run", str(spec_file or "SPEC")] + (["--run-dir", str(run_dir)] if run_dir else []))


def say_steps(report: StepsReport, console: Console, command: str) -> None:
    """The steps' table and a gate's lines, after the control room closed."""
    console.print(steps_table(report))
    for line in gate_lines(report, command):
        console.print(line)


def _decisions(spec: PipelineSpec, approve: list[str], reject: list[str], note: str) -> dict[str, GateDecision]:
    """The gate decisions the command line gives, each for a gated step of ``spec``."""
    gated = {st.name for st in spec.steps if st.gate}
    out: dict[str, GateDecision] = {}
    for flag, names, decision in (("--approve", approve, "approved"), ("--reject", reject, "rejected")):
        for name in names:
            if name not in gated:
                known = ", ".join(sorted(gated)) or "none"
                raise ValueError(f"{flag} {name}: no gated step is called {name!r} (gated steps: {known})")
            if name in out:
                raise ValueError(f"{flag} {name}: {name!r} is both approved and rejected")
            out[name] = GateDecision(decision=decision, note=note, by="command line")
    return out
