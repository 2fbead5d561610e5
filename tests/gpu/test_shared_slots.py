"""Shared-memory slot buffers page-locked for the card (issue 31): the copies are real DMA copies of
what another process wrote, and the registration is undone before the memory goes."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from warpdeck.engine.backends.shared_memory import SharedArena, attach, memory_backed

pytestmark = pytest.mark.gpu


def _fill(path: str, nbytes: int, seed: int) -> None:
    attach(path, nbytes).view(np.float32)[:] = np.random.default_rng(seed).standard_normal(nbytes // 4, np.float32)


def test_a_registered_shared_buffer_carries_another_process_writes_to_the_card() -> None:
    import cupy as cp

    from warpdeck.engine.backends.cupy_backend import CupyBackend

    backend = CupyBackend(0)
    nbytes = 8 << 20
    with SharedArena(label="gpu-test") as arena:  # in /dev/shm: a mapping of a disk file is refused
        buf = backend.shared_host_buffer(arena, nbytes)
        buf.array[:] = 0xFF  # poison: NaN wherever the worker wrote nothing
        seed = int(np.random.default_rng().integers(1 << 30))
        p = mp.get_context("spawn").Process(target=_fill, args=(str(buf.path), nbytes, seed))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        dev = cp.empty(nbytes // 4, cp.float32)
        stream = cp.cuda.Stream(non_blocking=True)
        dev.set(buf.array.view(np.float32), stream=stream)
        stream.synchronize()
        want = np.random.default_rng(seed).standard_normal(nbytes // 4, np.float32)
        np.testing.assert_array_equal(cp.asnumpy(dev), want)
        # d2h into the registered buffer, asynchronously, lands too
        (dev * 2).get(stream=stream, out=buf.array.view(np.float32), blocking=False)
        stream.synchronize()
        np.testing.assert_array_equal(buf.array.view(np.float32), want * 2)
        arena.release(buf)  # unregisters first: registering the same range again must work
        again = backend.shared_host_buffer(arena, nbytes)
        assert not again.closed
    backend.close()
    assert not arena.path.exists()


def test_an_arena_on_disk_is_refused_with_the_folder_and_the_fix(tmp_path: Path) -> None:
    from warpdeck.engine.backends.base import BackendError
    from warpdeck.engine.backends.cupy_backend import CupyBackend

    if memory_backed(tmp_path) is not False:
        pytest.skip(f"{tmp_path} is a memory file system here")
    backend = CupyBackend(0)
    with SharedArena(tmp_path) as arena:
        with pytest.raises(BackendError, match="keep the shared arena on a memory file system"):
            backend.shared_host_buffer(arena, 1 << 20)
        assert arena.nbytes == 0  # the refused buffer was let go
    backend.close()


async def test_a_run_on_the_card_loads_and_writes_in_worker_processes_through_registered_slots(tmp_path: Path) -> None:
    from warpdeck.engine.api import Engine, parse_spec

    def spec(backend: str, out: Path, pools: dict[str, object]) -> object:
        return parse_spec({
            "name": f"shared-{backend}", "backend": backend, "batch_size": 16,
            "source": {"kind": "items", "items": "wd_fill:items_seeded", "load": "wd_fill:load_seeded",
                       "shape": [64], "dtype": "float32", "options": {"count": 640}},
            "sink": {"kind": "npy_dir", "path": str(out)}, "stages": [{"fn": "wd_stages:double"}],
            "host": pools})

    outs = {}
    for backend, pools in (("numpy", {}), ("cupy", {"fill_pool": "processes", "sink_pool": "processes",
                                                    "fill_workers": 2, "sink_workers": 2})):
        out = tmp_path / backend
        async with Engine(spec(backend, out, pools), tmp_path / f"run-{backend}") as eng:  # type: ignore[arg-type]
            report = await eng.wait()
        assert report.status == "finished" and report.counts.done == 640, report.counts
        if backend == "cupy":  # the card read and wrote the workers' shared slots
            assert len(report.host_processes["0"]) == 2 and len(report.sink_processes["0"]) == 2
        outs[backend] = out
    names = sorted(p.name for p in outs["numpy"].glob("*.npy"))
    assert len(names) == 640 and names == sorted(p.name for p in outs["cupy"].glob("*.npy"))
    for name in names:
        np.testing.assert_array_equal(np.load(outs["cupy"] / name), np.load(outs["numpy"] / name), err_msg=name)
