"""The workers screen shows each lane's host pools: fill and sink threads, or each fill or sink worker
process with its pid and busy share (issue 31, item 3)."""

from __future__ import annotations

import os
from pathlib import Path

from wd_tui import engine_app, until

from warpdeck.engine.api import HostProcess, LaneView, parse_spec
from warpdeck.tui.screens.workers import host_pools_text


def _lane(i: int, fill: int = 1, sink: int = 1, procs: tuple[HostProcess, ...] = (),
          writers: tuple[HostProcess, ...] = ()) -> LaneView:
    return LaneView(i, 4, "running", False, 0, 0, (), fill, sink, procs, writers)


def test_lanes_that_fill_on_threads_alike_share_a_line_and_processes_are_listed_each() -> None:
    lanes = (_lane(0, 2, 1), _lane(1, 2, 1), _lane(2, 2, 1),
             _lane(3, 2, 1, (HostProcess(4312, 118, 0.62), HostProcess(4313, 1_204, 0.5))), _lane(4, 1, 2),
             _lane(5, 1, 1, writers=(HostProcess(4400, 7, 0.25),)))
    assert host_pools_text(lanes).splitlines() == [
        "lanes 0-2 · fill 2 threads · sink 1 thread",
        "lane 4 · fill 1 thread · sink 2 threads",
        "lane 3 · fill 2 processes: pid 4312 62% 118 batches, pid 4313 50% 1,204 batches · sink 1 thread",
        "lane 5 · fill 1 thread · sink 1 process: pid 4400 25% 7 batches",
    ]
    assert host_pools_text((_lane(0), _lane(2))) == "lanes 0,2 · fill 1 thread · sink 1 thread"
    assert host_pools_text(()) == ""


def _in_processes() -> object:
    return parse_spec({
        "name": "pools", "backend": "numpy", "batch_size": 8, "lanes": 1,
        "source": {"kind": "items", "items": "wd_fill:items_many", "load": "wd_fill:load_slow",
                   "shape": [4, 8], "dtype": "float64"},
        "sink": {"kind": "null"}, "stages": [{"fn": "wd_stages:sleep_100ms"}],
        "host": {"fill_pool": "processes", "fill_workers": 2, "sink_pool": "processes", "sink_workers": 2}},
        "<test>")


async def test_the_workers_screen_names_each_fill_and_sink_process_of_a_running_engine(tmp_path: Path) -> None:
    async with engine_app(tmp_path, _in_processes()) as (app, pilot, _link):  # type: ignore[arg-type]
        await pilot.press("2")
        shown = app.screen.query_one("#host-pools")

        def pools() -> str:
            return str(shown.render())

        await until(pilot, lambda: "fill 2 processes" in pools() and "sink 2 processes" in pools(), 30)
        snap = app.snapshot
        assert snap is not None
        lane = snap.lanes[0]
        pids = [p.pid for p in lane.fill_processes + lane.sink_processes]
        assert len(set(pids)) == 4 and os.getpid() not in pids
        for pid in pids:  # real processes, named as top -p would find them
            assert f"pid {pid} " in pools()
            os.kill(pid, 0)  # a live process: raises if there is none
