"""A run that fails, or an engine never run, leaves nothing behind: no thread of its own (broker,
control plane, journal, lanes) and no lock on its run directory (engine/engine.py, and
engine/backends/host_pool.py, whose threads start with the first job)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from wd_build import spec
from wd_stages import RecordingSink, SleepySource

from warpdeck.engine.api import Engine
from warpdeck.engine.control.plane import ControlSettings


def _ours_started_since(before: set[int | None]) -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("warpdeck"))


async def test_a_failed_run_closes_its_control_plane_journal_and_lanes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane's own error ends the run (a bug, injected here): the error is raised, and the engine's
    broker, control plane, journal and lane threads are gone, so a second engine may take the run
    directory at once."""
    before = {t.ident for t in threading.enumerate()}
    s = spec(["wd_stages:double"], name="fails", batch_size=4)
    eng = Engine(s, tmp_path, source=SleepySource(40), control=ControlSettings())

    async def lanes_own_bug(lane: object) -> None:
        raise RuntimeError("a lane's own bug")

    monkeypatch.setattr(eng.dispatcher, "next_batch", lanes_own_bug)
    with pytest.raises(ExceptionGroup) as err:
        async with eng:
            await eng.wait()
    assert err.group_contains(RuntimeError, match="a lane's own bug")
    assert _ours_started_since(before) == []
    sink = RecordingSink()
    async with Engine(s, tmp_path, source=SleepySource(8), sink=sink) as again:  # not RunDirBusy
        assert (await again.wait()).counts.done == 8


async def test_an_engine_never_entered_starts_no_thread(tmp_path: Path) -> None:
    before = {t.ident for t in threading.enumerate()}
    eng = Engine(spec(["wd_stages:double"], batch_size=4, host={"fill_workers": 3, "sink_workers": 2}),
                 tmp_path, source=SleepySource(8))
    assert eng.lanes and _ours_started_since(before) == []
    eng.backend.close()
