"""Task states, phases and stall reasons, how each is spelt, and the legal moves between them.

The decision this module protects: every task is in exactly one state, and a state changes only
through ``check_transition``'s rules, which the table (engine/state/tasks.py) enforces, raising
``IllegalTransition`` on anything else. Each enum's spelling on the wire is a ``Literal`` checked
against the enum when this module loads, so the two cannot drift apart.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args

__all__ = [
    "ALL_QUARANTINED",
    "RUN_PHASES",
    "IllegalTransition",
    "Phase",
    "PhaseName",
    "StallName",
    "StallReason",
    "State",
    "StateName",
    "check_transition",
]

StateName = Literal["queued", "running", "done", "failed", "cancelled"]
"""How snapshots, the wire and the control room spell a ``State``, a ``Phase`` and a ``StallReason``: each member's name
in lower case, in member order (checked against the enums when this module loads, so the two cannot drift apart). The
columns hold the enums' numbers; ``.label`` gives these."""
PhaseName = Literal["none", "fill", "h2d", "compute", "d2h", "sink"]
StallName = Literal["none", "memory", "control", "backpressure", "worker_lost", "hung"]


class State(enum.IntEnum):
    """Lifecycle state of a task's current attempt."""

    QUEUED = 0
    RUNNING = 1
    DONE = 2
    FAILED = 3
    CANCELLED = 4

    @property
    def terminal(self) -> bool:
        """True for states an attempt never leaves."""
        return self >= State.DONE

    @property
    def label(self) -> StateName:
        """The state as snapshots and the wire spell it (``"running"``)."""
        return _STATE_LABELS[self]


class Phase(enum.IntEnum):
    """Where a running task is in its lane; NONE for tasks that are not running."""

    NONE = 0
    FILL = 1
    H2D = 2
    COMPUTE = 3
    D2H = 4
    SINK = 5

    @property
    def label(self) -> PhaseName:
        """The phase as snapshots and the wire spell it (``"compute"``)."""
        return _PHASE_LABELS[self]


RUN_PHASES: tuple[Phase, ...] = (Phase.FILL, Phase.H2D, Phase.COMPUTE, Phase.D2H, Phase.SINK)


class StallReason(enum.IntEnum):
    """Why a non-terminal task is not progressing (DESIGN.md section 3)."""

    NONE = 0
    MEMORY = 1
    CONTROL = 2
    BACKPRESSURE = 3
    WORKER_LOST = 4
    HUNG = 5

    @property
    def label(self) -> StallName:
        """The reason as snapshots and the wire spell it (``"worker_lost"``)."""
        return _STALL_LABELS[self]


_E = TypeVar("_E", bound=enum.IntEnum)


def _labels(members: type[_E], names: tuple[Any, ...]) -> dict[_E, Any]:
    """Each member with its spelling: the Literal's names in member order, which must be the
    members' own names in lower case (a member added to one and not the other fails here, at import)."""
    labels = dict(zip(members, names, strict=True))
    wrong = [f"{m.name} spelled {n!r}" for m, n in labels.items() if m.name.lower() != n]
    if wrong:
        raise TypeError(f"{members.__name__}: {', '.join(wrong)}")
    return labels


_STATE_LABELS: Mapping[State, StateName] = _labels(State, get_args(StateName))
_PHASE_LABELS: Mapping[Phase, PhaseName] = _labels(Phase, get_args(PhaseName))
_STALL_LABELS: Mapping[StallReason, StallName] = _labels(StallReason, get_args(StallName))


ALL_QUARANTINED = "every worker quarantined"
"""The control stall's note on tasks that cannot start because every worker is quarantined (the control room names that
state from it)."""


class IllegalTransition(ValueError):
    """A state change the rules forbid; carries what was attempted so the caller can report it."""

    def __init__(self, key: str, state: State, phase: Phase, to_state: State, to_phase: Phase) -> None:
        self.key = key
        self.state = state
        self.phase = phase
        self.to_state = to_state
        self.to_phase = to_phase
        super().__init__(
            f"task {key!r}: illegal transition {state.name.lower()}/{phase.name.lower()}"
            f" -> {to_state.name.lower()}/{to_phase.name.lower()}"
        )


def check_transition(state: State, phase: Phase, to_state: State, to_phase: Phase) -> bool:
    """Whether (state, phase) -> (to_state, to_phase) is legal. Pure; used by the table and tests.

    Legal moves: queued -> running/fill; running phases advance one step at a time
    (fill -> h2d -> compute -> d2h -> sink); running/sink -> done; queued or running -> failed or
    cancelled. Terminal states go nowhere. Requeueing a running task is not a transition: it is a
    new attempt (see ``TaskTable.new_attempt``).
    """
    if state.terminal:
        return False
    if to_state is State.RUNNING:
        if to_phase is Phase.NONE:
            return False
        if state is State.QUEUED:
            return to_phase is Phase.FILL
        return phase is not Phase.NONE and to_phase == phase + 1
    if to_phase is not Phase.NONE:
        return False
    if to_state is State.DONE:
        return state is State.RUNNING and phase is Phase.SINK
    return to_state in (State.FAILED, State.CANCELLED)
