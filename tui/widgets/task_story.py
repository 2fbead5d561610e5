"""One task's whole story on screen: where it stands, why it took this long, its input and output, every
attempt with its batch, lane, slot, worker and epoch, its queue wait and phase times, its stalls and
its traceback.

The decisions this module protects:
- Everything shown comes from the ``TaskDetail`` the engine answered (engine/run/stories.py); the
  widget computes nothing about the run, it only lays the story out.
- The story reads in an 80 by 24 terminal and uses a wide one. The first lines say what a reader opens the
  detail for (state, the why line, input and output); below ``WIDE`` cells the attempts are two tables
  (where each ran; how long each part took) instead of one, so no column is ever cut.
- Durations are written by the engine's ``seconds_text``, so the table and the why line read alike;
  every cell the engine could not know is ``—``, never a made-up zero.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from warpdeck.engine.api import AttemptStory, PhaseName, TaskDetail, seconds_text
from warpdeck.tui.glyphs import STALL_BADGES, STATE_GLYPHS

__all__ = ["WIDE", "TaskStory", "render_story"]

WIDE = 100
"""From this many cells on, the attempts are one table (else two narrower ones)."""
_PHASES: tuple[PhaseName, ...] = ("fill", "h2d", "compute", "d2h", "sink")
_NONE = "—"


class TaskStory(Widget):
    """A task's detail, laid out for the width it has."""

    DEFAULT_CSS = """
    TaskStory { height: auto; }
    TaskStory > .task-story--label { color: $text-muted; }
    TaskStory > .task-story--why { text-style: bold; }
    TaskStory > .task-story--failed { color: $wd-failed; }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {"task-story--label", "task-story--why", "task-story--failed"}

    detail: reactive[TaskDetail | None] = reactive(None, layout=True)
    """The task's detail as the engine last answered it (None: not answered yet)."""

    def __init__(self, key: str, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self.key = key
        self.missing = False
        """True once the engine answered that it knows no such task."""

    def render(self) -> RenderableType:
        if self.detail is None:
            return Text(f"no task {self.key!r}" if self.missing else f"loading {self.key}…")
        styles = {name: self.get_component_rich_style(f"task-story--{name}", partial=True)
                  for name in ("label", "why", "failed")}
        return render_story(self.detail, self.size.width or WIDE, styles)

    def show(self, detail: TaskDetail | None) -> None:
        """Show ``detail`` (None: the engine knows no task by this key)."""
        self.missing = detail is None
        self.detail = detail
        self.refresh(layout=True)


def render_story(d: TaskDetail, width: int = WIDE, styles: dict[str, Style] | None = None) -> Group:
    """Everything known about one task, as rich renderables for ``width`` cells."""
    st = styles or {}
    label, why, failed = st.get("label", Style()), st.get("why", Style(bold=True)), st.get("failed", Style())
    parts: list[RenderableType] = [_head(d, failed)]
    facts = Text()
    if d.why:
        facts.append("why   ", label).append(f"{d.why}\n", why)
    if when := _when(d):
        facts.append("when  ", label).append(f"{when}\n")
    if d.input_from:
        facts.append("in    ", label).append(f"{d.input_from}\n")
    if d.output_to:
        facts.append("out   ", label).append(f"{d.output_to}\n")
    if facts:
        parts.append(facts)
    shown = list(d.attempts)
    if shown:
        tables = _attempts(shown, width)
        notes = _attempt_notes(d, shown)  # why attempts ended: right under the table of where they ran
        parts += [tables[0], *([notes] if notes else []), *tables[1:]]
    elif d.history:  # a detail without a story (from telemetry or the journal): the attempts it has
        parts.append(_history(d))
    if d.stalls:
        parts.append(_stalls(d))
    if d.traceback:
        failed_last = d.state in ("failed", "unknown")
        of = "" if failed_last else next((f" of attempt {a.attempt}" for a in reversed(d.history) if a.traceback), "")
        parts.append(Text(f"\ntraceback{of} (most recent call last is at the bottom):", style="bold"))
        parts.append(Text(d.traceback.rstrip()))
    return Group(*parts)


def _when(d: TaskDetail) -> str:
    """When it was admitted and, once it ended, how long it took."""
    if d.admitted_at_s is None:
        return ""
    line = f"admitted at {d.admitted_at_s:.3f} s"
    ended = d.attempts[-1].ended_at_s if d.attempts else None
    if ended is not None:
        line += f"; {d.state} at {ended:.3f} s ({seconds_text(max(0.0, ended - d.admitted_at_s))} later)"
    return line


def _head(d: TaskDetail, failed: Style) -> Text:
    badge = STATE_GLYPHS.get(d.state) if d.state != "unknown" else None
    head = Text()
    head.append(f"{badge.glyph if badge else '?'} {d.key}\n", "bold")
    head.append(f"state {d.state}", failed if d.state == "failed" else "")
    if d.state == "running":
        head.append(f" · phase {d.phase}")
    if d.admitted:
        head.append(f" · attempt {d.attempt} · batch {d.batch if d.batch >= 0 else _NONE}")
    head.append("\n")
    if d.note:
        head.append(f"{d.note}\n", "italic")
    if d.stall != "none":
        stall = STALL_BADGES.get(d.stall)
        head.append(f"stalled: {stall.glyph if stall else ''} {d.stall}", "bold")
        head.append(f" — {d.stall_note}\n" if d.stall_note else "\n")
    if d.error and d.state in ("failed", "cancelled", "unknown"):  # else an earlier attempt's: with the attempts
        head.append(f"error: {d.error}\n", "bold")
    if d.flag:
        head.append(f"flagged: {d.flag}\n", "bold")
    return head


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", box=None, padding=(0, 2, 0, 0), show_edge=False)


def _attempts(attempts: list[AttemptStory], width: int) -> list[RenderableType]:
    """One table where the width allows, else where each attempt ran and what each part took apart;
    then when each attempt entered each phase."""
    where = ("#", "outcome", "batch", "lane/slot", "worker@epoch")
    took = ("queued", *_PHASES)
    wide = width >= WIDE
    first = _table("attempts" if wide else "attempts: where each ran")
    for col in where + (took if wide else ()):
        first.add_column(col, justify="right" if col in (*took, "batch") else "left", no_wrap=col != "worker@epoch")
    for a in attempts:
        first.add_row(*_where_cells(a), *(_took_cells(a) if wide else ()))
    tables: list[RenderableType] = [first]
    if not wide:
        second = _table("how long each part took")
        for col in ("#", *took):
            second.add_column(col, justify="left" if col == "#" else "right", no_wrap=True)
        for a in attempts:
            second.add_row(str(a.attempt), *_took_cells(a))
        tables.append(second)
    timed = [a for a in attempts if a.queued_at_s is not None]
    if timed:
        entered = _table("when each part began (seconds since the run's start)")
        for col in ("#", *took, "ended"):
            entered.add_column(col, justify="left" if col == "#" else "right", no_wrap=True)
        for a in timed:
            starts = {p.phase: f"{p.start_s:.3f}" for p in a.phases}
            entered.add_row(str(a.attempt), f"{a.queued_at_s:.3f}", *(starts.get(p, _NONE) for p in _PHASES),
                            _NONE if a.ended_at_s is None else f"{a.ended_at_s:.3f}")
        tables.append(entered)
    return tables


def _where_cells(a: AttemptStory) -> tuple[str, ...]:
    if a.batch < 0:
        batch = _NONE if a.queued_at_s is not None else "earlier run"
    else:
        batch = str(a.batch)
    lane = _NONE if a.lane < 0 else f"{a.lane}/{a.slot if a.slot >= 0 else _NONE}"
    worker = f"{a.worker}@{a.epoch}" if a.worker else _NONE
    return str(a.attempt), a.outcome, batch, lane, worker


def _took_cells(a: AttemptStory) -> tuple[str, ...]:
    took = {p.phase: seconds_text(p.took_s, compact=True) for p in a.phases}
    if a.outcome == "failed" and a.phases and a.reason.startswith(f"{a.phases[-1].phase}:"):
        took[a.phases[-1].phase] = "✗" + took[a.phases[-1].phase]  # the phase that failed
    queued = _NONE if a.queue_wait_s is None else seconds_text(a.queue_wait_s, compact=True)
    return queued, *(took.get(p, _NONE) for p in _PHASES)


def _attempt_notes(d: TaskDetail, attempts: list[AttemptStory]) -> Text:
    """Why each attempt ended that did not end done (attempts ending alike on one line; the last one's
    reason is the error above), and which batches' times the log no longer keeps."""
    ended: dict[tuple[str, str], list[int]] = {}
    for a in attempts:
        if a.reason and a.outcome != "done" and not (a is attempts[-1] and a.reason == d.error):
            ended.setdefault((a.outcome, a.reason), []).append(a.attempt)
    lines = Text()
    for (outcome, reason), numbers in ended.items():
        which = f"attempt {numbers[0]}" if len(numbers) == 1 else f"attempts {', '.join(map(str, numbers))}"
        lines.append(f"{which} {outcome}: {reason}\n")
    for a in attempts:
        if not a.kept and a.batch >= 0:
            lines.append(f"attempt {a.attempt}: batch {a.batch}'s times are no longer kept (the newest batches are)\n",
                         "italic")
    lines.rstrip()
    return lines


def _history(d: TaskDetail) -> Table:
    history = _table("attempts")
    for col in ("#", "ended as", "reason"):
        history.add_column(col)
    for h in d.history:
        history.add_row(str(h.attempt), h.outcome, h.reason)
    return history


def _stalls(d: TaskDetail) -> Table:
    stalls = _table("stalls")
    for col in ("#", "reason", "began", "lasted", "note"):
        stalls.add_column(col, justify="right" if col in ("began", "lasted") else "left",
                          no_wrap=col != "note")
    for s in d.stalls:
        badge = STALL_BADGES.get(s.reason)
        reason = f"{badge.glyph if badge else ''} {s.reason}" + (" (queued)" if s.queued else "")
        stalls.add_row(str(s.attempt), reason, f"{s.at_s:.3f} s", seconds_text(s.lasted_s), s.note)
    return stalls
