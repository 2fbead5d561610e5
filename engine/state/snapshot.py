"""Immutable engine snapshots and the latest-wins publisher.

The decisions this module protects:
- The UI (in process or attached) sees the engine only through ``EngineSnapshot``: frozen,
  self-contained, cheap to make (the task table's state columns are copied, a few MB for a million
  tasks; keys are shared because they are append-only), and published latest-wins, so a slow reader
  skips snapshots and never slows the engine.
- Every field that names a state is typed with the states it can hold (a ``Literal`` defined once,
  or the enum that owns the state), so a misspelt state is a type error, and the wire refuses one it
  decodes. Its mappings (counts by name, figures) are read-only (engine/state/read_only.py): no
  reader can change what every reader sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from warpdeck.engine.state.metrics import Figures
from warpdeck.engine.state.part_views import FeederState, LinkView, OutageView, WorkerState
from warpdeck.engine.state.read_only import NamedCounts, set_read_only
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.task_states import Phase, PhaseName, StallName, StallReason, State, StateName
from warpdeck.engine.state.task_story import AttemptStory, StallEpisode
from warpdeck.engine.state.tasks import TaskAttempt

__all__ = [
    "FINISHED_STATUSES",
    "ControlView",
    "Counts",
    "DetailState",
    "EngineSnapshot",
    "EngineStatus",
    "FeederView",
    "HostProcess",
    "LaneStatus",
    "LaneView",
    "SlotState",
    "SlotView",
    "SnapshotPublisher",
    "StalledTask",
    "TaskDetail",
    "TaskFailure",
    "TaskView",
    "WorkerView",
    "ended_words",
]

EngineStatus = Literal["starting", "running", "stopped", "cancelled", "drained", "finished"]
"""The engine's status: ``starting`` until the run begins, ``running`` until it ends, then how it ended
(engine/engine.py, ``Engine._final_status``): ``stopped`` with work left (an outage, a journal failure, a cancelled run
task), ``cancelled`` (everything cancelled), ``drained`` (the source was drained) or ``finished``."""
FINISHED_STATUSES: frozenset[EngineStatus] = frozenset(("finished", "drained", "cancelled"))
"""The statuses of a run that ended with nothing left to do (``stopped`` left work for a resume)."""


def ended_words(status: str, failed: int, cancelled: int) -> str:
    """How a run that ended reads, in every place that says it: ``finished`` only when nothing
    failed or was cancelled, else ``finished with 3 failed, 2 cancelled`` (the exit status is 1)."""
    if status not in ("finished", "drained") or not (failed or cancelled):
        return status
    lost = [f"{failed:,} failed"] * bool(failed) + [f"{cancelled:,} cancelled"] * bool(cancelled)
    return f"{status} with {', '.join(lost)}"
LaneStatus = Literal["starting", "waiting for slot", "waiting for input", "filling", "waiting for the actor",
                     "worker gone", "stopped"]
"""What a lane is doing (engine/run/lanes.py; a Ray lane, engine/scaleout/dispatch.py, waits for its actor and may find
its worker gone)."""
SlotState = Literal["free", "filling", "h2d", "computing", "d2h", "readable"]
"""A slot as its newest batch's phase leaves it: ``readable`` once its output waits for the sink."""
DetailState = StateName | Literal["unknown"]
"""A task's state in its detail; ``unknown`` for a key an attached control room's telemetry did not sample
(engine/control/telemetry.py, ``detail_from``)."""


@dataclass(frozen=True, slots=True)
class Counts:
    """Tasks per state; running split by phase; stalled by reason (stalled tasks are also
    counted in their state)."""

    queued: int
    running: NamedCounts
    """Running tasks by phase name (``fill`` to ``sink``)."""
    done: int
    failed: int
    cancelled: int
    stalled: NamedCounts
    """Stalled tasks by stall name (``memory`` to ``hung``)."""
    total: int
    """Tasks admitted so far (every state above)."""
    expected: int | None
    """Tasks the source will yield in this run, when it knows (a resume's leaves out ``earlier``)."""
    earlier: int = 0
    """Tasks an earlier run in this run directory finished: done there, not run again here."""

    def __post_init__(self) -> None:
        set_read_only(self, "running", "stalled")

    @property
    def running_total(self) -> int:
        return sum(self.running.values())

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.cancelled

    @property
    def to_come(self) -> int | None:
        """Tasks the source has still to yield (not yet admitted), when it knows its total."""
        return None if self.expected is None else max(0, self.expected - self.total)

    @property
    def done_all(self) -> int:
        """Done tasks, counting those an earlier run did: the progress a person reads."""
        return self.done + self.earlier

    @property
    def whole(self) -> int | None:
        """Every task of the spec when the source knows its total: this run's and ``earlier``.
        Not yet admitted, queued, running, done, failed and cancelled (stalled ones stand in their
        state) and ``earlier`` add up to it."""
        return None if self.expected is None else max(self.expected, self.total) + self.earlier

    @property
    def out_of(self) -> int:
        """What progress counts against: ``whole`` where known, else every task known so far."""
        whole = self.whole
        return whole if whole is not None else self.total + self.earlier

    @property
    def finished_all(self) -> int:
        """Finished tasks (done, failed, cancelled), counting those an earlier run did."""
        return self.finished + self.earlier


@dataclass(frozen=True, slots=True)
class TaskView:
    """The task table as of one snapshot. Arrays are read-only copies; rows are stable."""

    keys: list[str]
    state: npt.NDArray[np.int8]
    phase: npt.NDArray[np.int8]
    stall: npt.NDArray[np.int8]
    attempt: npt.NDArray[np.int16]

    def __len__(self) -> int:
        return len(self.state)

    def key(self, row: int) -> str:
        return self.keys[row]

    def rows(self, state: State | None = None, phase: Phase | None = None,
             stalled: bool | None = None) -> npt.NDArray[np.int64]:
        """Rows matching every given condition, in table order."""
        mask = np.ones(len(self.state), bool)
        if state is not None:
            mask &= self.state == state
        if phase is not None:
            mask &= self.phase == phase
        if stalled is not None:
            mask &= (self.stall != 0) == stalled
        return np.flatnonzero(mask)


@dataclass(frozen=True, slots=True)
class StalledTask:
    """One stalled task: why, for how long, and where."""

    key: str
    reason: StallName
    stalled_s: float
    state: StateName
    phase: PhaseName
    note: str


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """A failed task's key and the reason (the traceback is in ``TaskDetail``)."""

    key: str
    reason: str
    attempt: int


@dataclass(frozen=True, slots=True)
class TaskDetail:
    """Everything the detail view shows for one task. A task is known to the engine once the feeder
    admits it; before that (``admitted`` False) the detail says where it stands in ``note``: a task
    the source will still yield, or one an earlier run of the run directory finished."""

    key: str
    state: DetailState
    phase: PhaseName
    attempt: int
    """The current attempt's number; the first is 1."""
    batch: int
    stall: StallName
    stall_note: str
    error: str
    traceback: str
    history: tuple[TaskAttempt, ...]
    flag: str = ""
    """Why a done task's output is suspect (non-finite values under ``nonfinite = "flag"``)."""
    admitted: bool = True
    """False for a task not in this run's table: not admitted yet, or finished by an earlier run."""
    note: str = ""
    """Where a task not in the table stands, in words ("queued (not yet admitted)")."""
    attempts: tuple[AttemptStory, ...] = ()
    """Its whole story (engine/run/stories.py); empty where the detail comes from telemetry or the journal. Every
    attempt, oldest first: batch, lane, slot, worker, epoch, queue wait, phase times."""
    stalls: tuple[StallEpisode, ...] = ()
    """Its batches' finished stalls (the longest few), oldest first."""
    input_from: str = ""
    """Where its input comes from (a path, an index) with dtype and shape; where its output landed."""
    output_to: str = ""
    why: str = ""
    """Why it took as long as it did, in one line ("waited 1.2 s in queue behind backpressure; compute 11 ms")."""
    admitted_at_s: float | None = None
    """When it was admitted, seconds since the run's start."""


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot; ``holders`` are the batch ids holding its pinned input, device input, device
    output and pinned output (-1: free)."""

    index: int
    state: SlotState
    holders: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class LaneView:
    """One lane: its ring and what it is doing."""

    id: int
    depth: int
    status: LaneStatus
    output_blocked: bool
    batches_done: int
    nbytes: int
    slots: tuple[SlotView, ...]
    fill_workers: int = 1
    """Threads loading inputs and writing outputs (engine/run/autotune.py tunes them)."""
    sink_workers: int = 1
    fill_processes: tuple[HostProcess, ...] = ()
    """Where fills run in worker processes (``[host] fill_pool``): each one, one per fill thread."""
    sink_processes: tuple[HostProcess, ...] = ()
    """Where outputs are written in worker processes (``[host] sink_pool``): each one, one per sink thread."""


@dataclass(frozen=True, slots=True)
class HostProcess:
    """One fill or sink worker process: its pid, the batches it loaded or wrote, and the share of its
    life it spent on them."""

    pid: int
    batches: int
    busy_share: float


@dataclass(frozen=True, slots=True)
class FeederView:
    """The feeder's watermarks and state: the feeder's own while the engine runs, the engine's status
    before and after."""

    state: FeederState | EngineStatus
    ready: int
    low: int
    high: int
    admitted: int
    exhausted: bool
    auto_depth: bool
    depth_changes: int


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker (a device with its lanes) as the control room lists it.

    ``state`` is online, late, stale, hung, dead or quarantined. The in-process worker is the engine
    itself, so it has no heartbeat: ``heartbeat_age_s`` and ``phi`` are None until a worker speaks
    over MQTT. Device figures are None where the device cannot report them (NumPy on a CPU)."""

    id: str
    state: WorkerState
    host: str
    pid: int
    device: str
    epoch: int
    lanes: int
    lanes_busy: int
    progress: int
    """Batches this worker has finished; a heartbeat carries it so a frozen worker shows."""
    tasks_done: int
    tasks_failed: int
    heartbeat_age_s: float | None = None
    phi: float | None = None
    util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    note: str = ""
    """Why the worker is not working, where the engine knows (a Ray actor Ray is restarting: ``restarting: waiting for 1
    GPU`` while no node has room); "" otherwise."""


@dataclass(frozen=True, slots=True)
class ControlView:
    """The control plane as of one snapshot: where its broker is, whether it is connected, and what
    it refused (commands, by reason) or dropped (messages, by reason) at the socket."""

    broker: str
    connected: bool
    commands_applied: int
    commands_refused: NamedCounts
    dropped: NamedCounts
    reconnects: int
    error: str = ""
    input_lag_s: float = 0.0
    """How far behind the monitor's input ran at the last tick (seconds), and how many times that lag held silence
    verdicts (engine/control/lag.py)."""
    lag_holds: int = 0
    workers_signed: bool = True
    """Whether worker messages are signed (a secret is set): without, anyone who can publish to the broker can forge a
    worker's birth, heartbeat or death (engine/control/worker_auth.py)."""
    workers_lost: int = 0
    """Workers of this run convicted dead, and worker records forgotten (dead, or never heard, for the monitor's
    ``forget_after_s``, or to make room under its ``max_workers``)."""
    workers_forgotten: int = 0
    stopped: bool = False
    """The plane stopped on an error (``error`` says which) and will not come back this run: no worker is heard, no
    command from another room arrives; the run goes on."""

    def __post_init__(self) -> None:
        set_read_only(self, "commands_refused", "dropped")


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The whole engine at one instant. ``t`` is seconds since the engine started; timeline
    records are on ``time.perf_counter``'s clock, with ``t0`` the engine's start on it."""

    seq: int
    t: float
    t0: float
    pipeline: str
    status: EngineStatus
    backend: str
    backend_reason: str
    device: str
    counts: Counts
    tasks: TaskView
    stalled: tuple[StalledTask, ...]
    lanes: tuple[LaneView, ...]
    feeder: FeederView
    timeline: tuple[BatchRecord, ...]
    figures: Figures
    failures: tuple[TaskFailure, ...]
    workers: tuple[WorkerView, ...] = ()
    control: ControlView | None = None
    """None when the engine runs without a control plane."""
    outage: OutageView | None = None
    """Set while writes are held by a full, read-only or failing disk (engine/edges/outage.py)."""
    link: LinkView | None = None
    """In an attached control room: its link to the engine (engine/control/link_meter.py); else None."""
    column_totals: NamedCounts | None = None
    """Where ``tasks`` is a sample (an attached room's, from telemetry): every board column's size, by telemetry's
    column names (``engine/control/compact.py``, ``ColumnName``); else None."""

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


STALL_NAMES = {r.label: r for r in StallReason if r}


class SnapshotPublisher:
    """Holds the latest snapshot; readers always get the newest and skip what they missed."""

    def __init__(self) -> None:
        self._latest: EngineSnapshot | None = None
        self._changed = asyncio.Event()
        self._closed = False
        self._callbacks: list[Callable[[EngineSnapshot], None]] = []

    @property
    def latest(self) -> EngineSnapshot | None:
        return self._latest

    def publish(self, snap: EngineSnapshot) -> None:
        """Replace the latest snapshot and wake every reader."""
        self._latest = snap
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()
        for cb in list(self._callbacks):
            cb(snap)

    def close(self) -> None:
        """No more snapshots: readers end after the last one."""
        self._closed = True
        self._changed.set()

    def subscribe(self, callback: Callable[[EngineSnapshot], None]) -> Callable[[], None]:
        """Call ``callback`` with each new snapshot (it must be quick: post a message and return).
        Returns a function that unsubscribes."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    async def stream(self) -> AsyncIterator[EngineSnapshot]:
        """Each newer snapshot, latest-wins, until the publisher closes."""
        seen = -1
        while True:
            snap = self._latest
            if snap is not None and snap.seq > seen:
                seen = snap.seq
                yield snap
                continue
            if self._closed:
                return
            await self._changed.wait()
