"""The pipeline actions behind the keys: each becomes one typed command sent through the link.

The decision this module protects: the app holds no engine logic. An action reads the current
snapshot to decide which command it means (pause or resume, which depth), asks first where the
action destroys work, remembers the inverse where one exists, and reports the engine's answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from warpdeck.engine.api import (
    Cancel,
    Command,
    Drain,
    EngineSnapshot,
    Pause,
    Quarantine,
    Release,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
)
from warpdeck.tui.screens.confirm import ConfirmScreen
from warpdeck.tui.undo import UndoSlot
from warpdeck.tui.widgets.task_list import TaskList

if TYPE_CHECKING:
    from textual.app import App

    from warpdeck.tui.link import Link

    _Base = App[int]
else:
    _Base = object

__all__ = ["PipelineActions"]

_MIN_DEPTH, _MAX_DEPTH = 2, 64


class PipelineActions(_Base):
    """Mixed into the app: ``action_*`` for every command key."""

    link: Link
    snapshot: EngineSnapshot | None
    undo_slot: UndoSlot

    def focused_key(self) -> str | None:
        """The highlighted task of the focused task list, if one has focus."""
        focused = self.focused
        return focused.current_key if isinstance(focused, TaskList) else None

    async def send(self, cmd: Command, *, undo: tuple[str, Command] | None = None) -> bool:
        """Send ``cmd``; say what happened; remember its inverse when it applied."""
        result = await self.link.send(cmd)
        self.notify(result.message, severity="information" if result.ok else "warning", timeout=3)
        if result.ok and undo is not None:
            self.undo_slot.push(undo[0], undo[1], time.monotonic())
        return result.ok

    def _send_soon(self, cmd: Command, undo: tuple[str, Command] | None = None) -> None:
        self.run_worker(self.send(cmd, undo=undo), group="commands")

    def _confirmed(self, cmd: Command) -> Callable[[bool | None], None]:
        def answer(yes: bool | None) -> None:
            if yes:
                self._send_soon(cmd)
        return answer

    # -- actions ---------------------------------------------------------------------------------
    async def action_pause_resume(self) -> None:
        snap = self.snapshot
        if snap is not None and snap.feeder.state == "paused":
            await self.send(Resume(), undo=("resume", Pause()))
        else:
            await self.send(Pause(), undo=("pause", Resume()))

    def action_drain(self) -> None:
        self.push_screen(ConfirmScreen("Drain: admit nothing more and stop when what is admitted is done?"),
                         self._confirmed(Drain()))

    def action_cancel_task(self) -> None:
        key = self.focused_key()
        if key is None:
            self.notify("no task highlighted: pick one on the board (x), or X to cancel everything",
                        severity="warning")
            return
        self.push_screen(ConfirmScreen(f"Cancel task {key}?"), self._confirmed(Cancel(keys=(key,))))

    def action_cancel_all(self) -> None:
        name = self.snapshot.pipeline if self.snapshot is not None else "all"
        self.push_screen(ConfirmScreen("Cancel EVERY unfinished task of this pipeline? This cannot be undone.",
                                       type_to_confirm=name), self._confirmed(Cancel(all=True)))

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
        old = snap.lanes[0].depth
        new = max(_MIN_DEPTH, min(_MAX_DEPTH, old + step))
        if new == old:
            self.notify(f"prefetch depth stays {old} (range {_MIN_DEPTH}..{_MAX_DEPTH})", severity="warning")
            return
        await self.send(SetDepth(depth=new), undo=(f"depth {old} → {new}", SetDepth(depth=old)))

    async def set_depth(self, depth: int) -> None:
        """Command mode's ``depth N``."""
        old = self.snapshot.lanes[0].depth if self.snapshot is not None and self.snapshot.lanes else None
        undo = (f"depth {old} → {depth}", SetDepth(depth=old)) if old is not None else None
        if not _MIN_DEPTH <= depth <= _MAX_DEPTH:
            self.notify(f"depth must be {_MIN_DEPTH}..{_MAX_DEPTH}", severity="warning")
            return
        await self.send(SetDepth(depth=depth), undo=undo)

    async def quarantine(self, worker: str, *, release: bool = False) -> bool:
        """Quarantine ``worker``, or release it; either way the other is the undo."""
        if release:
            return await self.send(Release(worker=worker), undo=("release", Quarantine(worker=worker)))
        return await self.send(Quarantine(worker=worker), undo=("quarantine", Release(worker=worker)))

    async def action_undo(self) -> None:
        last = self.undo_slot.take(time.monotonic())
        if last is None:
            self.notify(f"nothing to undo (pause, resume and depth changes can be undone for "
                        f"{self.undo_slot.window_s:.0f} s)", severity="warning")
            return
        if await self.send(last.inverse):
            self.notify(f"undid {last.label}", timeout=3)
