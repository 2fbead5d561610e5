"""A run of several steps: one engine per segment, in the plan's order, with the ledger a resume reads.

The decisions this module protects:
- Each segment is an ordinary engine run in its own directory (``steps/<name>``), journaled there:
  outputs stay exactly once within it, and a stopped segment resumes from its journal as any run does.
- A segment that finished is recorded in the ledger before the next one starts, and never runs
  again; a reduce's result is kept in a file and handed to the later steps' stages as ``params``.
- A reduce is exactly once: each batch's accumulator is its own durable file (``ReduceSinkImpl``),
  so a kill during a long reduce resumes from the partials in place, and the result is the tree
  merge of every partial when the segment ends.
- A gate asks once: a decision given on the command line, or from a front end's ``decide``, is
  recorded in the ledger before the step starts (or the run ends, rejected). With no decision and
  no one to ask, the run stops at the gate (exit status 7) with what the steps before it produced.
- A segment that ends other than finished (stopped, an outage, a journal error) ends the run:
  the same command again resumes it.
- An embedded broker (``--broker embedded``) is started once for the whole run, so every step's
  engine is at one address.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import Backend
from warpdeck.engine.control.broker import EmbeddedBroker
from warpdeck.engine.control.plane import ControlSettings
from warpdeck.engine.edges.config import PipelineSpec, resolve_target
from warpdeck.engine.edges.journal import spec_identity
from warpdeck.engine.edges.reduce_sink import BadPartial, KeyFoldedTwice, ReduceSinkImpl
from warpdeck.engine.edges.step_ledger import (
    GateDecision,
    Ledger,
    LedgerError,
    SegmentDone,
    load_result,
    save_result,
)
from warpdeck.engine.edges.step_spec import ReduceSpec
from warpdeck.engine.engine import Engine
from warpdeck.engine.state.metrics import amdahl_speedup
from warpdeck.engine.state.reducers import CustomReducer, Reducer, builtin_reducer, tree_merge
from warpdeck.engine.state.report import ExitStatus, RunReport, not_run
from warpdeck.engine.state.step_report import GateView, SegmentReport, StepsReport, result_words
from warpdeck.engine.steps.plan import Segment, plan_steps, segment_dir, segment_spec

__all__ = ["GateAsk", "GateDecided", "ReduceBroken", "RetryRefused", "StepRun", "make_reducer", "run_steps"]

_SHOWN_VALUES = 64
"""A result array of up to this many values is shown in the report whole."""
_SAMPLE = 5
"""Outputs named in a gate's question."""


@dataclass(frozen=True)
class GateAsk:
    """What a gate asks an operator: may ``step`` start, given what the steps before it produced."""

    step: str
    produced: tuple[str, ...]
    """A line each: the segments' counts and failures, the reduces' results, a sample of outputs."""


@dataclass
class StepRun:
    """How a front end takes part in a run of steps; every field is optional."""

    decisions: Mapping[str, GateDecision] = field(default_factory=dict)
    """Gate decisions given before the run (``--approve STEP``), by step name."""
    decide: Callable[[GateAsk], Awaitable[GateDecision | None]] | None = None
    """Asked at a gate with no decision (a control room's dialog); None or an answer of None: stop there."""
    drive: Callable[[Engine, Segment], Awaitable[None]] | None = None
    """Runs one segment's entered engine to its end, or stops early (a display, stop signals); None:
    ``engine.wait()``. The segment's report is the engine's once it is left."""
    reported: Callable[[Engine], RunReport] | None = None
    """The report of an engine ``drive`` ran and left (a stop signal's reason added); None: ``engine.report``."""
    backend: Backend | None = None
    retry_failed: bool = False
    control: ControlSettings | None = None


def make_reducer(spec: ReduceSpec, name: str) -> Reducer:
    """The reducer a step's ``[steps.reduce]`` names."""
    if spec.builtin is not None:
        rng = (float(spec.value_range[0]), float(spec.value_range[1])) if spec.value_range is not None else None
        return builtin_reducer(spec.builtin, axes=tuple(spec.axes), bins=spec.bins, value_range=rng)
    assert spec.combine is not None and spec.finish is not None  # the spec refuses a reduce without them
    merge = resolve_target(spec.merge) if spec.merge is not None else None
    return CustomReducer(resolve_target(spec.combine), resolve_target(spec.finish), merge, name=name)


async def run_steps(spec: PipelineSpec, run_dir: Path | str, how: StepRun | None = None) -> StepsReport:
    """Run ``spec``'s steps in ``run_dir`` (each segment resumes from there), to the end, a gate
    without a decision, or a segment that did not finish."""
    if not spec.steps:
        raise ValueError(f"{spec.name}: a spec without steps runs in one engine (run_pipeline)")
    how = how if how is not None else StepRun()
    if how.control is None or how.control.broker is not None:
        return await _StepRunner(spec, Path(run_dir), how).run()
    # One embedded broker for the whole run, not one per step: the steps' engines meet rooms and
    # workers at one address.
    broker = EmbeddedBroker()
    address = await asyncio.to_thread(broker.start)
    try:
        return await _StepRunner(spec, Path(run_dir), replace(how, control=replace(how.control, broker=address))).run()
    finally:
        await asyncio.to_thread(broker.stop)


class _StepRunner:
    """One run of a spec's steps: the plan walked in order, the ledger kept as it goes."""

    def __init__(self, spec: PipelineSpec, run_dir: Path, how: StepRun) -> None:
        # Absolute: a later segment reads an earlier one's outputs from its own run directory.
        self.spec, self.run_dir, self.how = spec, run_dir.absolute(), how
        self.t0 = time.perf_counter()
        self.ledger = Ledger.open(run_dir, spec_identity(spec).digest)
        self.plan = plan_steps(spec)
        self.params: dict[str, Mapping[str, npt.NDArray[Any]]] = {}
        """Each finished reduce's result, by its step's name."""
        self.reports: list[SegmentReport] = []
        self.gate: GateView | None = None
        self.ended = False
        """A segment stopped, or a gate held or rejected: the segments after it do not start."""
        self.ran: set[str] = set()
        """The segments run (or begun) in this run: a segment after one of them runs again too."""

    def _again(self, seg: Segment, earlier: SegmentDone) -> bool:
        """Whether a segment an earlier run finished runs again: its failures retried (``retry_failed``),
        or a segment it reads or waits for ran again, so it has more to do (its journal skips what it did)."""
        retried = self.how.retry_failed and earlier.failed > 0
        if retried and (reduces := [r for r in self._after(seg) if r.reduce is not None and
                                    r.name in self.ledger.finished]):
            raise RetryRefused(seg.name, reduces[0].name)
        return retried or any(name in self.ran for name in (*seg.after, seg.reads) if name is not None)

    def _after(self, seg: Segment) -> list[Segment]:
        """Every segment that reads or waits for ``seg``, directly or through others, in plan order."""
        names = {seg.name}
        for other in self.plan:
            if any(name in names for name in (*other.after, other.reads) if name is not None):
                names.add(other.name)
        return [other for other in self.plan if other.name in names - {seg.name}]

    async def run(self) -> StepsReport:
        for seg in self.plan:
            kind: Literal["map", "reduce"] = "reduce" if seg.reduce is not None else "map"
            base = SegmentReport(name=seg.name, steps=list(seg.steps), kind=kind, status="not started")
            if self.ended:
                self.reports.append(base)
            elif (earlier := self.ledger.finished.get(seg.name)) is not None and not self._again(seg, earlier):
                self.reports.append(self._earlier(seg, base, earlier))
            else:
                self.ran.add(seg.name)
                gate_wait = await self._gate(seg, base) if seg.gate else 0.0
                if not self.ended:
                    self.reports.append(await self._segment(seg, base, gate_wait))
        path, path_s = _critical_path(self.plan, self.reports)
        elapsed = time.perf_counter() - self.t0
        s = _serial_fraction(self.reports, elapsed)
        return StepsReport(pipeline=self.spec.name, elapsed_s=elapsed, segments=self.reports, gate=self.gate,
                           critical_path=path, critical_path_s=path_s, serial_fraction=s,
                           amdahl_ceiling={f"x{p}" if p != math.inf else "x inf": amdahl_speedup(s, p)
                                           for p in (2, 4, math.inf)})

    def _earlier(self, seg: Segment, base: SegmentReport, earlier: SegmentDone) -> SegmentReport:
        """A segment an earlier run finished: its result read back, nothing run."""
        if earlier.result is not None:
            self.params[seg.name] = load_result(self.run_dir / earlier.result)
        if seg.gate and (decided := self.ledger.gates.get(seg.steps[0])) is not None:
            self.gate = GateView(step=seg.steps[0], decision=decided.decision, note=decided.note, by=decided.by,
                                 at=decided.at)
        return base.model_copy(update={"status": "finished earlier", "seconds": earlier.seconds, "done": earlier.done,
                                       "failed": earlier.failed,
                                       "result": _shown(self.params.get(seg.name), earlier.result)})

    async def _gate(self, seg: Segment, base: SegmentReport) -> float:
        """Decide ``seg``'s gate (the ledger's decision, the command line's, or the front end's),
        record it, and end the run where it is held or rejected; returns the seconds it waited."""
        step = seg.steps[0]
        asked = time.perf_counter()
        recorded, given = self.ledger.gates.get(step), self.how.decisions.get(step)
        if recorded is not None and given is not None and given.decision != recorded.decision:
            raise GateDecided(step, recorded)
        decision = recorded or given
        if decision is None and self.how.decide is not None:
            decision = await self.how.decide(GateAsk(step, _produced(self.plan, self.reports, self.run_dir)))
        if decision is not None and step not in self.ledger.gates:
            self.ledger = self.ledger.with_gate(step, decision)
            self.ledger.save(self.run_dir)
        waited = time.perf_counter() - asked
        if decision is None:
            self.gate = GateView(step=step, decision="waiting",
                                 produced=list(_produced(self.plan, self.reports, self.run_dir)))
        else:
            self.gate = GateView(step=step, decision=decision.decision, note=decision.note, by=decision.by,
                                 at=decision.at)
        if decision is None or decision.decision == "rejected":
            status = "held at gate" if decision is None else "rejected"
            self.reports.append(base.model_copy(update={"status": status, "gate_wait_s": waited}))
            self.ended = True
        return waited

    async def _segment(self, seg: Segment, base: SegmentReport, gate_wait: float) -> SegmentReport:
        """Run ``seg``'s engine; record it finished (with a reduce's result) or end the run."""
        started = time.perf_counter()
        broken = ""
        try:
            report, result = await _run_segment(self.spec, seg, self.run_dir, self.how,
                                                {k: self.params[k] for k in seg.params_from})
        except ReduceBroken as exc:
            report, result, broken = exc.report, None, str(exc)
        seconds = time.perf_counter() - started
        finished = report.exit_code in (ExitStatus.FINISHED, ExitStatus.FAILED) and not broken
        c = report.counts
        entry = base.model_copy(update={
            "status": "failed" if broken else "finished" if finished else "stopped", "seconds": seconds, "note": broken,
            "barrier_wait_s": max(0.0, started - self.t0 - gate_wait), "gate_wait_s": gate_wait,
            "done": c.done + c.skipped_done, "failed": c.failed + c.cancelled, "report": report})
        if not finished:
            self.ended = True
            return entry
        kept: str | None = None
        if result is not None:
            path = segment_dir(self.run_dir, seg) / "result.npz"
            save_result(path, result)
            kept = str(path.relative_to(self.run_dir))
            self.params[seg.name] = result
            entry = entry.model_copy(update={"result": _shown(result, kept)})
        self.ledger = self.ledger.with_finished(seg.name, SegmentDone(seconds=seconds, done=entry.done,
                                                                      failed=entry.failed, result=kept))
        self.ledger.save(self.run_dir)
        return entry


async def _run_segment(spec: PipelineSpec, seg: Segment, run_dir: Path, how: StepRun,
                       params: Mapping[str, Mapping[str, npt.NDArray[Any]]],
                       ) -> tuple[RunReport, dict[str, npt.NDArray[Any]] | None]:
    """One segment's engine run to its end, and a reduce's result when it finished."""
    where = segment_dir(run_dir, seg)
    reducer = make_reducer(seg.reduce, seg.name) if seg.reduce is not None else None
    sink = ReduceSinkImpl(where / "partials", reducer) if reducer is not None else None
    engine = Engine(segment_spec(spec, seg, run_dir), where, backend=how.backend, sink=sink,
                    retry_failed=how.retry_failed, control=how.control, params=params)
    async with engine:
        if how.drive is not None:
            await how.drive(engine, seg)
        else:
            await engine.wait()
    report = how.reported(engine) if how.reported is not None else engine.report
    if report is None:  # left before its run began (a stop that came first): nothing ran, nothing to report
        report = not_run(engine.spec.name)
    if reducer is None or sink is None or report.exit_code not in (ExitStatus.FINISHED, ExitStatus.FAILED):
        return report, None
    try:
        accs, covered = sink.landed()
    except (BadPartial, KeyFoldedTwice) as exc:
        raise ReduceBroken(seg.name, where, str(exc), report) from exc
    done = report.counts.done + report.counts.skipped_done
    if covered != done:
        raise ReduceBroken(seg.name, where, f"its partials hold {covered:,} outputs, its journal {done:,} done",
                           report)
    return report, reducer.finish(tree_merge(reducer, accs))


class GateDecided(LedgerError):
    """A decision given for a gate the ledger holds the other decision of: a gate is decided once."""

    def __init__(self, step: str, recorded: GateDecision) -> None:
        self.step = step
        self.recorded = recorded
        note = f" ({recorded.note!r})" if recorded.note else ""
        super().__init__(f"the gate of {step} was {recorded.decision} at {recorded.at} by {recorded.by or 'someone'}"
                         f"{note}; a gate is decided once: use another --run-dir to start afresh")


class RetryRefused(LedgerError):
    """``retry_failed`` where a finished reduce comes after the failures: retrying them would change a
    result that later steps' outputs were made with."""

    def __init__(self, step: str, reduce: str) -> None:
        self.step = step
        self.reduce = reduce
        super().__init__(f"--retry-failed: retrying {step}'s failed tasks would change the result of the reduce "
                         f"{reduce}, which finished without them and whose result later steps used; use another "
                         "--run-dir to run the steps again with them")


class ReduceBroken(RuntimeError):
    """A reduce whose partials cannot give its result (one unreadable, or not one per task done):
    the step fails rather than hand on a result that leaves tasks out or counts one twice."""

    def __init__(self, step: str, where: Path, why: str, report: RunReport) -> None:
        self.step = step
        self.where = where
        self.report = report
        """The reduce's engine report (it ran to its end)."""
        super().__init__(f"reduce {step}: {why}; remove {where} to run it again from the start")


def _shown(result: Mapping[str, npt.NDArray[Any]] | None, kept: str | None) -> dict[str, list[float] | str]:
    """A result as the report shows it: small arrays' values, a large one's dtype, shape and file."""
    if result is None:
        return {}
    out: dict[str, list[float] | str] = {}
    for name, arr in result.items():
        a = np.asarray(arr)
        if a.size <= _SHOWN_VALUES:
            out[name] = [float(x) for x in a.ravel()]
        else:
            out[name] = f"{a.dtype} {tuple(a.shape)} in {kept}"
    return out


def _produced(plan: tuple[Segment, ...], reports: list[SegmentReport], run_dir: Path) -> tuple[str, ...]:
    """What the segments so far produced, for a gate's question."""
    lines = []
    for r in reports:
        line = f"{r.name} ({r.kind}, {r.status}): {r.done} done, {r.failed} failed"
        if r.report is not None and r.report.failures:
            first = r.report.failures[0]
            line += f"; first failure {first.key}: {first.reason}"
        lines.append(line)
        lines += [f"  {name} = {result_words(value)}" for name, value in r.result.items()]
        seg = next(s for s in plan if s.name == r.name)
        outputs = segment_dir(run_dir, seg) / "outputs"
        if r.kind == "map" and outputs.is_dir():
            sample = sorted(p.name for p in outputs.glob("*.npy"))[:_SAMPLE]
            if sample:
                lines.append(f"  outputs in {outputs}: {', '.join(sample)}")
    return tuple(lines)


def _serial_fraction(reports: list[SegmentReport], elapsed: float) -> float:
    """The share of this run's time, gate waits left out, that more lanes could not shorten: each
    segment run here counts its own serial share (``RunReport.serial_fraction``) of its time, and the
    time between segments counts whole."""
    ran = [r for r in reports if r.report is not None]
    working = elapsed - sum(r.gate_wait_s for r in reports)
    if working <= 0 or not ran:
        return 0.0
    between = max(0.0, working - sum(r.seconds for r in ran))
    serial = between + sum(r.seconds * r.report.serial_fraction for r in ran if r.report is not None)
    return min(1.0, serial / working)


def _critical_path(plan: tuple[Segment, ...], reports: list[SegmentReport]) -> tuple[list[str], float]:
    """The longest chain of segments by their run time, each after the one before it."""
    took = {r.name: r.seconds for r in reports}
    best: dict[str, tuple[float, list[str]]] = {}
    for seg in plan:  # in order: every segment after those it waits for
        before = max((best[a] for a in seg.after), default=(0.0, []), key=lambda b: b[0])
        best[seg.name] = (before[0] + took.get(seg.name, 0.0), [*before[1], seg.name])
    if not best:
        return [], 0.0
    total, path = max(best.values(), key=lambda b: b[0])
    return path, total
