"""A seeded key fuzz over a running engine, at three terminal sizes: random keys, bursts and
pastes across every screen. The app never fails, the run is never drained, cancelled or stopped
(the fuzz never answers yes), and every prompt holds exactly what was typed into it.

Keys come in bursts posted at once, as a fast typist or ``tmux send-keys`` delivers them: the
race between routing and handling is what this test is for. ``y`` (yes) is never typed, and a
burst that may open a dialog holds no enter or space (a button with the focus would take it).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from textual import events
from textual.widgets import Input
from wd_tui import commands, engine_app, key_event, settled

from warpdeck.engine.api import Cancel, Drain
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.widgets.prompt_bar import PromptBar

SEED = 20261123
STEPS = 160

#: Every key the control room binds (less y), navigation, and keys it does not bind at all.
KEYS = [*"123?pdxXrR+-u/:fFtqhljkgGszb[]Z0", "tab", "shift+tab", "escape", "left", "right", "up", "down",
        "pageup", "pagedown", "home", "end", "ctrl+q", "ctrl+c", "backspace", "delete", "f1", "ctrl+x"]
#: Keys that may open a dialog: a burst with one of them holds no enter or space.
ASKS = {"d", "x", "X", "q", "z", "ctrl+q", "ctrl+c", ":"}
#: What may be typed into a prompt: printable characters, many of them board keys.
TEXT = "abcdefghijklmnopqrstuvwxz0123456789 -+:/?!._[]()*^$@#"


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
