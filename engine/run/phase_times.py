"""A batch's phase intervals and CPU times, read from the markers of the jobs that ran it.

The decision this module protects: the intervals come from the markers alone (a device-timed
marker's ``clock``, else its host stamps), on ``time.perf_counter``'s time base, read once a batch
is over: in-process lanes and Ray lanes build their records the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from warpdeck.engine.backends.base import Marker
from warpdeck.engine.state.task_states import RUN_PHASES

__all__ = ["phase_cpu", "phase_spans"]


def phase_spans(markers: Sequence[Marker]) -> list[tuple[float, float]]:
    """(start, end) per phase in RUN_PHASES order from the markers that ran (a running one ends
    now); (0, 0) for a phase none of them reached. A marker the device timed (``clock``) gives
    the device's interval, on the same time base."""
    phases = [(0.0, 0.0)] * len(RUN_PHASES)
    for m in markers:
        if m.clock is not None and m.done() and m.failed() is None:
            phases[m.phase - 1] = m.clock()
        elif m.t0:
            phases[m.phase - 1] = (m.t0, m.t1 or time.perf_counter())
    return phases


def phase_cpu(markers: Sequence[Marker]) -> tuple[float, ...]:
    """CPU seconds each phase's thread spent on the batch, in RUN_PHASES order (0 where none ran;
    a device phase's is the host's cost of queueing it)."""
    cpu = [0.0] * len(RUN_PHASES)
    for m in markers:
        cpu[m.phase - 1] = m.cpu
    return tuple(cpu)


