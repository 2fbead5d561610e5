"""Helpers for control-room tests: an app over a real engine that keeps running, and waiting on
conditions (never on wall-clock sleeps alone)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App
from textual.keys import _character_to_key
from textual.pilot import Pilot

from warpdeck.engine.api import PipelineSpec, parse_spec
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import EngineLink

SIZE = (150, 42)


def slow_spec(count: int = 200_000, name: str = "tui-test", stage: str = "wd_stages:sleep_100ms") -> PipelineSpec:
    """A pipeline that runs far longer than any test (by default 100 ms a batch of 8). It keeps
    the process mostly idle, because Pilot waits after each key for the process to go idle."""
    return parse_spec({
        "name": name, "batch_size": 8, "lanes": 2,
        "source": {"kind": "synthetic", "count": count, "shape": [64], "dtype": "float32", "seed": 3},
        "sink": {"kind": "null"}, "stages": [{"fn": stage}],
    }, "<test>")


async def until(pilot: Pilot[Any], cond: Callable[[], object], limit_s: float = 10.0) -> None:
    """Let the app run until ``cond()`` holds; fail after ``limit_s`` seconds."""
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {limit_s} s")
        await pilot.pause(0.02)


@contextlib.asynccontextmanager
async def engine_app(tmp_path: Path, spec: PipelineSpec | None = None, *, size: tuple[int, int] = SIZE,
                     **app_kw: Any) -> AsyncIterator[tuple[WarpdeckApp, Pilot[Any], EngineLink]]:
    """The control room over a real, running engine; waits for the first snapshot."""
    link = EngineLink(spec or slow_spec(), tmp_path / "run")
    app = WarpdeckApp(link, screenshot_dir=tmp_path, **app_kw)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.counts.done > 0)
        yield app, pilot, link


_CONTROL_KEYS = {"\r": "enter", "\n": "enter", "\x1b": "escape", "\t": "tab", "\x7f": "backspace"}


async def settled(pilot: Pilot[Any], limit_s: float = 10.0) -> None:
    """Until every key posted so far has been routed and handled (the app's key gate is empty)."""
    app = pilot.app
    await until(pilot, lambda: app.keygate.held == 0 and not app.keygate.busy, limit_s)  # type: ignore[attr-defined]
    await pilot.pause()


def key_event(char: str) -> events.Key:
    """The key a terminal delivers for one typed character (``\\r`` enter, ``\\x1b`` escape, ``\\t`` tab)."""
    if char in _CONTROL_KEYS:
        return events.Key(_CONTROL_KEYS[char], None if char != "\t" else "\t")
    return events.Key(_character_to_key(char), char)


def burst(app: App[Any], text: str) -> None:
    """Post ``text`` to the app as keys, all at once: what a terminal delivers when keys are typed
    (or sent) faster than the app handles them. Pilot's ``press`` waits for idle after each key."""
    for char in text:
        app.post_message(key_event(char))


def asking(app: App[Any]) -> bool:
    """A question is on screen and drawn: what a person can answer (a key typed before it was
    visible is never its answer: tui/keygate.py)."""
    return getattr(app.screen, "shown_at", None) is not None


def notes(app: App[Any]) -> list[str]:
    """The notifications the app shows now, oldest first (Textual drops each after its timeout)."""
    return [n.message for n in app._notifications]


def note_ids(app: App[Any]) -> set[str]:
    """The identities of the notifications shown now: to tell later ones apart by identity, since
    expired ones leave the list and an index into it would skip the next."""
    return {n.identity for n in app._notifications}


def notes_since(app: App[Any], seen: set[str]) -> list[str]:
    """The notifications shown now that were not among ``seen`` (from :func:`note_ids`)."""
    return [n.message for n in app._notifications if n.identity not in seen]


def commands(link: Any) -> list[Any]:
    """The commands the link has sent, in order."""
    return [s.command for s in link.sent]
