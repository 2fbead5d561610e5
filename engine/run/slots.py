"""A lane's slot: four buffers, each allocated once and released on its own.

The decision this module protects: a phase may write a buffer only when the phase that last read
it (for the previous batch on that slot) is done, so each buffer carries the marker of its last
reader (``release``) and the batch that holds it (``holder``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from warpdeck.engine.backends.base import Backend, Marker, NonfiniteCounter, done_marker
from warpdeck.engine.backends.shared_memory import SharedBuffer
from warpdeck.engine.state.task_states import Phase

__all__ = ["Buffer", "Slot", "counted_outputs", "output_bytes"]

_COUNT, _BYTE = np.dtype(np.int32), np.dtype(np.uint8)
"""The dtype of the device's per-row non-finite counts, and of raw buffer bytes."""


class Buffer:
    """One buffer of a slot: grows (rarely) only while free."""

    __slots__ = ("buf", "cap", "holder", "release", "shared")

    def __init__(self, phase: Phase) -> None:
        self.buf: Any = None
        self.cap = 0
        self.shared: SharedBuffer | None = None
        """Where ``buf`` is shared memory a worker process writes: its name there (else None)."""
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


def _counts_at(rows: int, row_bytes: int) -> int:
    """Byte offset of a batch's non-finite counts in its output buffers: right after its ``rows``
    outputs, 8-byte aligned (an int32 kernel store must be aligned)."""
    return -(-rows * row_bytes // 8) * 8


def output_bytes(rows: int, row_bytes: int, counter: NonfiniteCounter | None) -> int:
    """Bytes of an output buffer for ``rows`` outputs, with room for their non-finite counts where
    the device makes them (``counter``)."""
    if counter is None:
        return rows * row_bytes
    return _counts_at(rows, row_bytes) + _COUNT.itemsize * rows


def counted_outputs(be: Backend, slot: Slot, rows: int, row_bytes: int) -> tuple[Any, Any, Any, Any]:
    """Where the device counts each row's non-finite outputs, the counts travel back in the same
    d2h, in the output buffers right after the rows: the d2h's destination and source (the rows
    and the counts, as bytes), and the counts on the device and on the host."""
    at = _counts_at(rows, row_bytes)
    end = at + _COUNT.itemsize * rows
    return (be.view(slot.host_out.buf, (end,), _BYTE), be.view(slot.dev_out.buf, (end,), _BYTE),
            be.view(slot.dev_out.buf[at:], (rows,), _COUNT), be.view(slot.host_out.buf[at:], (rows,), _COUNT))
