"""The engine's handle on one Ray actor: its id, the epoch it works under, whether it lives.

The decisions this module protects:
- The engine leases a batch to an actor under the epoch the actor itself reported (``hello``),
  never one it guessed; until the actor has answered, it gets no work.
- After a conviction (its Will, silence, or Ray's actor-death error, whichever came first) the
  engine asks the actor again, once at a time: a restarted actor answers from its new process
  with a new epoch; a live one that was convicted is told to re-birth first. An actor Ray will
  not restart is *gone*: its lanes stop taking batches.
- While it is asked, Ray's actor table is read beside the question (a call to a restarting actor
  waits without a word): an actor Ray cannot place (no node has room) shows why in ``note``
  (``restarting: waiting for 1 GPU``) instead of a silent stall. Each step is a run event, emitted
  on the engine's loop: waiting, back under a new epoch, gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from warpdeck.engine.scaleout import raylink
from warpdeck.engine.scaleout.jobs import BatchJob, BatchOutcome, WorkerHello
from warpdeck.engine.state.run_events import RunEvent, WorkerGone, WorkerReborn, WorkerWaiting, now

__all__ = ["RemoteWorker"]

_FIRST_RETRY_S = 0.1
_MAX_RETRY_S = 2.0
_LOOK_S = 0.5
"""How often Ray's actor table is read while an actor is asked and does not answer."""


def _quiet(_event: RunEvent) -> None:
    """No one listens (a RemoteWorker outside an engine)."""


class RemoteWorker:
    """One actor as the engine sees it. ``on_change`` runs (on the engine's loop) whenever its
    epoch changes or it is gone, so waiting lanes look again."""

    def __init__(self, worker_id: str, index: int, on_change: Callable[[], None]) -> None:
        self.id = worker_id
        self.index = index
        self.handle: Any = None
        self.hello: WorkerHello | None = None
        self.epoch = 0
        """The epoch batches are leased under (0 until the actor first answers)."""
        self.batches_done = 0
        self.error = ""
        self.note = ""
        """Why it is not working, from Ray's actor table ("" while it works or is not asked)."""
        self.emit: Callable[[RunEvent], None] = _quiet
        """Where its run events go (the engine's ``RunEvents.emit``)."""
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
        looking = asyncio.get_running_loop().create_task(self._look(), name=f"warpdeck-{self.id}-look")
        try:
            await self._ask_until_back(convicted)
        finally:
            looking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await looking
            self.note = ""

    async def _ask_until_back(self, convicted: int) -> None:
        delay = _FIRST_RETRY_S
        while not self.gone.is_set():
            try:
                hello = await self.greet(convicted)
            except raylink.WorkerDied as exc:
                self.error = str(exc)
                if exc.permanent:
                    self.gone.set()
                    self.emit(WorkerGone(now(), self.id, exc.detail))
                    self._on_change()
                    return
            else:
                if hello.epoch > convicted:
                    self.emit(WorkerReborn(now(), self.id, hello.epoch, hello.pid))
                    return
            await asyncio.sleep(delay)  # restarting: Ray answers again once the new process is up
            delay = min(2 * delay, _MAX_RETRY_S)

    async def _look(self) -> None:
        """Read Ray's actor table while the actor is asked: ``note`` says why it is not running;
        a new reason to wait (resources no node has free) is a run event."""
        said = ""
        while True:
            await asyncio.sleep(_LOOK_S)
            note = await asyncio.to_thread(raylink.actor_waiting, self.handle) or ""
            if self.gone.is_set():
                return
            self.note = note
            if "waiting" in note and note != said:
                self.emit(WorkerWaiting(now(), self.id, note))
            said = note

    async def close(self, timeout_s: float) -> None:
        """Stop the actor: its lanes finish, its heartbeat says goodbye; then end it for good. One
        still being asked (restarting, waiting for room, frozen) is not asked to stop: it is ended."""
        back = self._asking is None or self._asking.done()
        if self._asking is not None:
            self._asking.cancel()
            with contextlib.suppress(BaseException):
                await self._asking
        if self.handle is None:
            return
        if back and not self.gone.is_set():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout_s):  # not wait_for: it can swallow a cancellation (3.11)
                    await raylink.call(self.handle, self.id, "stop")
        raylink.kill(self.handle)
        self.gone.set()
