"""Slot buffers in shared memory (engine/backends/shared_memory.py): another process writes the
owner's bytes in place, and nothing is left behind, not even by an owner killed with SIGKILL."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from warpdeck.engine.backends.numpy_backend import NumpyBackend
from warpdeck.engine.backends.shared_memory import (
    ARENA_PREFIX,
    SharedArena,
    attach,
    default_root,
    memory_backed,
    reap_stale,
)


def _write(path: str, nbytes: int, value: int) -> None:
    attach(path, nbytes)[:] = value


def test_a_worker_process_writes_the_owners_buffer_in_place(tmp_path: Path) -> None:
    with SharedArena(tmp_path, label="t") as arena:
        buf = NumpyBackend().shared_host_buffer(arena, 1 << 20)
        assert buf.array.sum() == 0  # a fresh buffer reads as zeros
        p = mp.get_context("spawn").Process(target=_write, args=(str(buf.path), 1 << 20, 7))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert (buf.array == 7).all()
        assert arena.nbytes == 1 << 20
        assert arena.path.name.startswith(ARENA_PREFIX + "t-")
    assert not arena.path.exists()


def test_release_runs_the_close_calls_before_unmapping_and_removes_the_file(tmp_path: Path) -> None:
    seen: list[str] = []
    with SharedArena(tmp_path) as arena:
        buf = arena.allocate(4096)
        buf.on_close.append(lambda: seen.append(f"first, mapped={not buf.closed}"))
        buf.on_close.append(lambda: 1 / 0)  # a failing release does not keep the one before it
        arena.release(buf)
        assert seen == ["first, mapped=True"]
        assert buf.closed and not buf.path.exists()
        assert arena.nbytes == 0


def test_attaching_asks_for_no_more_than_the_buffer_holds(tmp_path: Path) -> None:
    with SharedArena(tmp_path) as arena:
        buf = arena.allocate(100)
        with pytest.raises(ValueError, match="holds 100 bytes, not 200"):
            attach(buf.path, 200)


def test_a_live_arena_is_never_reaped_even_by_its_own_process(tmp_path: Path) -> None:
    with SharedArena(tmp_path) as arena:
        arena.allocate(10)
        assert reap_stale(tmp_path) == []
        second = SharedArena(tmp_path)  # a second start beside it reaps nothing of the first
        assert second.reaped == [] and arena.path.exists()
        second.close()


def test_an_arena_whose_owner_was_killed_is_reaped_by_the_next_start(tmp_path: Path) -> None:
    owner = textwrap.dedent(f"""
        import sys, time
        from warpdeck.engine.backends.shared_memory import SharedArena
        a = SharedArena({str(tmp_path)!r})
        a.allocate(1 << 16)
        print(a.path, flush=True)
        time.sleep(600)
    """)
    with subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True) as proc:
        try:
            left = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
            assert left.is_dir() and reap_stale(tmp_path) == []  # alive: kept
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert left.is_dir()  # a SIGKILL runs no clean-up
    fresh = SharedArena(tmp_path)
    assert fresh.reaped == [left] and not left.exists()
    fresh.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/mounts").exists(), reason="reads /proc/mounts (Linux)")
def test_arenas_live_in_memory_where_the_machine_has_it() -> None:
    # A device can page-lock a mapping of a tmpfs file, not of a disk file (docs/benchmarks.md).
    root = default_root()
    assert memory_backed(root) is (root == Path("/dev/shm"))
    assert memory_backed(Path("/proc/self")) is False
