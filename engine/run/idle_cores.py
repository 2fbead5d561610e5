"""The cores this process may run on that sat idle over a window: what the machine left spare.

The decisions this module protects:
- The tuner reads fill threads that burn little CPU, with cores to spare, as taking turns on one
  GIL, and moves the fill to processes on trial. "Spare" counted from this process alone misses
  every other process. A CI job shared the 2-core VM, and two image-decoding threads burned 0.92
  cores between them. The tuner read them as GIL-bound, though Pillow lets the GIL go, and moved
  the fill to processes. The kernel's count of idle time says what was spare.
- Only the CPUs in this process's affinity count. Where ``/proc/stat`` cannot be read (not Linux),
  or a window is too short to tick, there is no figure, and the tuner judges as it did without one.
- The counts are in USER_HZ ticks (10 ms), so a 0.3 s window on 2 cores reads to about a tenth
  of a core.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["IdleCores"]

_STAT = Path("/proc/stat")
_IDLE, _IOWAIT, _BUSY_FIELDS = 3, 4, 8
"""``cpuN`` fields: user nice system idle iowait irq softirq steal (guest time is inside user)."""


def _affinity() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return frozenset(range(os.cpu_count() or 1))


def _ticks(cpus: frozenset[int]) -> tuple[int, int] | None:
    """(idle, total) ticks of ``cpus`` since boot, or None where the kernel does not say."""
    try:
        text = _STAT.read_text()
    except OSError:
        return None
    idle = total = 0
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in fields[:_BUSY_FIELDS]]
        idle += v[_IDLE] + (v[_IOWAIT] if len(v) > _IOWAIT else 0)
        total += sum(v)
    return (idle, total) if total else None


class IdleCores:
    """Reads how many of this process's cores sat idle since the last reading (the first: since
    this object was made)."""

    def __init__(self) -> None:
        self._cpus = _affinity()
        self._last = _ticks(self._cpus)

    def read(self) -> float | None:
        """Idle cores over the window since the last reading (0 .. the cores), or None."""
        now = _ticks(self._cpus)
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return len(self._cpus) * (now[0] - last[0]) / (now[1] - last[1])
