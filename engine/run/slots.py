"""A lane's slots: a ring of them, each of four buffers allocated once and released on its own.

The decisions this module protects:
- A phase may write a buffer only when the phase that last read it (for the previous batch on that
  slot) is done, so each buffer carries the marker of its last reader (``release``) and the batch
  that holds it (``holder``).
- A buffer lives where its readers are: on the device, in pinned host memory, or in shared memory
  where worker processes read it (a lane's sink in processes: ``SlotRing.ensure_output``). It grows
  (rarely) only while free, and never shrinks.
- The ring's depth changes between batches: new slots are used next, removed ones finish their batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from warpdeck.engine.backends.base import Backend, Marker, NonfiniteCounter, done_marker
from warpdeck.engine.backends.shared_memory import SharedBuffer
from warpdeck.engine.run.process_host import ProcessHost
from warpdeck.engine.state.snapshot import SlotState, SlotView
from warpdeck.engine.state.task_states import Phase

__all__ = ["Buffer", "Slot", "SlotRing", "counted_outputs", "output_bytes"]

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


_SLOT_STATE: dict[Phase, SlotState] = {
    Phase.NONE: "free", Phase.FILL: "filling", Phase.H2D: "h2d", Phase.COMPUTE: "computing",
    Phase.D2H: "d2h", Phase.SINK: "readable"}


class SlotRing:
    """A lane's ring of ``depth`` slots and where their buffers live. ``readers`` are the worker
    processes that read the pinned outputs (a sink in processes), which then live in their shared
    memory; None: pinned memory of this process."""

    def __init__(self, backend: Backend, depth: int, readers: ProcessHost | None = None) -> None:
        self.backend = backend
        self.readers = readers
        self.slots: list[Slot] = [Slot(i) for i in range(depth)]
        self._ptr = 0
        self._next_index = depth
        self.reallocations = 0
        """Buffers allocated again, larger (a batch key larger than any before)."""

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots)

    @property
    def depth(self) -> int:
        return len(self.slots)

    def set_depth(self, depth: int) -> None:
        """Grow or shrink the ring; new slots are used next, removed ones finish their batches."""
        depth = max(2, depth)
        ring = self.slots
        while len(ring) < depth:
            ring.insert(self._ptr, Slot(self._next_index))
            self._next_index += 1
        if len(ring) > depth:
            self.slots, self._ptr = [ring[(self._ptr + i) % len(ring)] for i in range(depth)], 0

    def next(self) -> Slot:
        """The slot the next batch fills (it may still be in use: wait for its buffers' releases)."""
        slot = self.slots[self._ptr % len(self.slots)]
        self._ptr = (self._ptr + 1) % len(self.slots)
        return slot

    @property
    def nbytes(self) -> int:
        """Bytes held by the slots' buffers."""
        return sum(s.nbytes for s in self.slots)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's buffers (the first slot's: all grow alike)."""
        return self.slots[0].nbytes if self.slots else 0

    def ensure(self, b: Buffer, nbytes: int, device: bool) -> None:
        """``b`` (free) holds at least ``nbytes``, on the device or in pinned memory."""
        if b.cap >= nbytes:
            return
        if b.cap:
            self.reallocations += 1
        b.buf = self.backend.device_buffer(nbytes) if device else self.backend.host_buffer(nbytes)
        b.cap = nbytes

    def ensure_output(self, b: Buffer, nbytes: int) -> None:
        """A slot's pinned output (free) holds at least ``nbytes``, in shared memory where worker
        processes read it."""
        readers = self.readers
        if readers is None:
            self.ensure(b, nbytes, False)
            return
        if b.cap >= nbytes and b.shared is not None:
            return
        if b.shared is not None:
            self.reallocations += 1
            readers.release(b.shared)  # free: the batch that last used it is past its sink
        b.shared = readers.buffer(nbytes)
        b.buf, b.cap = b.shared.array, nbytes

    def views(self) -> tuple[SlotView, ...]:
        """Each slot as the control room shows it: what it holds, and which batch holds each buffer."""
        out = []
        for sl in self.slots:
            a, b, c, d = (buf.holder if not buf.release.done() else -1 for buf in sl.buffers())
            state = _SLOT_STATE[sl.newest_phase] if a >= 0 or b >= 0 or c >= 0 or d >= 0 or sl.newest_phase else "free"
            out.append(SlotView(sl.index, state, (a, b, c, d)))
        return tuple(out)


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
