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
    """How often a held key looks again for a top screen that is still being mounted."""

    def __init__(self, app: App[_R], route: Callable[[Held], Awaitable[None]]) -> None:
        self._app = app
        self._route = route
        self._held: deque[Held] = deque()
        self._seq = 0
        self._busy = False
        self._stuck: Timer | None = None
        self._mounting_since = 0.0

    @property
    def held(self) -> int:
        """Keys and pastes waiting for the one before them."""
        return len(self._held)

    @property
    def busy(self) -> bool:
        """A key has been routed and is still being handled."""
        return self._busy

    async def arrive(self, event: Held) -> None:
        """A key or paste from the terminal, in the order typed."""
        self._held.append(event)
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
        if not self._held or self._busy:
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

    async def _retry(self) -> None:
        self._busy = False
        await self._next()
