"""Operator commands: typed, so the TUI, the CLI and the wire all say the same thing.

Every command is a pydantic model tagged by ``kind``; ``COMMAND_ADAPTER`` validates one from
JSON. The engine answers each with a ``CommandResult``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from warpdeck.engine.state.slot_depth import DEPTH_MAX, DEPTH_MIN

__all__ = [
    "COMMAND_ADAPTER",
    "Cancel",
    "Command",
    "CommandResult",
    "Drain",
    "Pause",
    "Quarantine",
    "Release",
    "RequeueStalled",
    "Resume",
    "RetryFailed",
    "SetDepth",
]


class _Cmd(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pause(_Cmd):
    """Stop handing batches to lanes; batches in flight finish."""

    kind: Literal["pause"] = "pause"


class Resume(_Cmd):
    """Undo pause."""

    kind: Literal["resume"] = "resume"


class Drain(_Cmd):
    """Admit nothing more from the source, finish everything admitted, then stop."""

    kind: Literal["drain"] = "drain"


class Cancel(_Cmd):
    """Cancel the named tasks, or every unfinished task with ``all``."""

    kind: Literal["cancel"] = "cancel"
    keys: tuple[str, ...] = ()
    all: bool = False


class RetryFailed(_Cmd):
    """Give failed (or the named failed) tasks a new attempt."""

    kind: Literal["retry_failed"] = "retry_failed"
    keys: tuple[str, ...] = ()


class RequeueStalled(_Cmd):
    """Send stalled tasks still waiting in the ready queue back to its front."""

    kind: Literal["requeue_stalled"] = "requeue_stalled"


class SetDepth(_Cmd):
    """Set the slot depth (the slot ring's length) of every lane, or of one; turns auto off."""

    kind: Literal["set_depth"] = "set_depth"
    depth: int = Field(ge=DEPTH_MIN, le=DEPTH_MAX)
    lane: int | None = None


class Quarantine(_Cmd):
    """Give a worker no new batches (its batches in flight finish) until it is released."""

    kind: Literal["quarantine"] = "quarantine"
    worker: str = Field(min_length=1, max_length=128)


class Release(_Cmd):
    """Undo quarantine: the worker gets batches again."""

    kind: Literal["release"] = "release"
    worker: str = Field(min_length=1, max_length=128)


Command = Annotated[Pause | Resume | Drain | Cancel | RetryFailed | RequeueStalled | SetDepth | Quarantine | Release,
                    Field(discriminator="kind")]
COMMAND_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did: whether it applied, how many tasks it touched, in words; and whether it
    changed anything (``changed``: False for ``pause`` while paused, ``release`` of a worker not
    quarantined: nothing for an undo to reverse)."""

    ok: bool
    affected: int
    message: str
    changed: bool = True
