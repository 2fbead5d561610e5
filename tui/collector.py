"""When Python's garbage collector may take a long pause: never while someone is typing.

The decision this module protects: a key press is answered within a frame, so the UI loop never
stops for a full collection while keys are coming. CPython runs a full (generation 2) collection
whenever a tenth of its young collections have promoted a quarter as many objects again as the
last full one kept. Textual's strip caches keep tens of thousands of objects alive, so a full
collection took 20-65 ms, about once a second, and a key pressed then waited for it.

So, once the first snapshot is painted: everything alive is frozen (``gc.freeze``: the imports,
the DOM, the engine's task table; a collection never walks them again), automatic full
collections are off (young ones, a millisecond or two, go on as before), and a full collection
runs at the first check after the keyboard has been quiet for ``QUIET_S``, at most every
``EVERY_S``, and in any case after ``LATEST_S``, so garbage in reference cycles is still freed
within a minute while a person holds a key down. Frozen objects are still freed as soon as
nothing refers to them; only cycles among them wait until the app exits (``stop``).
"""

from __future__ import annotations

import gc
import time

__all__ = ["QuietCollector"]


class QuietCollector:
    """Holds full garbage collections back to moments without key presses."""

    QUIET_S = 1.0
    """The keyboard must have been quiet this long before a full collection runs."""
    EVERY_S = 10.0
    """Full collections run at most this often."""
    LATEST_S = 60.0
    """A full collection runs after this long whatever the keyboard does."""
    CHECK_S = 0.5
    """How often the app asks (``tick``)."""

    def __init__(self) -> None:
        self.running = False
        self.collections = 0
        """Full collections run by ``tick``."""
        self._threshold = gc.get_threshold()
        self._last_key = 0.0
        self._last_full = 0.0

    def start(self) -> None:
        """Freeze what is alive now and stop automatic full collections."""
        if self.running:
            return
        self.running = True
        gc.freeze()
        self._threshold = gc.get_threshold()
        young, middle, _ = self._threshold
        # A full collection would wait for this many middle ones: never, in practice.
        gc.set_threshold(young, middle, 2**31 - 1)
        self._last_full = time.monotonic()

    def key_pressed(self) -> None:
        """A key arrived: the next full collection waits for the keyboard to go quiet again."""
        self._last_key = time.monotonic()

    def tick(self) -> bool:
        """Run a full collection if one is due and the moment is quiet; True if it ran."""
        if not self.running:
            return False
        now = time.monotonic()
        since_full = now - self._last_full
        quiet = now - self._last_key >= self.QUIET_S
        if not ((quiet and since_full >= self.EVERY_S) or since_full >= self.LATEST_S):
            return False
        gc.collect()
        self._last_full = time.monotonic()
        self.collections += 1
        return True

    def stop(self) -> None:
        """Give the collector back as it was: thresholds, and the frozen objects to collect."""
        if not self.running:
            return
        self.running = False
        gc.set_threshold(*self._threshold)
        gc.unfreeze()
