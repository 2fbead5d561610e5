"""The pipeline actions behind the keys and the ``:`` verbs: each becomes one typed command sent
through the link.

The decision this module protects: the app holds no engine logic. An action reads the current
snapshot to decide which command it means, asks first where the action destroys work (or stops
the run from progressing), remembers the inverse where one exists, and reports the engine's
answer in the engine's words. Ids are looked up before a dialog opens: an unknown id is answered
``no task 'X'`` on the spot, and a dialog names each task as it is while it waits for the answer.
A key or id is repeated at most ``ECHO_CELLS`` wide (``echo``), the engine's answers included.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Literal

from warpdeck.engine.api import (
    DEPTH_MAX,
    DEPTH_MIN,
    Cancel,
    Command,
    Drain,
    EngineSnapshot,
    GateAsk,
    GateDecision,
    Pause,
    Quarantine,
    Release,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
    TaskDetail,
)
from warpdeck.tui.command_line import echo
from warpdeck.tui.operations import undoable_verbs
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.screens.gate import Choice, GateScreen
from warpdeck.tui.undo import Undoable, UndoStack
from warpdeck.tui.widgets.task_list import TaskList

if TYPE_CHECKING:
    from textual.app import App

    from warpdeck.tui.link import Link

    _Base = App[int]
else:
    _Base = object

__all__ = ["PipelineActions", "describe_task"]

_TOLD_S = 1.0
"""How long what the engine was told outranks the snapshots (they come at 10 Hz)."""


def describe_task(key: str, detail: TaskDetail | None) -> str:
    """A task as it is now, in a few words: ``syn-00000042 (running · compute)``."""
    key = echo(key)
    if detail is None:
        return f"{key} (no such task)"
    if not detail.admitted:
        return f"{key}, {detail.note or detail.state}"
    state = detail.state + (f" · {detail.phase}" if detail.state == "running" else "")
    if detail.stall != "none":
        state += f" · stalled: {detail.stall}"
    return f"{key} ({state})"


def _echo_words(answer: str) -> str:
    """The engine's ``answer`` with every word of it (a key, a worker id it repeats) at most
    ``ECHO_CELLS`` wide: what was typed may be any length, the engine's own words are short."""
    return " ".join(echo(word) for word in answer.split(" "))


_ENDED = frozenset({"done", "failed", "cancelled"})
"""A task in one of these states has ended: there is nothing to cancel."""


class PipelineActions(_Base):
    """Mixed into the app: ``action_*`` for every command key."""

    link: Link
    snapshot: EngineSnapshot | None
    gate: GateAsk | None
    """The gate a run of steps waits at (``GateAsked``), None when it waits at none."""
    undo_stack: UndoStack
    _asked: dict[str, tuple[int, float]]
    """What the engine was last told, and when (``_as_told``)."""
    report_error: Callable[[str, BaseException], None]

    def focused_key(self) -> str | None:
        """The highlighted task of the focused task list, if one has focus."""
        focused = self.focused
        return focused.current_key if isinstance(focused, TaskList) else None

    async def send(self, cmd: Command, *, undo: Undoable | None = None) -> bool:
        """Send ``cmd``; say what happened; remember how to undo it when it changed something (a
        ``pause`` while paused answers ``already paused`` and leaves nothing to undo)."""
        result = await self.link.send(cmd)
        self.notify(_echo_words(result.message), severity="information" if result.ok else "warning", timeout=4)
        if result.ok and result.changed and undo is not None:
            self.undo_stack.push(undo.inverse, undo.restores)
        return result.ok

    def send_soon(self, cmd: Command, undo: Undoable | None = None) -> None:
        """Send from a callback (a dialog's answer): in a worker, errors reported, never raised."""
        self.run_worker(self._guarded(self.send(cmd, undo=undo), cmd.kind), group="commands")

    async def _guarded(self, work: Awaitable[object], what: str) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - shown and logged; the control room goes on
            self.report_error(what, exc)

    def _confirm(self, question: str, cmd: Command, *, type_to_confirm: str | None = None,
                 describe: Callable[[], Awaitable[str]] | None = None,
                 then: Callable[[], None] | None = None) -> None:
        def answer(yes: bool | None) -> None:
            if yes:
                self.send_soon(cmd)
                if then is not None:
                    then()
        self.push_screen(ConfirmScreen(question, type_to_confirm=type_to_confirm, describe=describe), answer)

    async def details(self, keys: Iterable[str]) -> dict[str, TaskDetail | None]:
        """Each key's detail as the engine has it now (None: no such task)."""
        return {key: await self.link.detail(key) for key in keys}

    # -- what the engine was last told --------------------------------------------------------------
    def _told(self, what: str, value: int) -> None:
        self._asked[what] = (value, time.monotonic())
        if what == "paused":
            self.refresh_bindings()  # the footer offers p resume while paused

    def _as_told(self, what: str, shown: int) -> int:
        """``shown`` (the snapshot's), unless the engine was told otherwise since that snapshot may
        have been taken: keys in a burst (``++``, ``pp``) build on each other, not on a stale view.
        (A bool is an int: ``paused`` is told and read as one.)"""
        told = self._asked.get(what)
        return told[0] if told is not None and time.monotonic() - told[1] < _TOLD_S else shown

    # -- pause and resume --------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        snap = self.snapshot
        shown = snap is not None and snap.feeder.state == "paused" and not snap.finished
        return bool(self._as_told("paused", shown))

    async def action_pause(self) -> None:
        if await self.send(Pause(), undo=Undoable(Resume(), "resumed")):
            self._told("paused", True)

    async def action_resume(self) -> None:
        if await self.send(Resume(), undo=Undoable(Pause(), "paused again")):
            self._told("paused", False)

    # -- destructive: asked first --------------------------------------------------------------------
    def action_drain(self) -> None:
        self._confirm("Drain: admit nothing more and stop when what is admitted is done?", Drain())

    async def action_cancel_task(self) -> None:
        key = self.focused_key()
        if key is None:
            self.notify("no task highlighted: pick one on the board (x), or X to cancel everything",
                        severity="warning")
            return
        await self.cancel_tasks((key,))

    async def cancel_tasks(self, keys: tuple[str, ...]) -> None:
        """Ask, then cancel the named tasks; unknown ids are answered at once."""
        found = await self.details(dict.fromkeys(keys))
        unknown = [k for k, d in found.items() if d is None]
        ended = [k for k, d in found.items() if d is not None and d.state in _ENDED]
        known = tuple(k for k, d in found.items() if d is not None and d.state not in _ENDED)
        if unknown:
            self.notify("no task " + ", ".join(repr(echo(k)) for k in unknown[:6]) + (
                f" and {len(unknown) - 6} more" if len(unknown) > 6 else ""), severity="warning", timeout=5)
        if ended:  # asking to cancel a task that has ended would confirm nothing
            self.notify(", ".join(f"{echo(k)} is {found[k].state}" for k in ended[:6]) + (  # type: ignore[union-attr]
                f" and {len(ended) - 6} more" if len(ended) > 6 else "") + ": nothing to cancel", timeout=5)
        if not known:
            return

        async def describe() -> str:
            now = await self.details(known)
            return "Cancel " + ", ".join(describe_task(k, now[k]) for k in known[:6]) + (
                f" and {len(known) - 6} more" if len(known) > 6 else "") + "?"

        self._confirm(await describe(), Cancel(keys=known), describe=describe)

    def action_cancel_all(self) -> None:
        name = self.snapshot.pipeline if self.snapshot is not None else "all"
        self._confirm("Cancel EVERY unfinished task of this pipeline? This cannot be undone.", Cancel(all=True),
                      type_to_confirm=name)

    # -- the rest ------------------------------------------------------------------------------------
    async def action_retry_failed(self) -> None:
        key = self.focused_key()
        snap = self.snapshot
        if key is not None and snap is not None and key in {f.key for f in snap.failures}:
            await self.send(RetryFailed(keys=(key,)))
        else:
            await self.send(RetryFailed())

    async def action_requeue_stalled(self) -> None:
        await self.send(RequeueStalled())

    async def action_depth(self, step: int) -> None:
        snap = self.snapshot
        if snap is None or not snap.lanes:
            self.notify("no lanes yet", severity="warning")
            return
        await self.set_depth(self._as_told("depth", snap.lanes[0].depth) + step, clamp=True)

    async def set_depth(self, depth: int, *, clamp: bool = False) -> None:
        """Set every lane's slot depth (``clamp``: to the nearest allowed, as + and - do)."""
        snap = self.snapshot
        old = self._as_told("depth", snap.lanes[0].depth) if snap is not None and snap.lanes else None
        if clamp:
            depth = max(DEPTH_MIN, min(DEPTH_MAX, depth))
        if not DEPTH_MIN <= depth <= DEPTH_MAX:
            self.notify(f"depth {depth}: it must be {DEPTH_MIN}..{DEPTH_MAX}", severity="warning")
            return
        if depth == old and clamp:  # + or - at the end of the range (``:depth N`` still turns auto off)
            self.notify(f"slot depth stays {old} (range {DEPTH_MIN}..{DEPTH_MAX})", severity="warning")
            return
        undo = Undoable(SetDepth(depth=old), f"depth back to {old}") if old is not None else None
        if await self.send(SetDepth(depth=depth), undo=undo):
            self._told("depth", depth)

    def known_worker(self, worker: str) -> bool:
        """Whether the newest snapshot has ``worker``; if not, says ``no worker 'X'`` and which there are."""
        snap = self.snapshot
        known = [w.id for w in snap.workers] if snap is not None else []
        if worker not in known:
            self.notify(f"no worker {echo(worker)!r}" + (f"; workers: {', '.join(known)}" if known else ""),
                        severity="warning")
        return worker in known

    async def quarantine(self, worker: str, *, release: bool = False) -> None:
        """Quarantine ``worker`` (asking first if it is the last one taking batches), or release it;
        either way the other is the undo. An unknown id is answered here (it may be longer than a
        command can carry)."""
        if not self.known_worker(worker):
            return
        if release:
            await self.send(Release(worker=worker), undo=Undoable(Quarantine(worker=worker),
                                                                  f"{echo(worker)} quarantined again"))
            return
        undo = Undoable(Release(worker=worker), f"{echo(worker)} released")
        if self._last_taking(worker):
            self._ask_last(worker, lambda: self._quarantine_last(worker, undo), "u undoes")
            return
        await self.send(Quarantine(worker=worker), undo=undo)

    def _last_taking(self, worker: str) -> bool:
        """Whether ``worker`` is the only one still taking batches."""
        snap = self.snapshot
        taking = [w.id for w in snap.workers if w.state not in ("quarantined", "dead")] if snap is not None else []
        return taking == [worker]

    def _ask_last(self, worker: str, then: Callable[[], Awaitable[None]], undo_note: str,
                  declined: Callable[[], None] | None = None) -> None:
        """Ask before quarantining the last worker taking batches; ``then`` on yes, ``declined`` on no."""
        def answer(yes: bool | None) -> None:
            if yes:
                self.run_worker(self._guarded(then(), "quarantine"), group="commands")
            elif declined is not None:
                declined()
        self.push_screen(ConfirmScreen(f"{echo(worker)} is the last worker taking batches. Quarantine it? The run "
                                       f"cannot progress until it is released ({undo_note})."), answer)

    async def _quarantine_last(self, worker: str, undo: Undoable | None) -> None:
        if await self.send(Quarantine(worker=worker), undo=undo):
            self.notify(f"every worker is quarantined: the run cannot progress until one is released "
                        f"(:release {echo(worker)}, or u)", severity="warning", timeout=10)

    async def action_undo(self) -> None:
        last = self.undo_stack.pop()
        if last is None:
            self.notify(f"nothing to undo ({undoable_verbs()} can be undone)", severity="warning")
            return
        match last.inverse:
            case Quarantine(worker=worker) if self._last_taking(worker):
                # The undo asks what the forward action would ask; declined, it stays to undo.
                self._ask_last(worker, lambda: self._undo(last), f":release {echo(worker)}",
                               declined=lambda: self.undo_stack.push(last.inverse, last.restores))
                return
        await self._undo(last)

    async def _undo(self, last: Undoable) -> None:
        if await self.send(last.inverse):
            match last.inverse:
                case SetDepth(depth=depth):
                    self._told("depth", depth)
                case Pause() | Resume():
                    self._told("paused", isinstance(last.inverse, Pause))
            left = len(self.undo_stack)
            self.notify(f"undone: {last.restores}" + (f" ({left} more to undo)" if left else ""), timeout=4)

    # -- a run of steps' gate -------------------------------------------------------------------------
    def action_gate(self) -> None:
        """Show the gate the run waits at: what came out before it, a note, approve or reject."""
        if self.gate is None:
            self.notify("no gate is waiting", timeout=4)
            return

        def chosen(choice: Choice | None) -> None:
            if choice is not None:
                self.decide_gate(*choice)
        self.push_screen(GateScreen(self.gate), chosen)

    def decide_gate(self, decision: Literal["approved", "rejected"], note: str) -> None:
        """Approve or reject the waiting gate with ``note``, once confirmed (``:approve``, ``:reject``)."""
        gate = self.gate
        if gate is None:
            self.notify("no gate is waiting", timeout=4)
            return
        if decision == "rejected" and not note.strip():
            self.notify("a rejection needs a note: :reject WHY", severity="warning", timeout=6)
            return
        said = f" with the note {note!r}" if note else ""
        question = (f"Approve the gate of step {gate.step}{said}? The step and those after it run." if
                    decision == "approved" else
                    f"Reject the gate of step {gate.step}{said}? The run ends there (exit status 8).")

        def answer(yes: bool | None) -> None:
            if not yes:
                return
            if self.link.answer_gate(GateDecision(decision=decision, note=note.strip(), by="control room")):
                self.notify(f"gate of {gate.step} {decision}", timeout=6)
            else:
                self.notify("the gate no longer waits for an answer", severity="warning", timeout=6)
        self.push_screen(ConfirmScreen(question), answer)
