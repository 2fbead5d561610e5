"""A run of steps in the control room: the room says when the run waits at a gate, ``a`` shows what
the steps before it produced, and approving or rejecting it (with a note, confirmed) goes on or
ends the run; quitting while it waits leaves it held. Over a real engine and real files."""

from __future__ import annotations

import json
from pathlib import Path

from textual.widgets import Button, Input
from wd_tui import asking, burst, note_ids, notes, notes_since, until

from warpdeck.engine.api import parse_spec
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import EngineLink
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.gate import GateScreen

SPEC = {
    "name": "gated", "backend": "numpy", "batch_size": 16,
    "source": {"kind": "synthetic", "count": 200, "shape": [8], "seed": 3},
    "sink": {"kind": "npy_dir", "path": "outputs"},
    "steps": [
        {"name": "stats", "reduce": {"builtin": "min_max"}},
        {"name": "write", "after": ["stats"], "gate": True, "stages": [{"fn": "wd_stages:double"}]},
    ],
}


def room(tmp_path: Path) -> tuple[WarpdeckApp, EngineLink]:
    link = EngineLink(parse_spec(SPEC), tmp_path / "run", decisions={})
    return WarpdeckApp(link, log_path=tmp_path / "room.log"), link


async def test_a_gate_approved_in_the_room_with_a_note_runs_the_step(tmp_path: Path) -> None:
    app, link = room(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gate is not None)
        assert app.gate.step == "write" and any("stats" in line for line in app.gate.produced)
        assert "step 1 of 2: stats (reduce); waiting for it at a barrier: write (gate)" in notes(app)
        burst(app, "a")
        await until(pilot, lambda: isinstance(app.screen, GateScreen))
        assert any("max =" in str(label.render()) for label in app.screen.query("Label"))
        app.screen.query_one("#gate-note", Input).value = "min and max look right"
        app.screen.query_one("#approve", Button).press()
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and asking(app))
        assert "Approve the gate of step write" in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: app.stopped is not None, limit_s=30)
    report = link.engine.steps_report
    assert report is not None and report.exit_code == 0
    assert report.gate is not None and report.gate.decision == "approved"
    assert report.gate.note == "min and max look right" and report.gate.by == "control room"
    assert len(list((tmp_path / "run" / "outputs").glob("*.npy"))) == 200
    ledger = json.loads((tmp_path / "run" / "steps.json").read_text())
    assert ledger["gates"]["write"]["note"] == "min and max look right"


async def test_a_gate_rejected_with_the_verb_ends_the_run_with_status_8(tmp_path: Path) -> None:
    app, link = room(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gate is not None)
        seen = note_ids(app)
        burst(app, ":reject\r")  # no note: refused, nothing asked
        await until(pilot, lambda: any("needs a note" in n for n in notes_since(app, seen)))
        assert not isinstance(app.screen, ConfirmScreen)
        burst(app, ":reject the maximum is far too high\r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and asking(app))
        await pilot.press("y")
        await until(pilot, lambda: app.stopped is not None, limit_s=30)
    report = link.engine.steps_report
    assert report is not None and int(report.exit_code) == 8
    assert report.gate is not None and report.gate.note == "the maximum is far too high"
    assert not (tmp_path / "run" / "outputs").exists() or not any((tmp_path / "run" / "outputs").iterdir())


async def test_a_gate_left_waiting_when_the_room_quits_holds_the_run_and_asks_again_next_time(tmp_path: Path) -> None:
    app, link = room(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gate is not None)
        burst(app, "a")
        await until(pilot, lambda: isinstance(app.screen, GateScreen))
        await pilot.press("escape")  # later
        await until(pilot, lambda: not isinstance(app.screen, GateScreen))
        assert app.gate is not None  # still waiting
    link.stop()
    report = link.engine.steps_report
    assert report is not None and int(report.exit_code) == 7
    assert [s.status for s in report.segments] == ["finished", "held at gate"]
    # The next room finds the reduce finished earlier and asks at the gate again, at once.
    again, link2 = room(tmp_path)
    async with again.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: again.gate is not None)
    link2.stop()
    assert link2.engine.steps_report is not None
    assert link2.engine.steps_report.segments[0].status == "finished earlier"


async def test_a_without_a_gate_says_none_is_waiting(tmp_path: Path) -> None:
    app, _link = room(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.gate is not None)
        app.gate = None  # as after an answer from elsewhere
        seen = note_ids(app)
        burst(app, ":approve fine\r")
        await until(pilot, lambda: any("no gate is waiting" in n for n in notes_since(app, seen)))
