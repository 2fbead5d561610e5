"""Command mode (``:``) and the keys around it, over a real engine: every verb answers, nothing
typed takes the control room down, and the run stops only when the user stops it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from textual.widgets import Input
from textual.widgets._footer import FooterKey
from wd_screen import screen_text
from wd_tui import asking, burst, commands, engine_app, note_ids, notes, notes_since, slow_spec, until

from warpdeck.engine.api import ControlSettings, Pause, parse_spec
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.detail import DetailScreen
from warpdeck.tui.screens.workers import WorkersScreen
from warpdeck.tui.widgets.key_footer import KeyFooter
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.task_list import TaskList


def bar_error(app: WarpdeckApp) -> str:
    return str(app.screen.query_one("#prompt-error").render())


ANSWERS = [
    ("worker nope", "no worker 'nope'"),
    ("worker", "worker ID: takes one word"),
    ("worker a b", "worker ID: takes one word"),
    ("detail nosuch", "no task 'nosuch'"),
    ("detail", "detail KEY: takes one task key"),
    ("cancel syn-99999999", "no task 'syn-99999999'"),
    ("cancel", "cancel KEY…: needs at least one task key"),
    ("depth abc", "depth N: takes one whole number"),
    ("depth ²", "depth N: takes one whole number"),
    ("depth 1", "depth 1: it must be 2..64"),
    ("depth 99999999999999999999999", "it must be 2..64"),
    ("theme nope", "no theme 'nope'"),
    ("screen nope", "no screen 'nope'"),
    ("filter key:(", "not a regular expression"),
    ("frobnicate", "unknown command 'frobnicate'"),
    ("pause now", "pause takes no arguments"),
    ("", "type a command"),
    ("quarantine nope", "no worker 'nope'"),
    ("release nope", "no worker 'nope'"),
]
"""(what is typed after ':', what the answer says: in a notification, or in the prompt's error line)."""


async def test_every_verb_answers_and_the_run_goes_on(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        bar = app.screen.query_one(PromptBar)
        for typed, answer in ANSWERS:
            seen = note_ids(app)
            burst(app, f":{typed}\r")
            await until(pilot, lambda answer=answer, seen=seen: any(answer in n for n in notes_since(app, seen))
                        or (bar.is_open and answer in bar_error(app)))
            if bar.is_open:
                burst(app, "\x1b")
                await until(pilot, lambda: not bar.is_open)
            assert app.is_running and not app.snapshot.finished, typed
            assert app.errors == 0, (typed, notes(app))
        assert app.current_mode == "board"


async def test_an_action_that_fails_is_shown_logged_and_the_app_goes_on(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: WorkersScreen) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(WorkersScreen, "action_sort", broken)  # a fault no real key can cause today
    async with engine_app(tmp_path, log_path=tmp_path / "room.log") as (app, pilot, link):
        burst(app, "2s")
        await until(pilot, lambda: app.errors == 1)
        assert any("RuntimeError: injected" in n and str(tmp_path / "room.log") in n for n in notes(app))
        assert "RuntimeError: injected" in (tmp_path / "room.log").read_text()
        burst(app, "1p")  # still answering keys, and the engine still takes commands
        await until(pilot, lambda: commands(link) == [Pause()])
        assert app.is_running


def test_a_control_room_that_fails_leaves_the_run_going_headless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    from warpdeck.cli.control_room import run_control_room

    arrived = threading.Event()

    def broken(self: WarpdeckApp, message: object) -> None:
        arrived.set()
        raise RuntimeError("the app broke")

    monkeypatch.setattr(WarpdeckApp, "on_snapshot_arrived", broken)
    spec = parse_spec({
        "name": "survivor", "batch_size": 8,
        "source": {"kind": "synthetic", "count": 400, "shape": [64], "dtype": "float32"},
        "sink": {"kind": "null"}, "stages": [{"fn": "wd_stages:slow_double"}],
    }, "<test>")
    report = run_control_room(spec, tmp_path / "run", control=ControlSettings(), headless=True)
    assert arrived.is_set()
    assert report is not None and report.status == "finished" and report.counts.done == 400
    err = capfd.readouterr().err
    assert "the run goes on headless" in err
    assert "warpdeck attach mqtt://127.0.0.1:" in err and "--pipeline survivor" in err
    assert "the app broke" in (tmp_path / "run" / "warpdeck.log").read_text()


async def test_undo_is_a_stack_worded_as_what_it_restored(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        depth = app.snapshot.lanes[0].depth
        burst(app, "++")
        await until(pilot, lambda: app.snapshot.lanes[0].depth == depth + 2)
        burst(app, "u")
        await until(pilot, lambda: app.snapshot.lanes[0].depth == depth + 1)
        assert any(n.startswith(f"undone: depth back to {depth + 1}") for n in notes(app))
        burst(app, "u")
        await until(pilot, lambda: app.snapshot.lanes[0].depth == depth)
        assert any(n == f"undone: depth back to {depth}" for n in notes(app))


async def test_while_paused_the_footer_offers_resume(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        footer = app.screen.query_one(KeyFooter)

        def offered() -> set[str]:
            return {b.description for _, b, enabled, _ in app.screen.active_bindings.values() if b.show and enabled}

        assert "pause" in offered() and "resume" not in offered()
        burst(app, "p")
        await until(pilot, lambda: app.snapshot.feeder.state == "paused" and "resume" in offered())
        assert "pause" not in offered()
        await until(pilot, lambda: "resume" in {k.description for k in footer.query(FooterKey)})
        burst(app, "p")
        await until(pilot, lambda: app.snapshot.feeder.state != "paused" and "pause" in offered())


@pytest.mark.parametrize("key", ["ctrl+q", "ctrl+c", "q"])
async def test_every_way_out_asks_while_work_runs(tmp_path: Path, key: str) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        await pilot.press(key)
        await until(pilot, lambda: asking(app))
        assert "Quit and stop the pipeline?" in app.screen.question
        assert "keeps no journal" not in app.screen.question  # engine_app's run has a run directory
        await pilot.press("n")
        assert app.is_running and not app.snapshot.finished


async def test_a_prompt_open_keeps_the_destructive_keys_shut(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, ":")
        bar = app.screen.query_one(PromptBar)
        await until(pilot, lambda: bar.is_open)
        for action in ("drain", "cancel_task", "cancel_all", "quit_app"):
            await app.run_action(action)  # as a binding or the palette would
        assert not isinstance(app.screen, ConfirmScreen) and commands(link) == []


async def test_the_last_worker_is_quarantined_only_after_asking(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        wid = app.snapshot.workers[0].id
        burst(app, f":quarantine {wid}\r")
        await until(pilot, lambda: asking(app))
        assert "last worker" in app.screen.question and commands(link) == []
        await pilot.press("y")
        await until(pilot, lambda: any("cannot progress" in n for n in notes(app)))
        await until(pilot, lambda: app.snapshot.workers[0].state == "quarantined")


async def test_tab_lists_the_verbs_and_the_candidates(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        burst(app, ":\t")
        bar = app.screen.query_one(PromptBar)
        await until(pilot, lambda: "cancel KEY…" in bar.candidates_shown)
        assert "depth N" in bar.candidates_shown and "quit" in bar.candidates_shown
        burst(app, "re")
        await until(pilot, lambda: "pause" not in bar.candidates_shown)
        assert bar.candidates_shown == "tab: resume · retry · requeue · reject · release"


async def test_detail_of_a_finished_task_and_of_an_unknown_one(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, _link):
        burst(app, ":detail syn-00000000\r")
        await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        burst(app, "\x1b:detail syn-x\r")
        await until(pilot, lambda: any("no task 'syn-x'" in n for n in notes(app)))
        burst(app, ":detail syn-00150000\r")  # the source will yield it; the feeder has not yet
        await until(pilot, lambda: isinstance(app.screen, DetailScreen)
                    and "queued (not yet admitted)" in "\n".join(screen_text(app)))


async def test_cancelling_a_task_not_yet_admitted_is_remembered(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        burst(app, ":cancel syn-00150000\r")
        await until(pilot, lambda: asking(app))
        assert app.screen.question == "Cancel syn-00150000, queued (not yet admitted)?"
        await pilot.press("y")
        await until(pilot, lambda: any("cancelled when it is" in n for n in notes(app)))
        assert link.sent[-1].result.ok and app.is_running


def test_only_warpdecks_themes_are_offered(tmp_path: Path) -> None:
    from warpdeck.themes import BUILTIN_THEMES
    from warpdeck.tui.link import StreamLink

    app = WarpdeckApp(StreamLink([]))
    assert set(BUILTIN_THEMES) <= set(app.available_themes) == set(app.theme_names)
    assert "textual-dark" not in app.available_themes


async def test_a_prompt_holds_exactly_what_was_typed(tmp_path: Path) -> None:
    async with engine_app(tmp_path, slow_spec(count=5000)) as (app, pilot, _link):
        typed = "cancel syn-0000 q X d ? 1 2 3 : / f t"
        burst(app, ":" + typed)
        field = app.screen.query_one(PromptBar).query_one(Input)
        await until(pilot, lambda: field.value == typed)


async def test_the_quit_question_of_a_run_without_a_journal_says_so(tmp_path: Path) -> None:
    from warpdeck.tui.link import EngineLink

    link = EngineLink(slow_spec(), tmp_path / "run", journal=False)  # as the demo runs by default
    app = WarpdeckApp(link, log_path=tmp_path / "room.log")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot is not None)
        await pilot.press("q")
        await until(pilot, lambda: asking(app))
        assert "keeps no journal" in app.screen.question and "journal keeps" not in app.screen.question
        await pilot.press("n")
        assert app.is_running


async def test_a_command_that_changes_nothing_says_so_and_leaves_nothing_to_undo(tmp_path: Path) -> None:
    # Issue 29: `:pause⏎ :pause⏎ u u` left a running run paused, the second u undoing the no-op pause
    # by resuming and the first... the stack held two resumes. Now the second pause says "already
    # paused" and pushes nothing: one u resumes, the next has nothing to undo.
    async with engine_app(tmp_path) as (app, pilot, _link):
        burst(app, ":pause\r")
        await until(pilot, lambda: app.snapshot.feeder.state == "paused")
        seen = note_ids(app)
        burst(app, ":pause\r")
        await until(pilot, lambda: any(n == "already paused" for n in notes_since(app, seen)))
        assert len(app.undo_stack) == 1
        burst(app, "u")
        await until(pilot, lambda: app.snapshot.feeder.state != "paused")
        seen = note_ids(app)
        burst(app, "u")
        await until(pilot, lambda: any(n.startswith("nothing to undo") for n in notes_since(app, seen)))
        assert app.snapshot.feeder.state != "paused"


async def test_releasing_a_worker_that_is_not_quarantined_leaves_no_quarantine_to_undo(tmp_path: Path) -> None:
    # Issue 29: `:release vm.cpu⏎` on a worker not quarantined, then u, quarantined the only worker
    # without the question z asks.
    async with engine_app(tmp_path) as (app, pilot, _link):
        wid = app.snapshot.workers[0].id
        seen = note_ids(app)
        burst(app, f":release {wid}\r")
        await until(pilot, lambda: any(n == f"worker {wid} is not quarantined" for n in notes_since(app, seen)))
        assert len(app.undo_stack) == 0


async def test_undoing_a_release_of_the_last_worker_asks_as_quarantining_it_does(tmp_path: Path) -> None:
    async with engine_app(tmp_path) as (app, pilot, link):
        wid = app.snapshot.workers[0].id
        burst(app, f":quarantine {wid}\r")
        await until(pilot, lambda: asking(app))
        burst(app, "y")
        await until(pilot, lambda: app.snapshot.workers[0].state == "quarantined")
        burst(app, f":release {wid}\r")
        await until(pilot, lambda: app.snapshot.workers[0].state == "online")
        sent = len(link.sent)
        burst(app, "u")  # would quarantine the only worker again: asked first
        await until(pilot, lambda: asking(app))
        assert "last worker taking batches" in str(app.screen.question) and len(link.sent) == sent
        burst(app, "n")  # declined: nothing sent, and it is still there to undo
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        assert len(link.sent) == sent and len(app.undo_stack) == 2
        burst(app, "u")
        await until(pilot, lambda: asking(app))
        burst(app, "y")
        await until(pilot, lambda: app.snapshot.workers[0].state == "quarantined")
        assert len(app.undo_stack) == 1  # the quarantine's own undo (release) is next


async def test_after_the_run_no_command_is_offered_and_each_says_why(tmp_path: Path) -> None:
    # Issue 29: pause, cancel and retry were offered after the run had ended.
    async with engine_app(tmp_path, slow_spec(count=64, stage="wd_stages:sleep_2ms")) as (app, pilot, link):
        await until(pilot, lambda: app.snapshot.finished, 30)
        await pilot.pause()
        footer = {k.description for k in app.screen.query(FooterKey)}
        assert not footer & {"pause", "cancel", "retry"} and "quit" in footer, footer
        seen = note_ids(app)
        burst(app, "p")
        burst(app, ":drain\r")
        await until(pilot, lambda: sum("the run has ended" in n for n in notes_since(app, seen)) == 2)
        assert commands(link) == [] and not isinstance(app.screen, ConfirmScreen)


async def test_x_on_a_task_that_has_ended_asks_nothing(tmp_path: Path) -> None:
    # Issue 29: x on a done task asked to cancel it.
    async with engine_app(tmp_path) as (app, pilot, link):
        done = app.screen.query_one("#list-finished", TaskList)
        await until(pilot, lambda: done.count > 0)
        done.focus()
        await pilot.press("j")  # moved in: the highlight keeps its task as others arrive
        key = done.current_key
        assert key is not None
        seen = note_ids(app)
        burst(app, "x")
        await until(pilot, lambda: any(n == f"{key} is done: nothing to cancel" for n in notes_since(app, seen)))
        assert not isinstance(app.screen, ConfirmScreen) and commands(link) == []
