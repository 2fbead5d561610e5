"""Keys are routed one at a time, each by the focus its predecessor left.

The decision this module protects: a key typed after ``:`` goes into the prompt, however fast it
follows. Textual routes a key the moment the app reads it (to the focused widget, from which it
bubbles back up to the app's bindings) but runs a binding's action only when the bubbled key
reaches the app again, and moves the focus later still. In a burst (a fast typist, a paste
without bracketed paste, ``tmux send-keys``) every key was routed before the ``:`` that came
first had opened the prompt, so ``:depth 5`` reached the board as ``d``, ``e``, ``p``, ``t``,
``h``: the board's bindings, and ``d`` asks to drain, the ``enter`` that followed said yes.

So the gate holds each key (and paste) until the one before it has been handled: after routing a
key, a marker message follows it to the same widget and bubbles up behind it; when the marker
reaches the app, every handler and binding of the key has run, and one ``call_later`` later the
focus changes it asked for have been made too. Only then is the next key routed. A key that
arrives while the top screen is still being mounted (a dialog or prompt screen just pushed)
waits for it. Nothing is dropped: a marker that never comes back (its widget was removed) frees
the gate after ``STUCK_S``.

Two more rules keep an answer from being given by keys meant for something else (issue 29):
- A command typed at the prompt runs on after its Enter (it may look a task up for seconds before
  it asks): it ``hold``s the gate until it has answered or put its question on screen, so the
  keys typed meanwhile are not routed to the board behind it (``t`` switching the theme, Enter
  opening a task).
- A question (a screen with ``shown_at``, set as it is put on screen) never takes a key typed
  before it was there: such keys are set aside while it is up and go back, in order and ahead
  of anything newer, once it is gone (``give_back``). So ``:cancel K⏎`` then ``:retry⏎`` typed at
  once asks about the cancel, and ``:retry`` runs after the answer, not as it.

And a key the terminal merged is taken apart: a terminal sends alt+key as ESC and the key, so
escape followed at once by ``:`` reads as ``alt+colon``, which nothing is bound to; the gate routes
it as the escape and the ``:`` that were typed (``_as_typed``). Textual 8.2.8 drops that alt on
every key named by more than one letter (Textual issue #6663): ESC and ``:`` arrive as a plain
``:``, which opens the prompt from a screen but is typed into an open prompt. Once Textual keeps
the alt, this is what keeps escape-then-``:`` opening the prompt.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Generic, TypeVar

from textual import events
from textual.message import Message
from textual.timer import Timer

if TYPE_CHECKING:
    from textual.app import App

__all__ = ["KeyGate", "KeyRouted"]

Held = events.Key | events.Paste
_R = TypeVar("_R")

_MERGED: dict[str, tuple[tuple[str, str], ...]] = {"alt+colon": (("escape", "\x1b"), ("colon", ":"))}
"""Keys a terminal merges when typed fast, by name: what was typed, as (key name, character)."""


def _as_typed(event: Held) -> tuple[Held, ...]:
    """``event`` as the keys typed: ``alt+colon`` is escape and ``:``; anything else is itself.
    The keys keep the time the merged one arrived (a question takes only keys typed once it showed)."""
    typed = _MERGED.get(event.key) if isinstance(event, events.Key) else None
    if typed is None:
        return (event,)
    keys = tuple(events.Key(key, character) for key, character in typed)
    for key in keys:
        key.time = event.time
    return keys


class KeyRouted(Message):
    """Follows a key to the widget it was routed to and bubbles up to the app behind it."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.seq = seq


class KeyGate(Generic[_R]):
    """Queues keys and pastes; hands them to ``route`` one at a time (see the module docstring).
    Generic in what the app returns (as Textual's ``Pilot`` is), which the gate never looks at."""

    STUCK_S = 0.5
    """How long a routed key may hold the gate before the next one goes anyway."""

    RETRY_S = 0.002
    """How often a held key looks again for a top screen that is still being mounted or drawn."""

    HOLD_S = 30.0
    """The longest a command may hold the keys (an engine that never answers cannot freeze them)."""

    def __init__(self, app: App[_R], route: Callable[[Held], Awaitable[None]]) -> None:
        self._app = app
        self._route = route
        self._held: deque[Held] = deque()
        self._seq = 0
        self._busy = False
        self._stuck: Timer | None = None
        self._mounting_since = 0.0
        self._holds = 0
        self._aside: list[Held] = []
        """Keys typed before the question now on screen was visible: routed once it is gone."""

    @property
    def held(self) -> int:
        """Keys and pastes waiting for the one before them."""
        return len(self._held)

    @property
    def busy(self) -> bool:
        """A key has been routed and is still being handled."""
        return self._busy

    @property
    def set_aside(self) -> int:
        """Keys typed before the question on screen was visible, waiting for it to go."""
        return len(self._aside)

    def hold(self) -> Callable[[], None]:
        """Route no key until the returned ``release`` is called (at the latest after ``HOLD_S``):
        a command that a key started and that answers later."""
        self._holds += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            timer.stop()
            self._holds -= 1
            if not self._holds:
                self._app.call_later(self._next)

        timer = self._app.set_timer(self.HOLD_S, release)
        return release

    def give_back(self) -> None:
        """The question is gone: the keys set aside while it was up go next, in the order typed."""
        if self._aside:
            self._held.extendleft(reversed(self._aside))
            self._aside.clear()
        self._app.call_later(self._next)

    async def arrive(self, event: Held) -> None:
        """A key or paste from the terminal, in the order typed."""
        self._held.extend(_as_typed(event))
        if not self._busy:
            await self._next()

    def routed(self, marker: KeyRouted) -> None:
        """The marker of the key routed last reached the app: the next key may go once the
        callbacks that key's handlers scheduled (a focus change) have run."""
        if marker.seq == self._seq and self._busy:
            self._app.call_later(self._done, marker.seq)

    async def _done(self, seq: int) -> None:
        if seq != self._seq or not self._busy:
            return
        if self._stuck is not None:
            self._stuck.stop()
            self._stuck = None
        self._busy = False
        await self._next()

    async def _next(self) -> None:
        if not self._held or self._busy or self._holds:
            return
        if not self._question_takes(self._held[0]):
            return
        if not self._app.screen.is_mounted:  # a screen just pushed: its focus is not set yet
            now = time.monotonic()
            self._mounting_since = self._mounting_since or now
            if now - self._mounting_since < self.STUCK_S:  # (one that never mounts is given up on)
                self._busy = True
                self._app.set_timer(self.RETRY_S, self._retry)
                return
        self._mounting_since = 0.0
        event = self._held.popleft()
        self._seq += 1
        self._busy = True
        target = self._app.focused or self._app.screen
        await self._route(event)
        if target.post_message(KeyRouted(self._seq)):
            self._stuck = self._app.set_timer(self.STUCK_S, partial(self._done, self._seq))
        else:  # the widget is gone: nothing of the key is left to wait for
            self._app.call_later(self._done, self._seq)

    def _question_takes(self, event: Held) -> bool:
        """Whether ``event`` may go on to the screen on top: any screen but a question takes it; a
        question takes only keys typed once it was visible. Earlier ones are set aside (and the
        next is looked at); while the question is not drawn yet, the key waits (False)."""
        screen = self._app.screen
        if not hasattr(screen, "shown_at"):
            return True
        while self._held:
            shown: float | None = screen.shown_at
            if shown is None:  # pushed, not drawn yet: wait for it
                self._busy = True
                self._app.set_timer(self.RETRY_S, self._retry)
                return False
            if self._held[0].time >= shown:
                return True
            self._aside.append(self._held.popleft())
        return False

    async def _retry(self) -> None:
        self._busy = False
        await self._next()
