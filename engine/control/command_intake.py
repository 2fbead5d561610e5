"""Signed commands from the wire to the engine: verified as they are read, run on the engine's loop,
answered with an event.

The decisions this module protects (docs/control-plane.md, "Commands"):
- A command is verified (HMAC, expiry, replay: engine/control/signing.py) as it is read, on the
  plane's loop, before the engine sees it.
- Refusing is cheap: a refused command costs no task and no publish of its own. It is counted by
  reason and its reason told in at most one event a second (engine/control/outbox.py); the first of
  a quiet reason carries the command's nonce as ``ref``, so a lone sender hears why.
- A verified command waits on the engine's loop in a task of its own, in arrival order, and is
  answered with one event tagged with its nonce: applied, or refused with the engine's message;
  whatever running it raises is answered as a refusal, never raised into the plane.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Future

from pydantic_core import from_json

from warpdeck.engine.control.outbox import EventQueue, Summaries
from warpdeck.engine.control.signing import CommandRefused, Verifier
from warpdeck.engine.control.wire import MAX_BYTES, Event
from warpdeck.engine.state.commands import Command, CommandResult

__all__ = ["CommandIntake"]

_MAX_NONCE = 64


class CommandIntake:
    """The plane's commands: ``on_command`` on the plane's loop, for each payload read on the
    command topic; ``command`` runs a verified one on ``engine_loop``."""

    def __init__(
        self,
        verifier: Verifier,
        command: Callable[[Command], Awaitable[CommandResult]],
        summaries: Summaries,
        events: EventQueue,
    ) -> None:
        self.verifier = verifier
        self._command = command
        self._summaries = summaries
        self._events = events
        self.refused: Counter[str] = Counter()
        """Commands refused, by reason."""
        self.applied = 0
        """Verified commands the engine ran, whatever they answered."""
        self.engine_loop: asyncio.AbstractEventLoop | None = None
        """The engine's loop, where commands run; set when the plane starts."""
        self._tasks: set[asyncio.Task[None]] = set()

    def on_command(self, payload: bytes) -> None:
        """Verify a command as it is read: a refusal costs no task and no publish of its own. A
        verified command waits on the engine's loop in a task of its own, in arrival order."""
        try:
            cmd = self.verifier.verify(payload)
        except CommandRefused as exc:
            self.refused[exc.reason] += 1
            first = self._summaries.note("command_refused", exc.reason, str(exc), lambda: _nonce_of(payload))
            if first is not None:
                self._events.put(first)
            return
        task = asyncio.create_task(self._apply(cmd, _nonce_of(payload)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self, cmd: Command, ref: str) -> None:
        assert self.engine_loop is not None
        fut: Future[CommandResult] = asyncio.run_coroutine_threadsafe(self._run(cmd), self.engine_loop)
        try:
            result = await asyncio.wrap_future(fut)
        except Exception as exc:  # noqa: BLE001 - reported, never raised into the plane
            self._events.put(Event(what="command_refused", subject=cmd.kind, reason=repr(exc)[:4096],
                                   t=time.time(), ref=ref))
            return
        self.applied += 1
        self._events.put(Event(what="command_applied" if result.ok else "command_refused", subject=cmd.kind,
                               reason=result.message[:4096], t=time.time(), ref=ref, affected=result.affected,
                               changed=result.changed))

    async def _run(self, cmd: Command) -> CommandResult:
        return await self._command(cmd)


def _nonce_of(payload: bytes | bytearray) -> str:
    """The nonce of a command payload, if it has a usable one (to tag the answer), else ""."""
    if len(payload) > MAX_BYTES["cmd"]:  # refused as oversized: never parsed whole
        return ""
    try:
        obj = from_json(payload)
    except ValueError:
        return ""
    nonce = obj.get("nonce") if isinstance(obj, dict) else None
    return nonce if isinstance(nonce, str) and len(nonce) <= _MAX_NONCE and nonce.isalnum() else ""
