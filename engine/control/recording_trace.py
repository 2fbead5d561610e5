"""A recording (``attach --record``) as a trace file (``replay FILE --trace OUT``).

The decision this module protects: reading a recording is the control plane's (the wire's
telemetry, ``remote.read_recording``), writing a trace is an export's (``edges/trace_export.py``);
this module joins the two from above, so the exports never import the control plane.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from pathlib import Path

from warpdeck.engine.control.remote import read_recording
from warpdeck.engine.edges.trace_export import TraceWriter, lane_owners
from warpdeck.engine.state.records import BatchRecord
from warpdeck.engine.state.run_events import BatchFinished
from warpdeck.engine.state.snapshot import EngineSnapshot

__all__ = ["trace_recording"]


def _frames(recording: Path) -> Generator[tuple[EngineSnapshot, tuple[BatchRecord, ...]]]:
    """Each snapshot of a recording with the batch records that are new in it (read_recording gives
    the gathered timeline; the records it keeps are the same objects from frame to frame)."""
    last: BatchRecord | None = None
    for snap in read_recording(recording):
        tl = snap.timeline
        at = next((i for i in range(len(tl) - 1, -1, -1) if tl[i] is last), -1) if last is not None else -1
        yield snap, tl[at + 1:]
        if tl:
            last = tl[-1]


def trace_recording(recording: Path, out: Path) -> int:
    """The trace of an ``attach --record`` file: its batches and counters (a recording holds no
    stalls, commands or convictions). Returns the number of trace events written; ``ValueError``
    for a file with no telemetry in it (nothing is written then)."""
    frames = _frames(recording)
    try:
        first = next(frames, None)
        if first is None:
            raise ValueError(f"{recording}: no telemetry in it (is it a warpdeck --record file?)")
        writer = TraceWriter(out, first[0].pipeline)
        last: EngineSnapshot | None = None
        try:
            for snap, new in itertools.chain((first,), frames):
                last = snap  # its records are on its clock: seconds since the run's start (t0 0)
                writer.on_snapshot(snap)
                owners = lane_owners(snap)
                for rec in new:
                    w = owners.get(rec.lane)
                    worker, epoch = (w.id, w.epoch) if w is not None else ("recorded", 0)
                    writer.on_event(BatchFinished(rec, worker, epoch))
        finally:
            writer.close(last)
    finally:
        frames.close()
    return writer.events
