"""The workers screen says what the control plane is doing: its broker and connection, what it
dropped or refused, and how far behind its monitor hears (the snapshot's ``ControlView``)."""

from __future__ import annotations

from dataclasses import replace

from textual.widgets import Static
from wd_synthetic import SyntheticRun
from wd_tui import until

from warpdeck.engine.api import ControlView
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.workers import control_summary


def _view(**kw: object) -> ControlView:
    base: dict[str, object] = {"broker": "mqtt://10.0.0.5:1883", "connected": True, "commands_applied": 3,
                               "commands_refused": {}, "dropped": {}, "reconnects": 0}
    base.update(kw)
    return ControlView(**base)  # type: ignore[arg-type]


def test_no_control_plane() -> None:
    assert control_summary(None).startswith("control plane off")


def test_a_healthy_plane() -> None:
    line = control_summary(_view())
    assert "broker mqtt://10.0.0.5:1883 ● connected" in line
    assert "dropped 0" in line and "commands 3 applied, 0 refused" in line and "monitor on time" in line


def test_what_was_dropped_refused_and_held_is_named() -> None:
    line = control_summary(_view(dropped={"invalid": 7, "oversized": 2, "wrong_topic": 1, "unknown_kind": 1},
                                 commands_refused={"replayed": 1, "bad_signature": 4}, input_lag_s=1.34,
                                 lag_holds=2, reconnects=1))
    assert "dropped 11 (7 invalid, 2 oversized, 1 " in line, line
    assert "3 applied, 5 refused" in line
    assert "monitor hears 1.3 s behind (verdicts held 2 times)" in line
    assert "1 reconnect(s)" in line


def test_a_lost_broker_says_why() -> None:
    line = control_summary(_view(connected=False, error="[Errno 111] Connection refused"))
    assert "○ disconnected" in line and "last error: [Errno 111] Connection refused" in line


async def test_the_workers_screen_shows_the_line() -> None:
    run = SyntheticRun(2000, seed=3, transitions_per_s=200)
    view = _view(dropped={"invalid": 4}, lag_holds=1)
    stream = [replace(s, control=view) for s in run.stream(1.0, 4)]
    app = WarpdeckApp(StreamLink(stream))
    async with app.run_test(size=(160, 40)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.press("2")
        await pilot.pause()
        text = str(app.screen.query_one("#control-summary", Static).render())
        assert "● connected" in text and "dropped 4 (4 invalid)" in text and "verdicts held once" in text



async def test_a_worker_waiting_for_room_says_why_in_its_row() -> None:
    """A Ray actor Ray cannot restart for want of room: its row says so after its state (issue 19)."""
    from warpdeck.tui.widgets.worker_table import WorkerTable

    run = SyntheticRun(2000, seed=3, transitions_per_s=200)
    note = "restarting: waiting for 1 GPU"
    stream = []
    for s in run.stream(1.0, 4):
        first, *rest = s.workers
        stream.append(replace(s, workers=(replace(first, state="dead", note=note), *rest)))
    app = WarpdeckApp(StreamLink(stream))
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.press("2")
        await pilot.pause()
        table = app.screen.query_one(WorkerTable)
        wid = stream[-1].workers[0].id
        cell = str(table.get_cell(wid, "state"))
        assert cell.endswith(f"dead · {note}"), cell
