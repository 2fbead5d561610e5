"""The run's report as the command leaves it: written as JSON (``--json``) for every ending, and a
refusal said in one line.

The decision this module protects: every ending writes its report, a refusal too, and a report
that cannot be written is said on stderr with what it would have held, never lost in silence.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from warpdeck.engine.api import RunReport, StepsReport

__all__ = ["refuse", "write_report"]


def refuse(report: RunReport, err: Console, path: Path | None) -> int:
    """Say why a run did not start (the reason is the report's), write its report, give its status."""
    err.print(f"error: {report.refused or report.journal_error}", markup=False, highlight=False, soft_wrap=True)
    write_report(report, path, err)
    return report.exit_code


def write_report(report: RunReport | StepsReport, path: Path | None, err: Console) -> None:
    """Write the JSON report; where its path is unwritable, say so and put the summary on stderr."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    except OSError as exc:
        if isinstance(report, StepsReport):
            held = f"{sum(s.done for s in report.segments):,} done in its steps, {report.ended}"
        else:
            c = report.counts
            held = (f"{report.status}, {c.done:,} done, {c.failed:,} failed, {c.cancelled:,} cancelled, "
                    f"{c.queued + c.running:,} left")
        err.print(f"error: cannot write the report to {path}: {exc.strerror or exc}; the run {held} "
                  f"(exit status {int(report.exit_code)})", markup=False, highlight=False, soft_wrap=True)
