"""The one door into the engine for the TUI, the CLI and library users.

Everything a front end needs is re-exported here: the engine, the spec loader, snapshot and
command types, and ``run_pipeline`` for a whole run in one call. Importing it loads neither
CuPy nor any UI library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warpdeck.engine.backends.base import Backend, BackendError
from warpdeck.engine.backends.select import select_backend
from warpdeck.engine.calibrate import advise, with_plan
from warpdeck.engine.control.broker import BrokerAddress, parse_broker
from warpdeck.engine.control.looping import LoopThread
from warpdeck.engine.control.plane import ControlSettings
from warpdeck.engine.control.recording_trace import trace_recording
from warpdeck.engine.control.remote import RemoteEngine, read_recording
from warpdeck.engine.control.signing import load_secret
from warpdeck.engine.control.wire import WireError
from warpdeck.engine.control.worker_auth import UNAUTHENTICATED
from warpdeck.engine.edges.config import PipelineSpec, SpecError, SpecIssue, load_spec, parse_spec
from warpdeck.engine.edges.executor_spec import resource_amounts
from warpdeck.engine.edges.exports import Exports, ExportSettings, exporting, parse_metrics_address
from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.journal import JournalError, RunDirError, SpecMismatch
from warpdeck.engine.edges.sinks import Sink
from warpdeck.engine.edges.sources import IterableSource, Source, open_source
from warpdeck.engine.edges.step_ledger import GateDecision, LedgerError
from warpdeck.engine.engine import Engine
from warpdeck.engine.hosted import HostedEngine
from warpdeck.engine.run.torch_stages import torch_stage
from warpdeck.engine.state.advice import Advice, BackendAdvice
from warpdeck.engine.state.board_columns import CANCELLED, COLUMN_CODES, DONE, FAILED, NOWHERE, STALLED, column_codes
from warpdeck.engine.state.bottleneck import DeviceWaits, HostThreads, describe_bottleneck, more_lanes_words
from warpdeck.engine.state.commands import (
    COMMAND_ADAPTER,
    Cancel,
    Command,
    CommandResult,
    Drain,
    Pause,
    Quarantine,
    Release,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
)
from warpdeck.engine.state.metrics import Figures
from warpdeck.engine.state.part_views import FeederState, LinkView, OutageView, WorkerState
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.report import EXIT_STATUS_HELP, ExitStatus, ReportOutages, RunReport, not_run
from warpdeck.engine.state.run_events import (
    BatchFinished,
    CommandEvent,
    RunEvent,
    RunEvents,
    StallEvent,
    WorkerConvicted,
    WorkerGone,
    WorkerReborn,
    WorkerWaiting,
    worker_line,
)
from warpdeck.engine.state.slot_depth import DEPTH_MAX, DEPTH_MIN
from warpdeck.engine.state.snapshot import (
    ControlView,
    Counts,
    DetailState,
    EngineSnapshot,
    EngineStatus,
    FeederView,
    HostProcess,
    LaneStatus,
    LaneView,
    SlotState,
    SlotView,
    SnapshotPublisher,
    StalledTask,
    TaskDetail,
    TaskFailure,
    TaskView,
    WorkerView,
    ended_words,
)
from warpdeck.engine.state.step_report import GateView, SegmentReport, StepsReport, result_words
from warpdeck.engine.state.task_states import (
    ALL_QUARANTINED,
    Phase,
    PhaseName,
    StallName,
    StallReason,
    State,
    StateName,
)
from warpdeck.engine.state.task_story import AttemptStory, PhaseTime, StallEpisode, StoryOutcome, seconds_text
from warpdeck.engine.state.tasks import AttemptOutcome, TaskAttempt
from warpdeck.engine.steps.plan import Segment, plan_steps, step_words
from warpdeck.engine.steps.runner import GateAsk, StepRun, run_steps

__all__ = [
    "ALL_QUARANTINED",
    "CANCELLED",
    "COLUMN_CODES",
    "COMMAND_ADAPTER",
    "DEPTH_MAX",
    "DEPTH_MIN",
    "DONE",
    "EXIT_STATUS_HELP",
    "FAILED",
    "NOWHERE",
    "STALLED",
    "UNAUTHENTICATED",
    "Advice",
    "AttemptOutcome",
    "AttemptStory",
    "Backend",
    "BackendAdvice",
    "BackendError",
    "BatchFinished",
    "BatchRecord",
    "BrokerAddress",
    "Cancel",
    "Command",
    "CommandEvent",
    "CommandResult",
    "ControlSettings",
    "ControlView",
    "Counts",
    "DetailState",
    "DeviceWaits",
    "Drain",
    "Engine",
    "EngineSnapshot",
    "EngineStatus",
    "ExitStatus",
    "ExportSettings",
    "Exports",
    "FeederState",
    "FeederView",
    "Figures",
    "GateAsk",
    "GateDecision",
    "GateView",
    "HostProcess",
    "HostThreads",
    "HostedEngine",
    "InputError",
    "IterableSource",
    "JournalError",
    "LaneStatus",
    "LaneView",
    "LedgerError",
    "LinkView",
    "LoopThread",
    "OutageView",
    "Pause",
    "Phase",
    "PhaseName",
    "PhaseTime",
    "PipelineSpec",
    "Quarantine",
    "Release",
    "RemoteEngine",
    "ReportOutages",
    "RequeueStalled",
    "Resume",
    "RetryFailed",
    "RunDirError",
    "RunEvent",
    "RunEvents",
    "RunReport",
    "Segment",
    "SegmentReport",
    "SetDepth",
    "Sink",
    "SlotState",
    "SlotView",
    "SnapshotPublisher",
    "Source",
    "SpecError",
    "SpecIssue",
    "SpecMismatch",
    "StallEpisode",
    "StallEvent",
    "StallName",
    "StallReason",
    "StalledTask",
    "State",
    "StateName",
    "StepRun",
    "StepsReport",
    "StoryOutcome",
    "TaskAttempt",
    "TaskDetail",
    "TaskFailure",
    "TaskView",
    "WireError",
    "WorkerConvicted",
    "WorkerGone",
    "WorkerReborn",
    "WorkerState",
    "WorkerView",
    "WorkerWaiting",
    "advise",
    "check_executor",
    "column_codes",
    "describe_bottleneck",
    "ended_words",
    "exporting",
    "load_secret",
    "load_spec",
    "more_lanes_words",
    "not_run",
    "open_source",
    "parse_broker",
    "parse_metrics_address",
    "parse_spec",
    "plan_steps",
    "ray_log_grew",
    "ray_log_size",
    "read_recording",
    "resource_amounts",
    "result_words",
    "run_pipeline",
    "run_steps",
    "seconds_text",
    "select_backend",
    "step_words",
    "torch_stage",
    "trace_recording",
    "with_plan",
    "worker_line",
]


async def run_pipeline(spec: PipelineSpec, run_dir: Path | str | None = None, *,
                       backend: Backend | None = None, source: Source | None = None,
                       sink: Sink | None = None, retry_failed: bool = False) -> RunReport:
    """Run ``spec`` to the end and return its report; with a ``run_dir`` the run is journaled
    there and resumes what an earlier run in it left (``retry_failed``: failed tasks too)."""
    async with Engine(spec, run_dir, backend=backend, source=source, sink=sink, retry_failed=retry_failed) as engine:
        return await engine.wait()


# Scale-out code loads only where a Ray run or its check asks for it (a local run never does).
def check_executor(spec: PipelineSpec, problems: list[str]) -> dict[str, Any]:
    """``warpdeck check``'s findings on the spec's executor (engine/scaleout/cluster_check.py)."""
    from warpdeck.engine.scaleout.cluster_check import check_executor as check  # noqa: PLC0415

    return check(spec, problems)


def ray_log_size(run_dir: Path) -> int:
    """The size of a run directory's ray.log (Ray's warnings and the actors' output), 0 if none."""
    from warpdeck.engine.scaleout.reach import RayLog  # noqa: PLC0415

    return RayLog.size(run_dir)


def ray_log_grew(run_dir: Path, before: int) -> Path | None:
    """The run directory's ray.log if it grew past ``before`` bytes during a run, else None."""
    from warpdeck.engine.scaleout.reach import RayLog  # noqa: PLC0415

    return RayLog.grew(run_dir, before)
