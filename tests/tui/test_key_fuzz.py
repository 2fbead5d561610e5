"""A seeded key fuzz over a running engine, at three terminal sizes: random keys, bursts and
pastes across every screen. The app never fails, the run is never drained, cancelled or stopped
(the fuzz never answers yes), and every prompt holds exactly what was typed into it.

Keys come in bursts posted at once, as a fast typist or ``tmux send-keys`` delivers them: the
race between routing and handling is what this test is for. ``y`` (yes) is never typed, and a
burst that may open a dialog holds no enter or space (a button with the focus would take it).
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual import events
from textual.widgets import Input
from wd_tui import asking, burst, commands, engine_app, key_event, notes, settled, slow_spec, until

from warpdeck.engine.api import Cancel, Drain, Pause, Resume, RetryFailed, SetDepth, State
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.widgets.prompt_bar import PromptBar
from warpdeck.tui.widgets.task_list import TaskList

SEED = 20261123
STEPS = 160

KEYS = [*"123?pdxXrR+-u/:fFtqhljkgGszb[]Z0", "tab", "shift+tab", "escape", "left", "right", "up", "down",
        "pageup", "pagedown", "home", "end", "ctrl+q", "ctrl+c", "backspace", "delete", "f1", "ctrl+x"]
"""Every key the control room binds (less y), navigation, and keys it does not bind at all."""
ASKS = {"d", "x", "X", "q", "z", "ctrl+q", "ctrl+c", ":"}
"""Keys that may open a dialog: a burst with one of them holds no enter or space."""
TEXT = "abcdefghijklmnopqrstuvwxz0123456789 -+:/?!._[]()*^$@#"
"""What may be typed into a prompt: printable characters, many of them board keys."""


def key(name: str) -> events.Key:
    if len(name) == 1:
        return key_event(name)
    return events.Key(name, None)


def random_burst(rng: random.Random) -> list[events.Key]:
    names = [rng.choice(KEYS) for _ in range(rng.randint(1, 12))]
    if not ASKS.intersection(names) and rng.random() < 0.3:
        names.insert(rng.randrange(len(names) + 1), "enter")
    return [key(n) for n in names]


def the_prompt(app: WarpdeckApp) -> Input | None:
    """The open prompt's input, if one is open."""
    for bar in app.screen.query(PromptBar):
        if bar.is_open:
            return bar.query_one(Input)
    return None


async def close_everything(app: WarpdeckApp, pilot) -> None:  # type: ignore[no-untyped-def]
    """Escape until no dialog or prompt is left over a main screen (never answering yes)."""
    for _ in range(6):
        if app.screen.name in ("board", "workers", "timeline") and the_prompt(app) is None:
            return
        app.post_message(key("escape"))
        await settled(pilot)
    raise AssertionError(f"escape does not close {app.screen!r}")


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_key_fuzz(tmp_path: Path, size: tuple[int, int]) -> None:
    rng = random.Random(f"{SEED}-{size}")
    keys = 0
    async with engine_app(tmp_path, size=size, log_path=tmp_path / "room.log") as (app, pilot, link):
        for step in range(STEPS):
            roll = rng.random()
            if roll < 0.55:
                burst = random_burst(rng)
                for event in burst:
                    app.post_message(event)
                keys += len(burst)
            elif roll < 0.9:  # a command typed in one burst, read back before anything runs
                await close_everything(app, pilot)
                text = "".join(rng.choice(TEXT) for _ in range(rng.randint(0, 24)))
                for char in ":" + text:
                    app.post_message(key_event(char))
                keys += len(text) + 1
                await settled(pilot)
                field = the_prompt(app)
                assert field is not None and field.value == text, (step, text, field and field.value)
                app.post_message(key(rng.choice(["escape", "escape", "enter"])))
            else:  # a paste, sometimes one that reads as a command
                text = rng.choice([":", "/", ""]) + "".join(rng.choice(TEXT + "\n") for _ in range(rng.randint(1, 40)))
                app.post_message(events.Paste(text))
            await settled(pilot)
            sent = commands(link)
            assert not any(isinstance(c, Drain | Cancel) for c in sent), (step, sent)
            assert app.is_running and app.crash is None, step
            assert app.errors == 0, (step, (tmp_path / "room.log").read_text())
            assert not app.snapshot.finished and app.snapshot.status in ("running", "paused"), step
            if isinstance(app.screen, ConfirmScreen) and rng.random() < 0.5:
                await close_everything(app, pilot)
        await close_everything(app, pilot)
    assert keys > 1000


_BURST_VERBS: list[tuple[str, Any]] = [
    ("pause", Pause()), ("resume", Resume()), ("retry", RetryFailed()), ("depth {n}", "depth"),
    ("cancel {key}", None), ("drain", None), ("cancel-all", None),
]
"""Commands a burst is made of: each with the command it sends, or None for one that asks first. Pause and resume answer
from the room where the run is already so (``already paused``), and the room may not know yet: they are sent or not, but
never out of order."""


def _in_order(sent: list[Any], typed: list[Any]) -> bool:
    """``sent`` is ``typed`` with some pauses and resumes left out, nothing reordered or added."""
    it = iter(typed)
    return all(any(c == t for t in it) for c in sent)


@pytest.mark.parametrize("seed", range(3))
async def test_command_bursts_with_slow_answers_run_each_command_once_in_order(tmp_path: Path, seed: int) -> None:
    # Bursts of two to ten commands posted at once while the engine answers late (each command's
    # answer and each task lookup delayed at random, as a loaded machine delays them): every
    # command runs once, in the order typed (depth and retry always; pause and resume where the
    # room does not already know the run is so); every question is answered only by a key typed
    # once it was visible, here always no (``n``, or escape where the answer is a typed word), so
    # nothing is cancelled or drained.
    rng = random.Random(f"{SEED}-bursts-{seed}")
    async with engine_app(tmp_path, slow_spec(stage="wd_stages:sleep_forever_ish"),
                          log_path=tmp_path / "room.log") as (app, pilot, link):
        lst = app.screen.query_one("#list-queued", TaskList)
        await until(pilot, lambda: lst.count > 20)
        view = app.snapshot.tasks
        queued = [view.keys[r] for r in np.flatnonzero(view.state == int(State.QUEUED))[-10:].tolist()]
        real_send, real_detail = link.send, link.detail

        async def slow_send(cmd: Any) -> Any:
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            return await real_send(cmd)

        async def slow_detail(key: str) -> Any:
            await asyncio.sleep(rng.uniform(0.0, 0.8))
            return await real_detail(key)

        link.send, link.detail = slow_send, slow_detail
        typed_all: list[Any] = []
        depth = 0
        for _ in range(4):
            typed = ""
            for _ in range(rng.randint(2, 10)):
                text, sends = rng.choice(_BURST_VERBS)
                depth = depth % 29 + 2  # a new depth each time: never "already"
                typed += ":" + text.format(n=depth, key=rng.choice(queued)) + "\r"
                if sends is not None:
                    typed_all.append(SetDepth(depth=depth) if sends == "depth" else sends)
            exact = [c for c in typed_all if not isinstance(c, Pause | Resume)]
            burst(app, typed)

            def settled_all() -> bool:
                return (not asking(app) and app.keygate.held == 0 and app.keygate.set_aside == 0
                        and not app.keygate.busy and app.screen.name == "board")

            def sent_exact() -> list[Any]:
                return [c for c in commands(link) if not isinstance(c, Pause | Resume)]

            end = time.monotonic() + 60
            while not (sent_exact() == exact and settled_all()):
                assert time.monotonic() < end, (typed, exact, sent_exact(), notes(app))
                await pilot.pause(0.02)
                await until(pilot, lambda: asking(app) or settled_all(), 30)
                if asking(app):  # each question, once drawn, gets a no typed after it
                    question = app.screen
                    await pilot.pause(0.05)
                    if getattr(question, "type_to_confirm", None) is None:
                        burst(app, "n")
                    else:  # a question answered by typing a word: escape says no
                        app.post_message(key("escape"))
                    await until(pilot, lambda q=question: app.screen is not q, 10)  # the next may ask at once
            sent = commands(link)
            assert _in_order(sent, typed_all), (sent, typed_all)
            assert not any(isinstance(c, Cancel | Drain) for c in sent)
            assert app.errors == 0, (tmp_path / "room.log").read_text()
