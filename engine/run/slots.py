"""A lane's slot: four buffers, each allocated once and released on its own.

The decision this module protects: a phase may write a buffer only when the phase that last read
it (for the previous batch on that slot) is done, so each buffer carries the marker of its last
reader (``release``) and the batch that holds it (``holder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warpdeck.engine.backends.base import Marker, done_marker
from warpdeck.engine.state.tasks import Phase

__all__ = ["Buffer", "Slot"]


class Buffer:
    """One buffer of a slot: grows (rarely) only while free."""

    __slots__ = ("buf", "cap", "holder", "release")

    def __init__(self, phase: Phase) -> None:
        self.buf: Any = None
        self.cap = 0
        self.holder = -1
        self.release: Marker = done_marker(phase)


@dataclass(eq=False)
class Slot:
    """Four buffers; ``release`` of each is the marker of the phase that last read it."""

    index: int
    host_in: Buffer = field(default_factory=lambda: Buffer(Phase.H2D))
    dev_in: Buffer = field(default_factory=lambda: Buffer(Phase.COMPUTE))
    dev_out: Buffer = field(default_factory=lambda: Buffer(Phase.D2H))
    host_out: Buffer = field(default_factory=lambda: Buffer(Phase.SINK))
    mids: list[Buffer] = field(default_factory=list)
    newest: int = -1
    newest_phase: Phase = Phase.NONE

    def buffers(self) -> tuple[Buffer, Buffer, Buffer, Buffer]:
        return (self.host_in, self.dev_in, self.dev_out, self.host_out)

    @property
    def nbytes(self) -> int:
        return sum(b.cap for b in self.buffers()) + sum(m.cap for m in self.mids)
