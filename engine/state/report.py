"""The run report: what ``--json`` writes and the headless summary prints.

The decisions this module protects: the report is a pydantic model, so its JSON has one schema
that tests, CI and users can rely on; it is built from the final snapshot, never recomputed. The
command's exit status is decided here, from the report alone (``RunReport.exit_code``), whichever
front end ran the run.
"""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field

from warpdeck.engine.state.snapshot import EngineStatus, ended_words

__all__ = [
    "EXIT_STATUS_HELP",
    "ExitStatus",
    "ReportControl",
    "ReportCounts",
    "ReportFailure",
    "ReportFlag",
    "ReportOutages",
    "ReportResume",
    "RunReport",
    "not_run",
]


class ExitStatus(enum.IntEnum):
    """The ``warpdeck`` command's exit statuses. Where two apply, stopped beats failed (or
    cancelled), which beats drained."""

    FINISHED = 0
    """Finished: every task done."""
    FAILED = 1
    """One or more tasks failed or were cancelled."""
    USAGE = 2
    """Bad usage or a bad spec (and nothing else): nothing ran."""
    DRAINED = 3
    """Drained by the operator: admitted nothing more, finished what was admitted, nothing failed."""
    STOPPED = 4
    """Stopped before the end (quit with work running, SIGINT or SIGTERM, the engine stopped): a plain
    resume, the same command again on the same run directory, finishes it."""
    OUTAGE = 5
    """Stopped by an outage: the outputs' or the journal's disk stayed full, read-only or failing
    for ``[faults] outage_timeout_s``. Nothing was marked failed; once the disk is fixed, a plain
    resume finishes the run."""
    JOURNAL = 6
    """The journal could not be written: the run stopped at once. A resume redoes what the journal
    did not record (outputs already in place are kept, never written twice)."""
    GATE_HELD = 7
    """A run of steps reached a gate (``gate = true``) with no decision: the steps before it finished;
    the same command with ``--approve STEP`` (or ``--reject STEP``) goes on from there."""
    GATE_REJECTED = 8
    """An operator rejected a gate: the gated step and those after it did not run; the note is in the report."""


EXIT_STATUS_HELP = """exit status:
  0 finished: every task done
  1 one or more tasks failed or were cancelled
  2 bad usage or a bad spec (nothing ran)
  3 drained by the operator: nothing more admitted, what was admitted finished, nothing failed
  4 stopped before the end (quit with work running, SIGINT/SIGTERM, the engine stopped); the same
    command again resumes and finishes it (a demo keeps a journal only when given --run-dir)
  5 stopped by an outage: the outputs' or journal's disk stayed full, read-only or failing for
    [faults] outage_timeout_s; nothing was marked failed: fix the disk and run the same command
  6 the journal could not be written: stopped at once; the same command resumes once it can
  7 held at a gate (a spec with steps): the same command with --approve STEP goes on
  8 a gate was rejected (--reject STEP, or from the control room): the steps after it did not run
where two apply, the higher of 6, 5, 4 wins, then 8, 7, then failed (1), then drained (3)"""
"""The exit statuses in words, for ``--help`` and the docs."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReportCounts(_Frozen):
    """Tasks by final state."""

    total: int
    done: int
    failed: int
    cancelled: int
    queued: int
    running: int
    skipped_done: int = 0
    """Tasks done by an earlier run of this run directory: not run, not counted in ``total``."""
    flagged: int = 0
    """Done tasks whose output is suspect (see ``RunReport.flagged``)."""


class ReportFailure(_Frozen):
    """One task that did not finish, and why."""

    key: str
    reason: str
    attempt: int


class ReportFlag(_Frozen):
    """A done task whose output is suspect, and why (``nonfinite = "flag"``)."""

    key: str
    note: str


class ReportResume(_Frozen):
    """How this run continued an earlier one from its journal."""

    resumed: bool
    """False for a new run directory."""
    journal: str
    """Path of the journal (SQLite)."""
    skipped_done: int
    """Tasks done earlier, skipped: never read or written again."""
    outputs_recovered: int
    """Of those, tasks whose output was found in place though the journal had not marked them done,
    and matched the checksum the sink kept as it wrote it."""
    outputs_rejected: int = 0
    """Outputs found in place though the journal had not marked them done, that did not match their
    checksum (or had none): removed, and their tasks run again."""
    requeued_in_flight: int
    """Tasks in flight when the earlier run stopped, started again as a new attempt."""
    retried_failed: int
    """Failed tasks retried because the run was asked to (``--retry-failed``)."""
    temps_cleaned: int
    """Partial outputs (temp files) of a killed run removed at start."""


class ReportControl(_Frozen):
    """The control plane over the run: where it was, what it refused, whom it convicted."""

    broker: str
    """The broker's URL (no password); empty if the plane never got one."""
    connected: bool
    commands_applied: int
    commands_refused: dict[str, int]
    dropped: dict[str, int]
    """Messages dropped at the socket, by reason."""
    workers_lost: list[str]
    """Workers convicted dead during the run (the last 1 000 of them). A worker known only from
    what an earlier run left on the broker is never one."""
    workers_lost_count: int = 0
    """All the workers convicted dead during the run (one forgotten and born again counts again)."""
    error: str = ""
    lag_holds: int = 0
    """Times the monitor's input ran a second or more behind, so that it held silence verdicts."""
    worst_input_lag_s: float = 0.0
    """The longest the monitor's input ran behind (measured with the engine's own heartbeats)."""
    workers_waiting: dict[str, str] = Field(default_factory=dict)
    """Workers not working at the end and why, where the engine knows (a Ray actor Ray could not
    restart for want of room: ``restarting: waiting for 1 GPU``)."""


class ReportOutages(_Frozen):
    """Outages during the run: times a full, read-only or failing disk held the writes."""

    count: int
    """Outages that began (the one that stopped the run included)."""
    total_s: float
    """Seconds the run spent in them."""
    last: str
    """The last one's reason: ``sink: no space left on device (outputs/)``."""


class RunReport(_Frozen):
    """Everything a run measured (DESIGN.md section 4). Rates per second, times in seconds."""

    schema_version: int = 1
    pipeline: str
    status: EngineStatus
    backend: str
    backend_reason: str
    device: str
    lanes: int
    batch_size: int
    slot_depth: list[int]
    elapsed_s: float
    first_batch_s: float | None
    counts: ReportCounts
    throughput_tasks_s: float
    throughput_bytes_s: float
    steady_tasks_s: float
    device_busy: float = 0.0
    """Share of wall time the compute phase ran, first compute to last, all lanes together."""
    device_busy_by_lane: dict[str, float] = {}
    bottleneck: str = ""
    """The phase holding the device back and what to change, in one line."""
    bottleneck_phase: str = ""
    bound_tasks_s: float
    """What the pipeline could reach with its host phases parallel, within the machine's cores."""
    serial_bound_tasks_s: float
    overlap_efficiency: float
    """Steady throughput over the bound (never above 1)."""
    mean_phase_s: dict[str, float]
    cpu_phase_s: dict[str, float] = {}
    """Mean CPU seconds per batch of each phase's thread."""
    host_threads: dict[str, dict[str, int]] = {}
    """Per lane: the fill and sink threads it ended with."""
    host_processes: dict[str, list[dict[str, int | float]]] = {}
    """Per lane whose fills ran in worker processes (``[host] fill_pool``): each worker it ended with,
    as ``pid``, ``batches`` and ``busy_share`` (of its life spent loading)."""
    sink_processes: dict[str, list[dict[str, int | float]]] = {}
    """Per lane whose outputs were written in worker processes (``[host] sink_pool``), as ``host_processes``."""
    phase_clocks: dict[str, str] = {}
    """Which clock timed each phase (host perf_counter, or the device's own events)."""
    tuning: list[str] = []
    """The tuner's last decisions, oldest first."""
    executor: str = ""
    """Where the batches ran when not in this process (Ray: actors, and who loaded and wrote the data)."""
    occupancy: dict[str, dict[str, float]]
    stall_s: dict[str, float]
    divergence_max: int
    serial_fraction: float
    amdahl_ceiling: dict[str, float]
    """Most speedup more lanes could give: Amdahl's law within what the cores and the device leave."""
    lanes_limit: str = ""
    """What caps ``amdahl_ceiling`` below Amdahl's law: "cores", "device", or "" (the serial share)."""
    latency_p50_s: float
    latency_p99_s: float
    failures: list[ReportFailure]
    resume: ReportResume | None = None
    """Set for a journaled run (one with a run directory)."""
    flagged: list[ReportFlag] = []
    """Done tasks whose output is suspect."""
    control: ReportControl | None = None
    """Set when the run had a control plane (``--broker``)."""
    stopped_by: str = ""
    """Why the engine stopped itself before the end: ``outage`` or ``journal``; or ``source``: the
    source raised part way, so what it had yielded finished and nothing more was admitted; or
    ``signal``: a SIGTERM or SIGINT stopped a headless run, while it started (``not_run``) or after
    ("" otherwise: the run ended by itself, or an operator stopped it from the control room)."""
    source_error: str = ""
    """The source's error where it raised part way (``RuntimeError: bucket gone``); a resume carries on."""
    source_traceback: str = ""
    """Its traceback, as Python printed it."""
    outages: ReportOutages | None = None
    """Set when an outage held the run at least once."""
    journal_error: str = ""
    """Why the journal could not be written, if it could not (exit status 6)."""
    refused: str = ""
    """Why the run was refused before any work started: a bad spec, a run directory in use or
    made by another spec, an export that could not open, a backend that cannot run (exit status
    2). The report then holds no figures (``not_run``)."""

    @property
    def ended(self) -> str:
        """How the run ended, in words (``ended_words``): ``finished with 3 failed`` where it exits 1."""
        return ended_words(self.status, self.counts.failed, self.counts.cancelled)

    @property
    def exit_code(self) -> ExitStatus:
        """The command's exit status for this run (``ExitStatus``): journal unwritable beats refused
        beats stopped by an outage beats stopped (work left), which beats failed or cancelled, which
        beats drained; finished only when every task is done."""
        c = self.counts
        if self.journal_error:
            return ExitStatus.JOURNAL
        if self.refused:
            return ExitStatus.USAGE
        if self.stopped_by == "outage":
            return ExitStatus.OUTAGE
        if self.status == "stopped" or c.queued or c.running:
            return ExitStatus.STOPPED
        if c.failed or c.cancelled or self.status == "cancelled" or c.done != c.total:
            return ExitStatus.FAILED
        return ExitStatus.DRAINED if self.status == "drained" else ExitStatus.FINISHED


def not_run(pipeline: str, *, refused: str = "", journal_error: str = "", stopped_by: str = "") -> RunReport:
    """The report of a run that ended before its engine could report: refused (exit 2), a journal
    that could not be opened (6), or a SIGTERM or SIGINT while it started (``stopped_by =
    "signal"``: 4). Every count and figure is zero: nothing this process ran is in it (a resume's
    journal says what earlier runs did)."""
    return RunReport(
        pipeline=pipeline, status="stopped", backend="", backend_reason="", device="", lanes=0, batch_size=0,
        slot_depth=[], elapsed_s=0.0, first_batch_s=None,
        counts=ReportCounts(total=0, done=0, failed=0, cancelled=0, queued=0, running=0),
        throughput_tasks_s=0.0, throughput_bytes_s=0.0, steady_tasks_s=0.0, bound_tasks_s=0.0,
        serial_bound_tasks_s=0.0, overlap_efficiency=0.0, mean_phase_s={}, occupancy={}, stall_s={},
        divergence_max=0, serial_fraction=0.0, amdahl_ceiling={}, latency_p50_s=0.0, latency_p99_s=0.0, failures=[],
        refused=refused, journal_error=journal_error, stopped_by=stopped_by)
