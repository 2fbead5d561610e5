"""One line per change in a worker's life, printed as it happens by the headless display.

The decisions this module protects:
- A lost worker is never silent: its conviction (with the cause and what was requeued), its return
  under a new epoch, Ray waiting for room to restart it, and its end (Ray will not restart it) each
  print one line, from the engine's run events, whatever the display (live or not).
- A conviction prints once per worker and epoch: the second path to it (the Will, then Ray's
  actor-death error, or the other way round) finds nothing left and says nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from warpdeck.engine.api import RunEvent, WorkerConvicted, worker_line

__all__ = ["WorkerLines", "worker_line"]


class WorkerLines:
    """Subscribe ``listen`` to the engine's run events: each worker line goes to ``say`` with the
    time of day in front (``12:03:04 worker ray-1 convicted (will): …``)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._convicted: set[tuple[str, int]] = set()

    def listen(self, event: RunEvent) -> None:
        if isinstance(event, WorkerConvicted):
            seen = (event.worker, event.epoch)
            if seen in self._convicted:
                return
            self._convicted.add(seen)
        line = worker_line(event)
        if line is not None:
            self._say(f"{time.strftime('%H:%M:%S')} {line}")
