"""``EngineLink.detail`` answers for any task during the run and after it (tui/link.py)."""

from __future__ import annotations

import asyncio
import threading

from warpdeck.engine.api import Pause, parse_spec
from warpdeck.tui.link import EngineLink
from warpdeck.tui.messages import EngineStopped


def _spec(count: int):
    return parse_spec({"name": "link-detail", "backend": "numpy", "batch_size": 4,
                       "feeder": {"low_watermark": 8, "high_watermark": 16},
                       "source": {"kind": "synthetic", "count": count, "shape": [4], "dtype": "float64"},
                       "sink": {"kind": "null"}, "stages": [{"fn": "wd_stages:double"}]}, "<test>")


async def test_detail_answers_after_the_run_has_ended() -> None:
    stopped = threading.Event()
    link = EngineLink(_spec(40), journal=False)
    link.start(lambda m: stopped.set() if isinstance(m, EngineStopped) else None)
    try:
        assert await asyncio.to_thread(stopped.wait, 60), "the run never ended"  # off the loop: it stays free
        assert link.engine.report is not None and link.engine.report.counts.done == 40
        done = await link.detail("syn-00000003")
        assert done is not None and (done.state, done.attempt) == ("done", 1)
        assert await link.detail("syn-00000040") is None
    finally:
        link.stop()


async def test_detail_of_a_task_not_admitted_yet_says_so_during_the_run() -> None:
    link = EngineLink(_spec(100_000), journal=False)
    link.start(lambda m: None)
    try:
        assert (await link.send(Pause())).ok
        later = await link.detail("syn-00099999")
        assert later is not None and (later.state, later.admitted, later.note) == (
            "queued", False, "queued (not yet admitted)")
    finally:
        link.stop()
