"""The depth of a lane's slot ring, and its bounds: one word and one constant for one idea.

The depth is how many batches a lane holds in flight, each in a slot of its own (two: double
buffering, the host fills one slot while the device computes on the other). The spec calls it
``slot_depth`` (and the most the tuner may grow it, ``[feeder] max_depth``), the ``SetDepth``
command and ``:depth`` set it, and the control room, the report and the metrics call it the slot
depth (never prefetch or ring depth). Every bound on it, in the spec, the command and the room's
keys, is these two.
"""

from __future__ import annotations

__all__ = ["DEPTH_MAX", "DEPTH_MIN"]

DEPTH_MIN = 2
"""Fewer than two slots and nothing overlaps."""
DEPTH_MAX = 64
"""More slots than this buy nothing a lane can use and hold pinned memory for it."""
