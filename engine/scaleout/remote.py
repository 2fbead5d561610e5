"""The engine's handle on one Ray actor: its id, the epoch it works under, whether it lives.

The decisions this module protects:
- The engine leases a batch to an actor under the epoch the actor itself reported (``hello``),
  never one it guessed; until the actor has answered, it gets no work.
- After a conviction (its Will, silence, or Ray's actor-death error, whichever came first) the
  engine asks the actor again, once at a time: a restarted actor answers from its new process
  with a new epoch; a live one that was convicted is told to re-birth first. An actor Ray will
  not restart is *gone*: its lanes stop taking batches.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from warpdeck.engine.scaleout import raylink
from warpdeck.engine.scaleout.jobs import BatchJob, BatchOutcome, WorkerHello

__all__ = ["RemoteWorker"]

_FIRST_RETRY_S = 0.1
_MAX_RETRY_S = 2.0


class RemoteWorker:
    """One actor as the engine sees it. ``on_change`` runs (on the engine's loop) whenever its
    epoch changes or it is gone, so waiting lanes look again."""

    def __init__(self, worker_id: str, index: int, on_change: Callable[[], None]) -> None:
        self.id = worker_id
        self.index = index
        self.handle: Any = None
        self.hello: WorkerHello | None = None
        #: The epoch batches are leased under (0 until the actor first answers).
        self.epoch = 0
        self.batches_done = 0
        self.error = ""
        self.gone = asyncio.Event()
        self._on_change = on_change
        self._asking: asyncio.Task[None] | None = None

    async def run(self, job: BatchJob) -> BatchOutcome:
        """Run ``job`` on the actor (raises ``WorkerDied`` when the actor dies meanwhile)."""
        outcome: BatchOutcome = await raylink.call(self.handle, self.id, "run", job)
        return outcome

    async def greet(self, convicted: int = 0) -> WorkerHello:
        """Ask the actor who it is; a newer epoch is taken at once."""
        hello: WorkerHello = await raylink.call(self.handle, self.id, "hello", convicted)
        self.hello = hello
        if hello.epoch > self.epoch:
            self.epoch = hello.epoch
            self._on_change()
        return hello

    def convicted(self, epoch: int) -> None:
        """The engine convicted ``epoch`` (or older): learn the actor's next one, in the background."""
        if self._asking is None or self._asking.done():
            self._asking = asyncio.get_running_loop().create_task(self._ask(epoch), name=f"warpdeck-{self.id}-rebirth")

    async def _ask(self, convicted: int) -> None:
        delay = _FIRST_RETRY_S
        while not self.gone.is_set():
            try:
                hello = await self.greet(convicted)
            except raylink.WorkerDied as exc:
                self.error = str(exc)
                if exc.permanent:
                    self.gone.set()
                    self._on_change()
                    return
            else:
                if hello.epoch > convicted:
                    return
            await asyncio.sleep(delay)  # restarting: Ray answers again once the new process is up
            delay = min(2 * delay, _MAX_RETRY_S)

    async def close(self, timeout_s: float) -> None:
        """Stop the actor: its lanes finish, its heartbeat says goodbye; then end it for good."""
        if self._asking is not None:
            self._asking.cancel()
            with contextlib.suppress(BaseException):
                await self._asking
        if self.handle is None:
            return
        if not self.gone.is_set():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout_s):  # not wait_for: it can swallow a cancellation (3.11)
                    await raylink.call(self.handle, self.id, "stop")
        raylink.kill(self.handle)
        self.gone.set()
