"""Every screen of the control room, rendered from a recorded synthetic stream at a pinned size.

Each test feeds the same twelve snapshots (interval 0, so the app shows the last one), pins TZ and
NO_COLOR before the app exists (Textual reads NO_COLOR when the App is created), drives the app
with keys, and compares the screen with the SVG under ``__snapshots__``. Everything on screen comes
from the snapshot, so the picture is the same on every run; ``--snapshot-update`` regenerates it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from textual.pilot import Pilot
from wd_synthetic import SyntheticRun

from warpdeck.engine.api import EngineSnapshot, WorkerState
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import StreamLink
from warpdeck.tui.messages import SnapshotArrived

SIZE = (140, 40)
SNAPSHOTS = 12
DT = 1.0


def _run() -> SyntheticRun:
    # 50 tasks/s in blocks of 16 (a 0.32 s period, four timeline cells a batch): every column holds a
    # few tasks, and stalls and failures of every kind show by t = 12 s.
    return SyntheticRun(5000, seed=7, transitions_per_s=300, stalled_every=29, failed_every=41, batch=8)


def _last() -> EngineSnapshot:
    return _run().snapshot_at(SNAPSHOTS * DT, seq=SNAPSHOTS)


@pytest.fixture
def make_app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], WarpdeckApp]]:
    """A factory for the app over the recorded stream, with TZ and NO_COLOR pinned."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("NO_COLOR", "1")
    time.tzset()

    def make(stream: list[EngineSnapshot] | None = None) -> WarpdeckApp:
        run = _run()
        last = run.snapshot_at(SNAPSHOTS * DT)
        details = {f.key: run.detail(f.key, last.t) for f in last.failures}
        return WarpdeckApp(StreamLink(stream or list(run.stream(DT, SNAPSHOTS)), details=details))

    yield make
    monkeypatch.undo()
    time.tzset()


async def _shown(pilot: Pilot[int]) -> None:
    """Wait until the app shows the stream's last snapshot (a condition, not a sleep)."""
    app = pilot.app
    assert isinstance(app, WarpdeckApp)
    for _ in range(200):
        if app.snapshot is not None and app.snapshot.seq == SNAPSHOTS:
            return
        await pilot.pause()
    raise AssertionError(f"the last snapshot never showed (at seq {app.snapshot and app.snapshot.seq})")


def test_board(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown)


def test_board_filtered(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    # Keys img-00012xx: a hundred tasks, done, running and stalled; titles show shown/total.
    keys = ["slash", *"00012", "enter"]
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=keys)


def test_board_stalled_column(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    # Six columns right of queued: the stalled list has focus (every reason with its age), cursor on row 4.
    keys = [*["l"] * 6, "j", "j", "j"]
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=keys)


def test_workers(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=["2"])


def _worker_lives() -> list[EngineSnapshot]:
    """The stream with a Ray actor that is lost, waits for a GPU and is back in its last snapshots."""
    stream = list(_run().stream(DT, SNAPSHOTS))
    actor = replace(stream[0].workers[0], id="ray-1", host="node-b", pid=4242, epoch=3, note="")
    lives = {SNAPSHOTS - 3: replace(actor, state=WorkerState.DEAD),
             SNAPSHOTS - 2: replace(actor, state=WorkerState.DEAD, note="restarting: waiting for 1 GPU"),
             SNAPSHOTS - 1: replace(actor, epoch=5, pid=4343)}
    return [replace(snap, workers=(*snap.workers, lives.get(i, actor))) for i, snap in enumerate(stream)]


def test_workers_with_changes(snap_compare: Callable[..., bool],
                              make_app: Callable[..., WarpdeckApp]) -> None:
    stream = _worker_lives()

    async def one_by_one(pilot: Pilot[int]) -> None:
        """The last three snapshots, each taken in before the next is sent: a snapshot still in the
        app's queue is replaced by a newer one (``SnapshotArrived.can_replace``), so sent at once
        the room would compare the first with the last."""
        assert isinstance(pilot.app, WarpdeckApp)
        room = pilot.app
        for snap in stream[-3:]:
            for _ in range(500):
                if room.snapshot is not None and room.snapshot.seq == snap.seq - 1:
                    break
                await pilot.pause(0.01)
            room.post_message(SnapshotArrived(snap))
        await _shown(pilot)
        room.clear_notifications()  # the list is what is compared, not the toasts over it

    assert snap_compare(make_app(stream[:-3]), terminal_size=SIZE, run_before=one_by_one, press=["2"])


def test_timeline(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=["3"])


def test_help(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=["question_mark"])


def test_task_detail(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    async def open_failed(pilot: Pilot[int]) -> None:
        await _shown(pilot)
        # The done/failed column lists failures first: enter opens the newest failure.
        await pilot.press(*["l"] * 7, "enter")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=open_failed)


def test_confirm_cancel_all(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=["X"])


def test_command_prompt(snap_compare: Callable[..., bool], make_app: Callable[[], WarpdeckApp]) -> None:
    # "dr" with the suggester offering the rest of "drain".
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=_shown, press=["colon", "d", "r"])


# -- three terminal sizes, a million tasks with twelve-character ids: nothing cut ---------------------

SIZES = [(80, 24), (120, 40), (200, 50)]


def _big_run() -> SyntheticRun:
    # 5,000 tasks/s over two lanes of 64: every column holds more rows than the screen, ids run to
    # syn-00999999, and the counts need thousands separators (or abbreviations) to be read.
    return SyntheticRun(1_000_000, seed=7, transitions_per_s=30_000, stalled_every=29, failed_every=41, batch=64,
                        prefix="syn-", digits=8)


@pytest.fixture
def make_big_app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], WarpdeckApp]]:
    """The app over the million-task stream, with TZ and NO_COLOR pinned."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("NO_COLOR", "1")
    time.tzset()
    yield lambda: WarpdeckApp(StreamLink(list(_big_run().stream(DT, SNAPSHOTS))))
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", ["board", "workers", "timeline"])
def test_sized(snap_compare: Callable[..., bool], make_big_app: Callable[[], WarpdeckApp], screen: str,
               size: tuple[int, int]) -> None:
    keys = {"board": [], "workers": ["2"], "timeline": ["3"]}[screen]
    assert snap_compare(make_big_app(), terminal_size=size, run_before=_shown, press=keys)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sized_help(snap_compare: Callable[..., bool], make_big_app: Callable[[], WarpdeckApp],
                    size: tuple[int, int]) -> None:
    assert snap_compare(make_big_app(), terminal_size=size, run_before=_shown, press=["question_mark"])


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sized_detail(snap_compare: Callable[..., bool], monkeypatch: pytest.MonkeyPatch,
                      size: tuple[int, int]) -> None:
    """A failed task's detail (attempts, error, traceback) over the million-task board."""
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("NO_COLOR", "1")
    time.tzset()
    run = _big_run()
    last = run.snapshot_at(SNAPSHOTS * DT)
    key = last.failures[0].key
    app = WarpdeckApp(StreamLink(list(run.stream(DT, SNAPSHOTS)), details={key: run.detail(key, last.t)}))

    async def open_detail(pilot: Pilot[int]) -> None:
        await _shown(pilot)
        await app.open_detail(key)
        await pilot.pause()
        await pilot.pause()

    try:
        assert snap_compare(app, terminal_size=size, run_before=open_detail)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_stream_is_recorded() -> None:
    """The stream these pictures come from is the same on every run (else they would drift)."""
    a, b = _last(), _last()
    assert a.counts == b.counts
    assert a.stalled == b.stalled
    assert a.figures == b.figures
