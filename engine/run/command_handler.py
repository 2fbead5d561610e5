"""The command handler: what each operator command does to a run, and the answer it gives.

The decisions this module protects: one ``match`` over the closed command union, so every command
is handled in one place and a new one cannot be forgotten (mypy checks the match is exhaustive);
every answer says what happened in words (``CommandResult``), including a refusal; commands
change the shared ``RunState`` only, so the handler can be tested without an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from warpdeck.engine.run.run_state import RunState
from warpdeck.engine.state.commands import (
    Cancel,
    Command,
    CommandResult,
    Drain,
    Pause,
    Quarantine,
    Release,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
)
from warpdeck.engine.state.run_events import CommandEvent, StallEvent
from warpdeck.engine.state.task_states import ALL_QUARANTINED, Phase, StallReason, State

__all__ = ["CommandHandler"]


class CommandHandler:
    """Applies commands to a ``RunState``. ``known_workers`` lists the workers a quarantine may
    name beyond the run's own; ``quarantine`` tells the control plane's monitor."""

    def __init__(self, state: RunState, *, known_workers: Callable[[], Iterable[str]] = tuple,
                 quarantine: Callable[[str, bool], None] | None = None) -> None:
        self.s = state
        self._known = known_workers
        self._quarantine = quarantine

    def apply(self, cmd: Command) -> CommandResult:
        """Apply ``cmd``; the answer says what it did (and the run's events hear it)."""
        result = self._apply(cmd)
        s = self.s
        if s.events.heard:
            t = time.perf_counter()
            s.events.emit(CommandEvent(t, cmd.kind, result.ok, result.affected, result.message))
            if isinstance(cmd, Pause | Resume) and result.affected:
                s.events.emit(StallEvent(t, StallReason.CONTROL.label, result.affected, isinstance(cmd, Pause),
                                         note="paused"))
        return result

    def _apply(self, cmd: Command) -> CommandResult:
        s = self.s
        match cmd:
            case Pause():
                if s.feeder.paused:
                    return CommandResult(True, 0, "already paused", changed=False)
                s.feeder.paused = True
                pending = np.array(s.ready.pending(), np.int64)
                s.table.set_stall(pending, StallReason.CONTROL, "paused")
                return CommandResult(True, len(pending), "paused: no new batches start")
            case Resume():
                if not s.feeder.paused:
                    return CommandResult(True, 0, "not paused: nothing to resume", changed=False)
                s.feeder.paused = False
                pending = np.array(s.ready.pending(), np.int64)
                s.table.clear_stall(pending)
                return CommandResult(True, len(pending), "resumed")
            case Drain():
                s.feeder.draining = True
                return CommandResult(True, len(s.ready), "draining: nothing more is admitted")
            case Cancel(all=True):
                s.cancelled_all = True
                return s.task_keys.cancel_all()
            case Cancel():
                return s.task_keys.cancel(cmd.keys)
            case RetryFailed():
                return s.task_keys.retry(cmd.keys)
            case RequeueStalled():
                return self._requeue_stalled()
            case Quarantine() | Release():
                return self._quarantine_or_release(cmd)
            case SetDepth():
                lanes = [lane for lane in s.lanes if cmd.lane is None or lane.id == cmd.lane]
                if not s.auto_depth and lanes and all(lane.depth == cmd.depth for lane in lanes):
                    return CommandResult(True, 0, f"slot depth is already {cmd.depth}", changed=False)
                s.auto_depth = False
                for lane in s.lanes:
                    if cmd.lane is None or lane.id == cmd.lane:
                        lane.set_depth(cmd.depth)
                threads = sorted({(ln.workers(Phase.FILL), ln.workers(Phase.SINK)) for ln in s.lanes})
                held = ", ".join(f"fill {f} sink {k}" for f, k in threads)
                return CommandResult(True, 0, f"slot depth {cmd.depth} (auto depth off; threads {held}, "
                                              f"still tuned within {cmd.depth - 2} slots)")

    def _requeue_stalled(self) -> CommandResult:
        s = self.s
        waiting = set(s.ready.pending())
        stalled = [r for r in s.table.indices(State.QUEUED, stalled=True).tolist() if r in waiting]
        s.ready.remove(stalled)
        for r in stalled:
            s.ready.put_retry(r, s.feeder.handles[r], isolate=False)
        running = len(s.table.indices(State.RUNNING, stalled=True))
        note = f"; {running} stalled in flight stay with their batch" if running else ""
        return CommandResult(True, len(stalled), f"requeued {len(stalled)} stalled task(s) to the front{note}")

    def _quarantine_or_release(self, cmd: Quarantine | Release) -> CommandResult:
        s = self.s
        known = set(s.worker_ids) | set(self._known())
        if cmd.worker not in known:
            return CommandResult(False, 0, f"no worker {cmd.worker!r} (known: {', '.join(sorted(known))})")
        quarantine = isinstance(cmd, Quarantine)
        if quarantine == (cmd.worker in s.quarantined):
            state = "already quarantined" if quarantine else "not quarantined"
            return CommandResult(True, 0, f"worker {cmd.worker} is {state}", changed=False)
        was_all = all(w in s.quarantined for w in s.worker_ids)
        if quarantine:
            s.quarantined.add(cmd.worker)
        else:
            s.quarantined.discard(cmd.worker)
        if self._quarantine is not None:
            self._quarantine(cmd.worker, quarantine)
        # With every local worker quarantined, the waiting tasks are stalled by the operator.
        pending = np.array(s.ready.pending(), np.int64)
        now_all = all(w in s.quarantined for w in s.worker_ids)
        if now_all:
            s.table.set_stall(pending, StallReason.CONTROL, ALL_QUARANTINED)
        elif not s.feeder.paused:
            s.table.clear_stall(pending)
        if now_all != was_all:  # the waiting tasks' stall began or ended (its length: the exporters time it)
            s.events.emit(StallEvent(time.perf_counter(), StallReason.CONTROL.label, len(pending), now_all,
                                     note=ALL_QUARANTINED))
        if quarantine:
            return CommandResult(True, 0, f"worker {cmd.worker} quarantined: no new batches")
        return CommandResult(True, 0, f"worker {cmd.worker} released")
