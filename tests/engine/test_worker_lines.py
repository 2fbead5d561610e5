"""The headless display's worker lines (cli/worker_lines.py): one line per conviction (once per
worker and epoch, with what was requeued), return, wait for room and end (issue 19)."""

from __future__ import annotations

import re

from warpdeck.cli.worker_lines import WorkerLines, worker_line
from warpdeck.engine.api import BatchFinished, WorkerConvicted, WorkerGone, WorkerReborn, WorkerWaiting


def test_each_change_is_one_line() -> None:
    assert worker_line(WorkerConvicted(0.0, "ray-1", 7, "will", 3, 24)) == \
        "worker ray-1 convicted (will): 3 batches, 24 tasks requeued"
    assert worker_line(WorkerConvicted(0.0, "ray-1", 7, "ray: The actor died unexpectedly", 1, 1)) == \
        "worker ray-1 convicted (ray): 1 batch, 1 task requeued (The actor died unexpectedly)"
    assert worker_line(WorkerReborn(0.0, "ray-1", 8, 1234)) == "worker ray-1 back under epoch 8 (pid 1234)"
    assert worker_line(WorkerWaiting(0.0, "ray-1", "restarting: waiting for 1 CPU")) == \
        "worker ray-1 restarting: waiting for 1 CPU"
    gone = worker_line(WorkerGone(0.0, "ray-1", "max restarts"))
    assert gone == "worker ray-1 gone: Ray will not restart it (max restarts)"


def test_a_conviction_prints_once_per_epoch_and_other_events_not_at_all() -> None:
    said: list[str] = []
    lines = WorkerLines(said.append)
    lines.listen(WorkerConvicted(0.0, "ray-1", 7, "will", 2, 16))
    lines.listen(WorkerConvicted(0.0, "ray-1", 7, "ray: died", 0, 0))  # the second path: nothing left
    lines.listen(BatchFinished.__new__(BatchFinished))  # type: ignore[call-arg]
    lines.listen(WorkerConvicted(0.0, "ray-1", 9, "silent", 0, 0))
    assert len(said) == 2
    assert re.fullmatch(r"\d\d:\d\d:\d\d worker ray-1 convicted \(will\): 2 batches, 16 tasks requeued", said[0])
    assert said[1].endswith("convicted (silent): 0 batches, 0 tasks requeued")
