"""The machine's idle cores over a window (engine/run/idle_cores.py): what the tuner counts as spare."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from warpdeck.engine.run import idle_cores
from warpdeck.engine.run.idle_cores import IdleCores

STAT = """cpu  {u} 0 0 {i} 0 0 0 0 0 0
cpu0 {u0} 0 10 {i0} 5 0 0 0 0 0
cpu1 {u1} 0 10 {i1} 5 0 0 0 0 0
cpu7 1000 0 0 1000 0 0 0 0 0 0
intr 1 2 3
"""


def _write(path: Path, u0: int, i0: int, u1: int, i1: int) -> None:
    path.write_text(STAT.format(u=u0 + u1, i=i0 + i1, u0=u0, i0=i0, u1=u1, i1=i1))


def test_the_kernel_counts_of_this_process_cpus_give_the_idle_cores(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # A controlled /proc/stat: cpu0 and cpu1 are this process's; cpu7 is not, and never counts.
    stat = tmp_path / "stat"
    monkeypatch.setattr(idle_cores, "_STAT", stat)
    monkeypatch.setattr(idle_cores, "_affinity", lambda: frozenset({0, 1}))
    _write(stat, 100, 100, 100, 100)
    clock = IdleCores()
    _write(stat, 200, 100, 150, 150)  # cpu0 busy all 100 ticks, cpu1 half of them: half a core idle
    assert clock.read() == pytest.approx(0.5)
    assert clock.read() is None  # no tick since: no figure
    stat.unlink()
    assert clock.read() is None  # not Linux, or /proc not mounted: no figure, no error
    assert IdleCores().read() is None


def test_a_spinning_thread_leaves_at_least_its_core_busy() -> None:
    # The real /proc/stat: a figure within the cores this process may use, and while a thread of
    # this process spins, its core is not idle (other processes on a shared machine only add to it).
    cores = len(os.sched_getaffinity(0))
    clock = IdleCores()
    time.sleep(0.3)
    quiet = clock.read()
    assert quiet is not None and 0.0 <= quiet <= cores
    stop = time.monotonic() + 0.3
    spin = threading.Thread(target=lambda: [None for _ in iter(lambda: time.monotonic() > stop, True)])
    spin.start()
    spin.join()
    busy = clock.read()
    assert busy is not None and 0.0 <= busy <= cores
    assert busy <= cores - 0.5  # the spinning thread's core (ticks are 10 ms: half a core of margin)
