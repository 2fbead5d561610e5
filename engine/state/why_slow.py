"""Why a task took as long as it did, in one line: the largest part of its latency, named.

The decisions this module protects:
- A task's latency is cut into parts that do not overlap: earlier attempts (from its admission to its
  last attempt's queueing), the last attempt's wait in the queue, each phase of its batch, and the
  time its batch spent between phases (waiting for a slot's buffer, the sink, a hung neighbour). The
  line names the largest part first, so the reader sees at once where the time went.
- A wait is named after what caused it only when one cause covers at least ``CAUSE_SHARE`` of it: in
  the queue, a stall of its own or of any batch on any lane, or the lanes held or idle while its batch
  formed; between phases, a stall of a batch on its lane (a slot's buffers are freed in order, so a
  neighbour's backpressure holds it). A wait nothing explains is said plainly rather than pinned on a
  stall that merely touched it.
- Pure: it reads the attempts (engine/state/task_story.py) and asks ``cause`` about intervals, so it
  is tested without a run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from warpdeck.engine.state.task_story import AttemptStory, seconds_text

__all__ = ["CAUSE_SHARE", "Cause", "explain"]

CAUSE_SHARE = 0.25
"""The share of a wait one cause must cover to be named as its cause."""
Cause = Callable[[float, float, int | None], str]
"""Asked what held a task from ``start`` to ``end`` (seconds since the run's start); ``lane``: only the stalls of
batches on that lane count (None: any batch's, and the lanes' waits for a batch). Answers a phrase ("behind
backpressure") or "" when nothing covers ``CAUSE_SHARE`` of the interval."""


def explain(attempts: Sequence[AttemptStory], cause: Cause, now_s: float) -> str:
    """The line for a task whose attempts are ``attempts`` (oldest first), as of ``now_s``."""
    here = [a for a in attempts if a.queued_at_s is not None]
    if not here:
        return ""
    last = here[-1]
    parts: list[tuple[float, str, str]] = []  # (seconds, text, the phase's name for a phase)
    if len(here) > 1 and last.queued_at_s is not None and here[0].queued_at_s is not None:
        earlier = here[:-1]
        took = last.queued_at_s - here[0].queued_at_s
        outcomes = ", ".join(sorted({a.outcome for a in earlier}))
        plural = "s" if len(earlier) > 1 else ""
        parts.append((took, f"{len(earlier)} earlier attempt{plural} ({outcomes}) took {seconds_text(took)}", ""))
    if not last.kept:
        return _summary(last, here[0])
    wait = _queue_wait(last, cause, now_s)
    if wait is not None:
        parts.append((*wait, ""))
    phases = [(p.took_s, f"{p.phase} {seconds_text(p.took_s)}", p.phase) for p in last.phases]
    parts += phases
    held, before, gap = _between_phases(last)
    if held > 0:
        why = cause(*gap, last.lane)
        parts.append((held, f"held {seconds_text(held)} between phases (most before its {before})"
                      + (f" {why}" if why else ""), ""))
    if not parts:
        return ""
    seconds, text, phase = max(parts, key=lambda p: p[0])
    if phase:
        total = _total(here[0], last, now_s)
        line = f"{phase} took {seconds_text(seconds)}"
        if total is not None and total > seconds:
            line += f" of {seconds_text(total)}"
        return line + (f"; waited {seconds_text(wait[0])} in queue" if wait is not None else "")
    slowest = max(phases, key=lambda p: p[0]) if phases else None
    return text + (f"; {slowest[1]}" if slowest is not None else "")


def _queue_wait(a: AttemptStory, cause: Cause, now_s: float) -> tuple[float, str] | None:
    """The attempt's wait in the queue (so far, while it is still queued), named after its cause."""
    if a.queued_at_s is None:
        return None
    if a.queue_wait_s is not None:
        wait, so_far = a.queue_wait_s, ""
    elif a.outcome == "queued":
        wait, so_far = max(0.0, now_s - a.queued_at_s), " so far"
    else:
        return None
    why = cause(a.queued_at_s, a.queued_at_s + wait, None) if wait > 0 else ""
    verb = "waiting" if so_far else "waited"
    return wait, f"{verb} {seconds_text(wait)} in queue{so_far}" + (f" {why}" if why else "")


def _between_phases(a: AttemptStory) -> tuple[float, str, tuple[float, float]]:
    """Time the batch spent after one phase ended and before the next began; the phase that waited
    longest to begin (for a slot's buffer, a host thread, the sink's turn) and that wait's interval."""
    held, before, gap = 0.0, "", (0.0, 0.0)
    for prev, nxt in zip(a.phases, a.phases[1:], strict=False):
        end = prev.start_s + prev.took_s
        wait = max(0.0, nxt.start_s - end)
        held += wait
        if wait > gap[1] - gap[0]:
            before, gap = nxt.phase, (end, nxt.start_s)
    return held, before, gap


def _total(first: AttemptStory, last: AttemptStory, now_s: float) -> float | None:
    if first.queued_at_s is None:
        return None
    end = last.ended_at_s if last.ended_at_s is not None else now_s
    return max(0.0, end - first.queued_at_s)


def _summary(last: AttemptStory, first: AttemptStory) -> str:
    """For a task whose batch the log no longer keeps: what the table still says."""
    kept = "its batch's phase times are no longer kept (the batch log keeps the newest batches)"
    if first.queued_at_s is None or last.ended_at_s is None:
        return kept
    return f"{last.outcome} {seconds_text(last.ended_at_s - first.queued_at_s)} after admission; {kept}"
