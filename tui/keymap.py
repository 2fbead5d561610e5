"""Every key binding, once.

The decision this module protects: the footer, the help screen and the command palette are all
generated from ``KEYS``, so a key can never do one thing and be documented as another. Widgets
and screens take their ``BINDINGS`` from ``bindings(scope)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType

__all__ = ["KEYS", "SCOPES", "Key", "bindings", "keys_in"]

#: Where a key works: everywhere, on one screen, or in a focused task list.
SCOPES = ("app", "board", "list", "workers", "timeline")


@dataclass(frozen=True, slots=True)
class Key:
    """One binding: the keys (Textual names, comma-separated), the action it runs in its scope,
    what it does in words, its group on the help screen, and whether the footer shows it."""

    keys: str
    action: str
    description: str
    group: str
    scope: str = "app"
    footer: bool = False
    #: Offered in the command palette (navigation keys are not).
    palette: bool = True
    #: Shown as this on the help screen and footer when ``keys`` reads badly ("question_mark").
    display: str | None = None
    #: The footer's word for it (the footer is one line; the help screen has the whole sentence).
    short: str | None = None
    #: Checked before the focused widget's own keys (tab would otherwise move focus).
    priority: bool = False

    @property
    def label(self) -> str:
        return self.display or self.keys.split(",")[0]


KEYS: tuple[Key, ...] = (
    # -- screens
    Key("1", "screen('board')", "Board: tasks by state and phase", "Screens", short="board", display="1"),
    Key("2", "screen('workers')", "Workers: heartbeats and devices", "Screens", display="2"),
    Key("3", "screen('timeline')", "Timeline: lanes, overlap, idle gaps", "Screens", display="3"),
    Key("tab", "next_screen", "Next screen", "Screens", palette=False, priority=True),
    Key("shift+tab", "previous_screen", "Previous screen", "Screens", palette=False, priority=True),
    Key("question_mark", "help", "Help: every key", "Screens", footer=True, short="help", display="?"),
    # -- the pipeline
    # One key, two bindings: the footer offers the one that applies now (``App.check_action``).
    Key("p", "pause", "Pause: no new batches start", "Pipeline", footer=True, short="pause"),
    Key("p", "resume", "Resume: batches start again", "Pipeline", footer=True, short="resume"),
    Key("d", "drain", "Drain: admit nothing more, finish what is admitted", "Pipeline"),
    Key("x", "cancel_task", "Cancel the highlighted task", "Pipeline", footer=True, short="cancel"),
    Key("X", "cancel_all", "Cancel every unfinished task (type the pipeline's name)", "Pipeline"),
    Key("r", "retry_failed", "Retry failed tasks (the highlighted one on its own)", "Pipeline", footer=True,
        short="retry"),
    Key("R", "requeue_stalled", "Requeue stalled tasks to the front", "Pipeline"),
    Key("plus,equals_sign", "depth(1)", "Prefetch depth up (auto tuning off)", "Pipeline", display="+"),
    Key("minus", "depth(-1)", "Prefetch depth down (auto tuning off)", "Pipeline", display="-"),
    Key("u", "undo", "Undo the last reversible action (again: the one before)", "Pipeline"),
    # -- the view
    Key("slash", "filter", "Filter: regex, !invert, field:value", "View", footer=True, short="filter", display="/"),
    Key("colon", "command_mode", "Command mode (tab completes ids)", "View", footer=True, short="command", display=":"),
    Key("F", "failed", "Failed tasks only (again: clear the filter)", "View"),
    Key("f", "follow", "Follow the newest or freeze the view", "View"),
    Key("t", "next_theme", "Next theme", "View"),
    Key("ctrl+s", "screenshot", "Save a screenshot (SVG)", "View"),
    Key("q", "quit_app", "Quit (asks while work is running)", "View", footer=True, short="quit"),
    Key("ctrl+q,ctrl+c", "quit_app", "Quit, as q does (asks while work is running)", "View", palette=False,
        priority=True),
    # -- the board
    Key("h,left", "column(-1)", "Column to the left", "Board", scope="board", palette=False),
    Key("l,right", "column(1)", "Column to the right", "Board", scope="board", palette=False),
    # -- any task list
    Key("j,down", "cursor_down", "Next task", "Task list", scope="list", palette=False),
    Key("k,up", "cursor_up", "Previous task", "Task list", scope="list", palette=False),
    Key("g,home", "first", "First task", "Task list", scope="list", palette=False),
    Key("G,end", "last", "Last task", "Task list", scope="list", palette=False),
    Key("pagedown", "page_down", "Page down", "Task list", scope="list", palette=False),
    Key("pageup", "page_up", "Page up", "Task list", scope="list", palette=False),
    Key("enter", "open", "Task detail: history, attempts, traceback", "Task list", scope="list", palette=False),
    # -- workers
    Key("s", "sort", "Sort by the next column", "Workers", scope="workers"),
    Key("z", "quarantine", "Quarantine the highlighted worker, or release it (undoable)", "Workers",
        scope="workers"),
    # -- timeline
    Key("right_square_bracket", "zoom(-1)", "Zoom in (shorter window)", "Timeline", scope="timeline",
        display="]"),
    Key("left_square_bracket", "zoom(1)", "Zoom out (longer window)", "Timeline", scope="timeline", display="["),
)


def keys_in(scope: str) -> tuple[Key, ...]:
    """The keys of one scope, in table order."""
    return tuple(k for k in KEYS if k.scope == scope)


def bindings(scope: str) -> list[BindingType]:
    """Textual bindings for one scope. App keys are not priority bindings (tab aside), so a
    focused input gets its letters first."""
    return [Binding(k.keys, k.action, k.short or k.description, show=k.footer, key_display=k.display,
                    tooltip=k.description, priority=k.priority) for k in keys_in(scope)]
