"""The control room says when a worker is lost, waits to be restarted or comes back: once, as it
happens, from the snapshots alone (so an attached room says it too), in the headless display's
words; and the workers screen lists the latest of them with the run's time, once the
notifications are gone."""

from __future__ import annotations

from dataclasses import replace

import pytest
from textual.widgets import Static
from wd_synthetic import SyntheticRun
from wd_tui import notes, until

from warpdeck.engine.api import EngineSnapshot, WorkerState, WorkerView
from warpdeck.tui import app as app_module
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import StreamLink
from warpdeck.tui.messages import SnapshotArrived
from warpdeck.tui.worker_changes import WorkerLog, worker_changes


def _actor(state: WorkerState = WorkerState.ONLINE, epoch: int = 7, note: str = "", pid: int = 100) -> WorkerView:
    return WorkerView(id="ray-1", state=state, host="node-b", pid=pid, device="cpu", epoch=epoch, lanes=1,
                      lanes_busy=1, progress=3, tasks_done=24, tasks_failed=0, note=note)


def test_a_loss_a_wait_and_a_return_are_each_said_once() -> None:
    online, dead = _actor(), _actor(WorkerState.DEAD)
    waiting = _actor(WorkerState.DEAD, note="restarting: waiting for 1 GPU")
    back = _actor(epoch=9, pid=222)
    assert worker_changes([online], [dead]) == [("worker ray-1 lost: its batches are requeued", "error")]
    assert worker_changes([dead], [waiting]) == [("worker ray-1 restarting: waiting for 1 GPU", "warning")]
    assert worker_changes([waiting], [waiting]) == [], "said when it starts, not while it lasts"
    assert worker_changes([waiting], [back]) == [("worker ray-1 back under epoch 9 (pid 222)", "information")]
    assert worker_changes([online], [_actor(WorkerState.HUNG)])[0][0] == "worker ray-1 hung: its batches are requeued"
    assert worker_changes([], [online]) == [], "a run starting says nothing"
    assert worker_changes([online], [_actor(epoch=8)]) == [], "a new epoch of a worker that never stopped is no news"


def _lives() -> list[EngineSnapshot]:
    """Four snapshots 1 s apart (t 1.0 to 4.0) in which ray-1 is lost, waits for a CPU and comes back."""
    run = SyntheticRun(2000, seed=3, transitions_per_s=200)
    base = list(run.stream(1.0, 4))
    lives = [_actor(), _actor(WorkerState.DEAD), _actor(WorkerState.DEAD, note="restarting: waiting for 1 CPU"),
             _actor(epoch=9, pid=222)]
    return [replace(s, workers=(*s.workers, w)) for s, w in zip(base, lives, strict=True)]


def test_the_log_keeps_the_newest_and_counts_every_one() -> None:
    log = WorkerLog(keep=3)
    for i in range(5):
        log.add(float(i), f"change {i}", "warning")
    assert [c.line for c in log.latest(10)] == ["change 2", "change 3", "change 4"]
    assert [c.text() for c in log.latest(2)] == ["t 3.0s  change 3", "t 4.0s  change 4"]
    assert (len(log), log.said, log.latest(0)) == (3, 5, [])


async def test_the_workers_screen_lists_the_changes_with_the_runs_time() -> None:
    stream = _lives()
    app = WarpdeckApp(StreamLink(stream, interval=0.3))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("2")
        shown = app.screen.query_one("#worker-log", Static)
        # (No room before the first change: tests/tui/test_screens_snapshot.py's workers picture. Not
        # checked here: on a loaded machine the loss can arrive before the key does.)
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.pause()
        t = [s.t for s in stream]
        assert str(shown.render()).splitlines() == [
            f"t {t[1]:,.1f}s  worker ray-1 lost: its batches are requeued",
            f"t {t[2]:,.1f}s  worker ray-1 restarting: waiting for 1 CPU",
            f"t {t[3]:,.1f}s  worker ray-1 back under epoch 9 (pid 222)"]
        assert shown.display and shown.region.height == 3
        app.clear_notifications()
        await pilot.press("1", "2")  # away and back: the list is still there, the toasts gone
        await pilot.pause()
        shown = app.screen.query_one("#worker-log", Static)
        assert not notes(app) and shown.display and "back under epoch 9" in str(shown.render())


async def test_the_room_notifies_what_happens_to_a_worker() -> None:
    stream = _lives()
    app = WarpdeckApp(StreamLink(stream, interval=0.3))
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.pause()
        said = [n for n in notes(app) if "ray-1" in n]
        assert said == ["worker ray-1 lost: its batches are requeued", "worker ray-1 restarting: waiting for 1 CPU",
                        "worker ray-1 back under epoch 9 (pid 222)"], said


async def test_changes_between_two_repaints_are_each_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots that arrive faster than the room repaints are painted as one (the newest), but each
    is compared with the one that arrived before it: the loss, the wait and the return are all told."""
    monkeypatch.setattr(app_module, "MAX_REPAINT_HZ", 0.05)  # one repaint every 20 s: all four in one
    stream = _lives()
    app = WarpdeckApp(StreamLink(stream, interval=0.2))
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.worker_log.said == 3)
        assert app.snapshot is not None and app.snapshot.seq < stream[-1].seq, "not yet painted"
        assert [c.line for c in app.worker_log.latest(5)] == [
            "worker ray-1 lost: its batches are requeued", "worker ray-1 restarting: waiting for 1 CPU",
            "worker ray-1 back under epoch 9 (pid 222)"]


def test_a_snapshot_stands_in_for_a_queued_one_unless_a_worker_changed_between_them() -> None:
    """A busy room skips to the newest snapshot, but never past one that showed a worker change."""
    lives = _lives()
    first, busier = lives[0], replace(lives[0], seq=lives[0].seq + 1, workers=tuple(
        replace(w, progress=w.progress + 5, lanes_busy=0, tasks_done=w.tasks_done + 40) for w in lives[0].workers))
    assert SnapshotArrived(first).can_replace(SnapshotArrived(busier)), "work done is no worker change"
    for later in lives[1:]:
        assert not SnapshotArrived(first).can_replace(SnapshotArrived(later))
    dead = lives[1]
    for change in ({"note": "restarting: waiting for 1 CPU"}, {"epoch": 8}, {"pid": 101}):
        other = replace(dead, workers=(*dead.workers[:-1], replace(dead.workers[-1], **change)))
        assert not SnapshotArrived(dead).can_replace(SnapshotArrived(other)), change


async def test_changes_in_snapshots_that_arrive_together_are_each_told() -> None:
    """All four snapshots queued before the room reads any (a room stalled for a moment, a replay): a
    skipped one would hide its change. Before, the loss was skipped, or all three were."""
    stream = _lives()
    app = WarpdeckApp(StreamLink(stream, interval=0))
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.pause()
        assert [c.line for c in app.worker_log.latest(5)] == [
            "worker ray-1 lost: its batches are requeued", "worker ray-1 restarting: waiting for 1 CPU",
            "worker ray-1 back under epoch 9 (pid 222)"]


async def test_a_note_is_shown_as_written_brackets_and_all() -> None:
    """Notes are the cluster's words: shown as text, never read as markup."""
    stream = _lives()[:2]
    note = "restarting: waiting for 1 GPU [node-b gone] [/]"
    stream.append(replace(stream[-1], seq=stream[-1].seq + 1, t=stream[-1].t + 1,
                          workers=(*stream[-1].workers[:-1], _actor(WorkerState.DEAD, note=note))))
    app = WarpdeckApp(StreamLink(stream, interval=0.3))
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.pause()
        shown = str(app.screen.query_one("#worker-log", Static).render())
        assert f"worker ray-1 {note}" in shown, shown
        assert app.errors == 0
