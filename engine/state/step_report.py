"""The report of a run of several steps: each segment's own run report, its barrier and gate waits,
each reduce's result, the gate the run stopped at, and the exit status of the whole.

The decision this module protects: a run of steps ends with one status, as a run of one does. A
segment's own report decides it as always (``RunReport.exit_code``); a gate adds two of its own:
held (7: waiting for an approval; the same command with ``--approve STEP`` goes on) and rejected
(8: an operator said no; the note is in the report).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from warpdeck.engine.state.report import ExitStatus, RunReport

__all__ = ["GateView", "SegmentReport", "StepsReport", "result_words", "worst_status"]

SegmentStatus = Literal["finished", "finished earlier", "stopped", "failed", "not started", "held at gate", "rejected"]

_PRECEDENCE = (ExitStatus.JOURNAL, ExitStatus.USAGE, ExitStatus.OUTAGE, ExitStatus.STOPPED, ExitStatus.GATE_REJECTED,
               ExitStatus.GATE_HELD, ExitStatus.FAILED, ExitStatus.DRAINED, ExitStatus.FINISHED)


_SHOWN = 4
"""Values of a result array shown in words (the JSON report has them all)."""


def result_words(value: list[float] | str) -> str:
    """One array of a reduce's result in a few words: ``24.4``, ``[0.48, 0.45, 0.41]``,
    ``[0.1, 0.2, 0.3, 0.4, ...] (64 values)``, or where a large one is kept."""
    if isinstance(value, str):
        return value
    if len(value) == 1:
        return f"{value[0]:.6g}"
    shown = ", ".join(f"{x:.4g}" for x in value[:_SHOWN])
    return f"[{shown}]" if len(value) <= _SHOWN else f"[{shown}, ...] ({len(value)} values)"


def worst_status(statuses: list[ExitStatus]) -> ExitStatus:
    """The status that wins among several (the order ``ExitStatus`` gives in words)."""
    return min(statuses, key=_PRECEDENCE.index, default=ExitStatus.FINISHED)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class GateView(_Frozen):
    """A gate the run reached: what the operator is asked to approve, and what they said."""

    step: str
    """The gated step."""
    decision: Literal["waiting", "approved", "rejected"]
    note: str = ""
    by: str = ""
    at: str = ""
    produced: list[str] = []
    """What the steps before it produced, a line each (counts, failures, results, a sample of outputs)."""


class SegmentReport(_Frozen):
    """One segment (a reduce step, or map steps that stream into each other) of a run of steps."""

    name: str
    steps: list[str]
    kind: Literal["map", "reduce"]
    status: SegmentStatus
    seconds: float = 0.0
    """How long its engine ran (in an earlier run, for one finished earlier)."""
    barrier_wait_s: float = 0.0
    """How long it waited, from the run's start, for the steps before it (gates not counted)."""
    gate_wait_s: float = 0.0
    """How long it waited for an approval."""
    done: int = 0
    failed: int = 0
    result: dict[str, list[float] | str] = {}
    """A reduce's result: each array's values (up to 64), or its dtype and shape and where it is kept."""
    report: RunReport | None = None
    """Its engine's report (None for one finished earlier or not started)."""
    note: str = ""
    """Why a segment whose engine finished failed all the same (a reduce whose partials cannot give its result)."""


class StepsReport(_Frozen):
    """A run of several steps, as the command line writes it (``--json``)."""

    schema_version: int = 1
    pipeline: str
    elapsed_s: float
    segments: list[SegmentReport]
    gate: GateView | None = None
    """The last gate the run reached."""
    critical_path: list[str] = []
    """The segments on the longest chain of waits, first to last."""
    critical_path_s: float = 0.0
    """Their time together: the least this run could take with every other segment beside them."""
    serial_fraction: float = 0.0
    """The share of this run's time (gate waits left out) that more lanes could not shorten: each step's
    own serial share of its time, and all the time between steps (a reduce's merge, the ledger)."""
    amdahl_ceiling: dict[str, float] = {}
    """Amdahl's law on ``serial_fraction``: the most speedup ``p`` times the lanes could give the run."""

    @property
    def exit_code(self) -> ExitStatus:
        """The run's exit status: a gate held or rejected, else the worst of its segments' reports."""
        statuses = [s.report.exit_code for s in self.segments if s.report is not None]
        statuses += [ExitStatus.FAILED for s in self.segments
                     if (s.report is None and s.failed) or s.status == "failed"]
        if self.gate is not None and self.gate.decision == "rejected":
            statuses.append(ExitStatus.GATE_REJECTED)
        if self.gate is not None and self.gate.decision == "waiting":
            statuses.append(ExitStatus.GATE_HELD)
        return worst_status(statuses)

    @property
    def ended(self) -> str:
        """How the run ended, in words."""
        code = self.exit_code
        if code == ExitStatus.GATE_HELD and self.gate is not None:
            return f"held at the gate of {self.gate.step}"
        if code == ExitStatus.GATE_REJECTED and self.gate is not None:
            return f"rejected at the gate of {self.gate.step}"
        broken = next((s for s in self.segments if s.status == "failed"), None)
        if broken is not None:
            return f"failed at step {broken.name}"
        last = next((s.report for s in reversed(self.segments) if s.report is not None), None)
        return last.ended if last is not None else "finished earlier"
