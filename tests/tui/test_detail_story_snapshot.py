"""A task's whole story on the detail screen (tui/widgets/task_story.py): a done, a failed and a retried
task, each at 80x24 and at 160x50, over the recorded synthetic stream.

The details are fixed values (what ``Engine.task_detail`` answers, written out), so the pictures are the
same on every run; TZ and NO_COLOR are pinned before the app exists. ``--snapshot-update`` regenerates
them under ``__snapshots__``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from textual.pilot import Pilot
from wd_synthetic import SyntheticRun

from warpdeck.engine.api import AttemptStory, PhaseTime, StallEpisode, TaskAttempt, TaskDetail
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import StreamLink

SIZES = [(80, 24), (160, 50)]
SNAPSHOTS = 12
DT = 1.0
_A, _B, _C = "gpu-a/cuda:0", "gpu-b/cuda:0", "gpu-c/cuda:1"
_TRACEBACK = """Traceback (most recent call last):
  File "warpdeck/engine/run/lanes.py", line 329, in compute
    fn(xp, views[i], views[i + 1])
  File "stages/decode.py", line 41, in stage
    out[...] = xp.asarray(img)[..., :3]
ValueError: could not broadcast input array from shape (224,224,4) into shape (224,224,3)"""
_BROADCAST = "compute: ValueError: could not broadcast input array from shape (224,224,4) into shape (224,224,3)"
_LOST = "worker gpu-c/cuda:1 lost (epoch 2, heartbeat silent for 5.0 s)"


def _phases(start: float, *took: float) -> tuple[PhaseTime, ...]:
    """Phases back to back from ``start`` (a little gap before each, as a slot's buffers allow)."""
    out, t = [], start
    for name, dt in zip(("fill", "h2d", "compute", "d2h", "sink"), took, strict=False):
        out.append(PhaseTime(name, t, dt))  # type: ignore[arg-type]
        t += dt + 0.0002
    return tuple(out)


def _done() -> TaskDetail:
    a = AttemptStory(1, "done", 824, 1, 0, _A, 1, queued_at_s=3.214, queue_wait_s=1.204,
                     phases=_phases(4.418, 0.0021, 0.00031, 0.011, 0.00025, 0.0014), ended_at_s=4.4340)
    return TaskDetail("img-0000042", "done", "none", 1, 824, "none", "", "", "", (), attempts=(a,),
                      stalls=(StallEpisode("backpressure", 4.4317, 0.0004, 1,
                                           "waiting for the sink to free an output slot"),),
                      input_from="/data/imgs/img-0000042.npy · float32 [224, 224, 3]",
                      output_to="written to /runs/synthetic-img/outputs/img-0000042.npy",
                      why="waited 1.2 s in queue behind backpressure; compute 11 ms", admitted_at_s=3.214)


def _failed() -> TaskDetail:
    runs = ((74, 0, 1, _A, 9.41, 0.012, 0.0098), (90, 1, 0, _B, 9.55, 0.094, 0.0101),
            (93, 0, 0, _A, 9.71, 0.004, 0.0098))
    attempts = tuple(
        AttemptStory(n, "failed", batch, lane, slot, worker, 1, queued_at_s=q, queue_wait_s=wait,
                     phases=_phases(q + wait, 0.0019, 0.0003, took), ended_at_s=q + wait + 0.0125 + took,
                     reason=_BROADCAST)
        for n, (batch, lane, slot, worker, q, wait, took) in enumerate(runs, start=1))
    history = tuple(TaskAttempt(a.attempt, "failed", a.ended_at_s or 0.0, _BROADCAST, _TRACEBACK, a.batch)
                    for a in attempts[:2])
    return TaskDetail("img-0000599", "failed", "none", 3, 93, "none", "", _BROADCAST, _TRACEBACK, history,
                      attempts=attempts, input_from="/data/imgs/img-0000599.npy · uint8 [224, 224, 4]",
                      output_to="none: the task failed",
                      why="2 earlier attempts (failed) took 310 ms; compute 9.8 ms", admitted_at_s=9.41)


def _retried() -> TaskDetail:
    first = AttemptStory(1, "failed", 74, 2, 1, _C, 2, queued_at_s=2.871, queue_wait_s=0.0031, ended_at_s=8.102,
                         reason=_LOST)
    second = AttemptStory(2, "done", 97, 0, 1, _A, 1, queued_at_s=8.102, queue_wait_s=0.0114,
                          phases=_phases(8.1134, 0.0022, 0.0003, 0.0102, 0.0002, 0.0013), ended_at_s=8.1300)
    return TaskDetail("img-0000600", "done", "none", 2, 97, "none", "", _LOST, "",
                      (TaskAttempt(1, "failed", 8.102, _LOST, "", 74),), attempts=(first, second),
                      stalls=(StallEpisode("hung", 3.101, 5.0, 1, "compute past its 5s deadline"),),
                      input_from="/data/imgs/img-0000600.npy · float32 [224, 224, 3]",
                      output_to="written to /runs/synthetic-img/outputs/img-0000600.npy",
                      why="1 earlier attempt (failed) took 5.2 s; compute 10 ms", admitted_at_s=2.871)


DETAILS = {"done": _done(), "failed": _failed(), "retried": _retried()}


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("story", list(DETAILS))
def test_story(snap_compare: Callable[..., bool], monkeypatch: pytest.MonkeyPatch, story: str,
               size: tuple[int, int]) -> None:
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("NO_COLOR", "1")
    time.tzset()
    run = SyntheticRun(5000, seed=7, transitions_per_s=300, stalled_every=29, failed_every=41, batch=8)
    detail = DETAILS[story]
    app = WarpdeckApp(StreamLink(list(run.stream(DT, SNAPSHOTS)), details={detail.key: detail}))

    async def open_detail(pilot: Pilot[int]) -> None:
        for _ in range(200):
            if app.snapshot is not None and app.snapshot.seq == SNAPSHOTS:
                break
            await pilot.pause()
        await app.open_detail(detail.key)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()

    try:
        assert snap_compare(app, terminal_size=size, run_before=open_detail)
    finally:
        monkeypatch.undo()
        time.tzset()
