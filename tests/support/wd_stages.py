"""Stage functions, sources and sinks the tests name in specs (``wd_stages:double`` ...)."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from warpdeck.engine.edges.sources import synthetic_values
from warpdeck.engine.state.batches import BatchKey, TaskInput

POISON = 999.0


def double(xp: Any, inp: Any, out: Any) -> None:
    """out = 2 * inp."""
    xp.multiply(inp, 2, out=out)


def add_one(xp: Any, inp: Any, out: Any) -> None:
    """out = inp + 1."""
    xp.add(inp, 1, out=out)


def row_sum(xp: Any, inp: Any, out: Any) -> None:
    """out[i, 0] = sum(inp[i])."""
    out[:, 0] = inp.reshape(inp.shape[0], -1).sum(axis=1)


def _row_sum_spec(shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    return (1,), "float64"


row_sum.out_spec = _row_sum_spec  # type: ignore[attr-defined]


SPREAD = 256
"""How many times ``spread`` repeats each input row."""


def spread(xp: Any, inp: Any, out: Any) -> None:
    """out[i] = 2 * inp[i] + r for r in 0..SPREAD-1, one after another: small inputs, large outputs
    (that do not compress), so the sink is the slowest phase and every d2h waits for a sink to free
    its buffer (the stop test)."""
    n = inp.shape[0]
    o = out.reshape(n, SPREAD, -1)
    xp.multiply(inp.reshape(n, 1, -1), 2, out=o)
    xp.add(o, xp.arange(SPREAD, dtype=out.dtype).reshape(1, SPREAD, 1), out=o)


def _spread_spec(shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    return (SPREAD * int(np.prod(shape)),), str(dtype)


spread.out_spec = _spread_spec  # type: ignore[attr-defined]


def poison(xp: Any, inp: Any, out: Any) -> None:
    """Raises when any input element equals POISON, else copies."""
    if bool((inp == POISON).any()):
        raise ValueError("poisoned input")
    out[...] = inp


def noop(xp: Any, inp: Any, out: Any) -> None:
    """Does nothing (engine overhead benchmarks)."""


class Sleeper:
    """Stage that sleeps a given time per batch (the GIL is released: phases overlap)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, xp: Any, inp: Any, out: Any) -> None:
        time.sleep(self.seconds)
        out[...] = inp


class SleepySource:
    """A source whose load sleeps ``fill_s`` per batch (plus an optional jitter sequence)."""

    def __init__(self, count: int, shape: tuple[int, ...] = (4,), fill_s: float = 0.0,
                 jitter: Sequence[float] = ()) -> None:
        self.total: int | None = count
        self.count = count
        self.key = BatchKey("test", shape, "float64")
        self.fill_s = fill_s
        self.jitter = list(jitter)
        self.loads = 0
        self._lock = threading.Lock()

    def items(self) -> Iterator[TaskInput]:
        for i in range(self.count):
            yield TaskInput(f"t{i:06d}", self.key, i)

    def load(self, items: Sequence[TaskInput], out: np.ndarray) -> list[BaseException | None]:
        with self._lock:
            extra = self.jitter[self.loads % len(self.jitter)] if self.jitter else 0.0
            self.loads += 1
        if self.fill_s or extra:
            time.sleep(self.fill_s + extra)
        for j, t in enumerate(items):
            out[j] = float(t.handle)
        return [None] * len(items)


class RecordingSink:
    """Keeps a copy of every output; optionally sleeps per batch-sized group of writes."""

    def __init__(self, sleep_s: float = 0.0, fail_keys: Sequence[str] = (), fail_times: int = 1) -> None:
        self.out: dict[str, np.ndarray] = {}
        self.writes: dict[str, int] = {}
        self.sleep_s = sleep_s
        self.fail_keys = set(fail_keys)
        self.fail_times = fail_times
        self._failed: dict[str, int] = {}

    def write(self, key: str, out: np.ndarray) -> None:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if key in self.fail_keys and self._failed.get(key, 0) < self.fail_times:
            self._failed[key] = self._failed.get(key, 0) + 1
            # A sink's own error (an object store that dropped the connection), which the retry policy
            # retries; a full disk is an outage instead (engine/edges/outage.py, tests/engine/test_outage.py).
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
        self.out[key] = np.array(out, copy=True)
        self.writes[key] = self.writes.get(key, 0) + 1


sleep_2ms = Sleeper(0.002)
sleep_10ms = Sleeper(0.010)
sleep_100ms = Sleeper(0.100)
sleep_forever_ish = Sleeper(0.6)


def slow_double(xp: Any, inp: Any, out: Any) -> None:
    """out = 2 * inp + 1, after 8 ms (long enough per batch that a kill lands mid-run)."""
    time.sleep(0.008)
    xp.multiply(inp, 2, out=out)
    xp.add(out, 1, out=out)


def nan_at_poison(xp: Any, inp: Any, out: Any) -> None:
    """out = inp, NaN wherever the input equals POISON, +inf where it equals -POISON."""
    out[...] = inp
    out[inp == POISON] = xp.nan
    out[inp == -POISON] = xp.inf


HELD_LANES: set[int] = set()
"""Lanes whose compute blocks in ``hold_lanes`` until ``RELEASE_LANES`` is set (fault injection)."""
RELEASE_LANES = threading.Event()


def hold_lanes(xp, inp, out):  # type: ignore[no-untyped-def]
    """Doubles its input; on a lane in ``HELD_LANES`` (read from the compute thread's name,
    ``warpdeck-lane<N>-compute-1``) it first waits for ``RELEASE_LANES``: a worker whose stage hangs."""
    name = threading.current_thread().name
    lane = int(name.split("lane", 1)[1].split("-", 1)[0]) if "lane" in name else -1
    if lane in HELD_LANES:
        RELEASE_LANES.wait(60)
    out[...] = inp * 2


def assert_doubled_once(sink: RecordingSink, count: int) -> None:
    """Every task of a synthetic source (seed 3, shape (4,), float32) written to ``sink`` once, as
    ``slow_double_40ms`` computes it: nothing lost, nothing doubled, nothing wrong."""
    assert len(sink.writes) == count, "an output is missing"
    assert max(sink.writes.values()) == 1, "an output was written twice"
    inputs = synthetic_values(3, list(range(count)), (4,), np.dtype("float32"))
    for i in range(count):
        np.testing.assert_array_equal(sink.out[f"syn-{i:08d}"], inputs[i] * 2 + 1)


def slow_double_40ms(xp: Any, inp: Any, out: Any) -> None:
    """out = 2 * inp + 1, after 40 ms: Ray actors' batches last long enough to kill one mid-batch."""
    time.sleep(0.040)
    xp.multiply(inp, 2, out=out)
    xp.add(out, 1, out=out)


DISK_FULL = threading.Event()
"""While set, ``refusing_disk`` fails every write with ENOSPC, as a full disk would (fault injection)."""


def refusing_disk(key: str, out: Any) -> None:
    """A callable sink that drops outputs, and refuses them with ENOSPC while ``DISK_FULL`` is set."""
    if DISK_FULL.is_set():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"/data/outputs/{key}.npy")


_NOISY = threading.Event()


def _helper_dies() -> None:
    raise ZeroDivisionError("a helper thread's own bug")


def noisy_double(xp: Any, inp: Any, out: Any) -> None:
    """out = 2 * inp; on its first call a library logs a warning and a helper thread dies: the
    unexpected things the run's log file takes in (cli/run_log.py)."""
    if not _NOISY.is_set():
        _NOISY.set()
        logging.getLogger("somelib.pool").warning("connection pool is full, discarding connection")
        helper = threading.Thread(target=_helper_dies, name="somelib-helper")
        helper.start()
        helper.join()
    xp.multiply(inp, 2, out=out)


def fail_on_37(xp: Any, inp: Any, out: Any) -> None:
    """Doubles its input after 2 ms; a batch holding a multiple of 37 (task t000037, ...) fails."""
    time.sleep(0.002)
    if bool((inp % 37 == 0).any() & (inp > 0).any()):
        raise ValueError("a multiple of 37")
    out[...] = inp * 2
