"""Every operation of the control room, once: its keys, its ``:`` verb, whether it asks first.

The decision this module protects: an operation is written in one row of ``OPERATIONS``, and
everything that names operations is derived from it: the bindings of every scope, the footer and
the command palette (``keymap.py``), the verbs and their parsing and completion
(``command_line.py``), help (``screens/help.py``), which actions stay shut while a prompt is open
and when the footer offers pause or resume (``WarpdeckApp.check_action``), and what undo names.
A key runs its operation's action (``action_<name>`` on the app, or on the screen or widget of its
scope); a verb without arguments runs that same action, one with arguments calls its ``run``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from warpdeck.engine.api import DEPTH_MAX, DEPTH_MIN, RetryFailed

if TYPE_CHECKING:
    from warpdeck.tui.command_mode import CommandMode

__all__ = ["COMMAND_KEYS", "GROUPS", "KEYS", "OPERATIONS", "SCOPES", "SCREENS", "VERBS", "ArgKind", "Key",
           "Operation", "Verb", "asks_first", "operation", "undoable_verbs", "while_reading"]

SCOPES = ("app", "board", "list", "workers", "timeline")
"""Where a key works: everywhere, on one screen, or in a focused task list."""
GROUPS = ("Screens", "Pipeline", "View", "Board", "Task list", "Workers", "Timeline")
"""The help screen's groups of keys, in the order it shows them."""
SCREENS = ("board", "workers", "timeline")
"""The screens, in the order tab steps through them."""

ArgKind = Literal["", "keys", "keys?", "key", "int", "text", "screen", "theme", "worker"]
"""What a verb takes: "" nothing, "keys" task keys (one or more), "keys?" optional task keys, "key" one task key, "int"
one whole number, "text" free text (may be empty), "screen", "theme" or "worker" one such name (``command_line.py``
parses, completes and writes each)."""

VerbRun = Callable[["CommandMode", tuple[str, ...]], Awaitable[object] | None]
"""What a verb with arguments does, given the app and the parsed arguments."""


@dataclass(frozen=True, slots=True)
class Key:
    """One binding of an operation: the keys (Textual names, comma-separated), what it does in
    words (help, tooltip), the arguments of its action, and how the footer and palette show it.
    ``action``, ``group`` and ``scope`` are its operation's; ``KEYS`` fills them in."""

    keys: str
    description: str
    params: str = ""
    """The action's arguments, as Textual writes them: ``'board'`` runs ``screen('board')``."""
    footer: bool = False
    palette: bool = True
    """Offered in the command palette (navigation keys are not)."""
    display: str | None = None
    """Shown as this on the help screen and footer when ``keys`` reads badly ("question_mark")."""
    short: str | None = None
    """The footer's word for it (the footer is one line; the help screen has the whole sentence)."""
    priority: bool = False
    """Checked before the focused widget's own keys (tab would otherwise move focus)."""
    action: str = ""
    group: str = ""
    scope: str = "app"

    @property
    def label(self) -> str:
        return self.display or self.keys.split(",")[0]


@dataclass(frozen=True, slots=True)
class Verb:
    """One ``:`` verb: its name, what it takes, what it does in words, and ``run`` where it takes
    arguments (without, it runs its operation's action, filled in as ``action`` by ``VERBS``)."""

    name: str
    args: ArgKind
    what: str
    run: VerbRun | None = None
    action: str = ""


@dataclass(frozen=True, slots=True)
class Operation:
    """One thing the operator can do, reached by keys, a verb, or both."""

    name: str
    """The action its keys run (``action_<name>`` in its scope); a verb without arguments runs it too."""
    group: str = ""
    """The help screen's group of its keys (one of ``GROUPS``; none for a verb alone)."""
    keys: tuple[Key, ...] = ()
    verb: Verb | None = None
    scope: str = "app"
    asks: bool = False
    """Destroys work or stops the run, so it asks first; it never opens while a prompt is open."""
    undoable: bool = False
    """Sends a command whose inverse ``u`` sends back (``actions.py`` pushes it)."""
    when: Callable[[CommandMode], bool] | None = None
    """Offered (and run) only while this holds: ``p`` is pause or resume, as the run is now."""
    otherwise: str = ""
    """What a verb answers when ``when`` does not hold (``already paused``): it never goes unanswered."""
    commands: bool = False
    """Sends the engine a command: offered only while the room may command a running engine (not read-only, not after
    the run), and refused with the reason otherwise (``command_refusal``)."""
    while_reading: bool = False
    """Its keys work over the help and a task's detail too, which hide the app's keys."""


# In the order the verbs are listed, completed and offered; help shows the keys by ``GROUPS``.
OPERATIONS: tuple[Operation, ...] = (
    Operation("pause", "Pipeline", (Key("p", "Pause: no new batches start", footer=True, short="pause"),),
              Verb("pause", "", "stop starting batches"), undoable=True, when=lambda app: not app.paused,
              otherwise="already paused", commands=True),
    # One key, two operations: the footer offers the one that applies now.
    Operation("resume", "Pipeline", (Key("p", "Resume: batches start again", footer=True, short="resume"),),
              Verb("resume", "", "start batches again"), undoable=True, when=lambda app: app.paused,
              otherwise="not paused: nothing to resume", commands=True),
    Operation("drain", "Pipeline", (Key("d", "Drain: admit nothing more, finish what is admitted"),),
              Verb("drain", "", "admit nothing more, finish what is admitted (asks)"), asks=True, commands=True),
    Operation("cancel_task", "Pipeline",
              (Key("x", "Cancel the highlighted task", footer=True, short="cancel"),),
              Verb("cancel", "keys", "cancel the named tasks (asks; a task not admitted yet is cancelled when it is)",
                   lambda app, keys: app.cancel_tasks(keys)), asks=True, commands=True),
    Operation("cancel_all", "Pipeline", (Key("X", "Cancel every unfinished task (type the pipeline's name)"),),
              Verb("cancel-all", "", "cancel every unfinished task (asks for the pipeline's name)"), asks=True,
              commands=True),
    Operation("retry_failed", "Pipeline",
              (Key("r", "Retry failed tasks (the highlighted one on its own)", footer=True, short="retry"),),
              Verb("retry", "keys?", "retry failed tasks: all, or the named ones",
                   lambda app, keys: app.send(RetryFailed(keys=keys))), commands=True),
    Operation("requeue_stalled", "Pipeline", (Key("R", "Requeue stalled tasks to the front"),),
              Verb("requeue", "", "requeue stalled tasks to the front"), commands=True),
    Operation("depth", "Pipeline",
              (Key("plus,equals_sign", "Slot depth up (auto tuning off)", "1", display="+"),
               Key("minus", "Slot depth down (auto tuning off)", "-1", display="-")),
              Verb("depth", "int", f"set the slot depth of every lane ({DEPTH_MIN}..{DEPTH_MAX}; auto tuning off)",
                   lambda app, n: app.set_depth(int(n[0]))), undoable=True, commands=True),
    Operation("gate", "Pipeline", (Key("a", "At a gate (a run of steps): what came out, approve or reject",
                                       footer=True, short="gate"),),
              when=lambda app: app.gate is not None, otherwise="no gate is waiting"),
    Operation("approve", verb=Verb("approve", "text", "approve the gate the run waits at, with a note (asks)",
                                   lambda app, note: app.decide_gate("approved", note[0]))),
    Operation("reject", verb=Verb("reject", "text", "reject the gate the run waits at, with a note saying why (asks)",
                                  lambda app, note: app.decide_gate("rejected", note[0]))),
    Operation("undo", "Pipeline", (Key("u", "Undo the last reversible action (again: the one before)"),),
              Verb("undo", "", "undo the last reversible action (again: the one before)"), commands=True),
    Operation("cursor_down", "Task list", (Key("j,down", "Next task", palette=False),), scope="list"),
    Operation("cursor_up", "Task list", (Key("k,up", "Previous task", palette=False),), scope="list"),
    Operation("first", "Task list", (Key("g,home", "First task", palette=False),), scope="list"),
    Operation("last", "Task list", (Key("G,end", "Last task", palette=False),), scope="list"),
    Operation("page_down", "Task list", (Key("pagedown", "Page down", palette=False),), scope="list"),
    Operation("page_up", "Task list", (Key("pageup", "Page up", palette=False),), scope="list"),
    Operation("open", "Task list", (Key("enter", "Task detail: history, attempts, traceback", palette=False),),
              Verb("detail", "key", "open a task's detail", lambda app, key: app.open_detail(key[0])), scope="list"),
    Operation("filter", "View",
              (Key("slash", "Filter: regex, !invert, field:value", footer=True, short="filter", display="/"),),
              Verb("filter", "text", "set the task filter (empty clears it)",
                   lambda app, text: app.apply_filter(text[0])), while_reading=True),
    Operation("command_mode", "View", (Key("colon", "Command mode (tab completes ids)", footer=True,
                                           short="command", display=":"),), while_reading=True),
    Operation("failed", "View", (Key("F", "Failed tasks only (again: clear the filter)"),),
              Verb("failed", "", "show failed tasks only (again: clear the filter)")),
    Operation("screen", "Screens",
              (Key("1", "Board: tasks by state and phase", "'board'", short="board", display="1"),
               Key("2", "Workers: heartbeats and devices", "'workers'", display="2"),
               Key("3", "Timeline: lanes, overlap, idle gaps", "'timeline'", display="3")),
              Verb("screen", "screen", "switch screen", lambda app, name: app.show_screen(name[0]))),
    Operation("next_screen", "Screens", (Key("tab", "Next screen", palette=False, priority=True),)),
    Operation("previous_screen", "Screens", (Key("shift+tab", "Previous screen", palette=False, priority=True),)),
    Operation("theme", verb=Verb("theme", "theme", "switch to a theme by name",
                                 lambda app, name: app.use_theme(name[0]))),
    Operation("worker", verb=Verb("worker", "worker", "show the workers screen with this worker highlighted",
                                  lambda app, wid: app.show_worker(wid[0]))),
    Operation("sort", "Workers", (Key("s", "Sort by the next column"),), scope="workers"),
    Operation("quarantine", "Workers",
              (Key("z", "Quarantine the highlighted worker, or release it (undoable)"),),
              Verb("quarantine", "worker", "give a worker no new batches until it is released (asks for the last one)",
                   lambda app, wid: app.quarantine(wid[0])), scope="workers", undoable=True, commands=True),
    Operation("release", verb=Verb("release", "worker", "give a quarantined worker batches again",
                                   lambda app, wid: app.quarantine(wid[0], release=True)), undoable=True,
              commands=True),
    Operation("follow", "View", (Key("f", "Follow the newest or freeze the view"),),
              Verb("follow", "", "toggle following the newest")),
    Operation("next_theme", "View", (Key("t", "Next theme"),)),
    Operation("screenshot", "View", (Key("ctrl+s", "Save a screenshot (SVG)"),)),
    Operation("help", "Screens", (Key("question_mark", "Help: every key", footer=True, short="help", display="?"),),
              Verb("help", "", "every key and verb")),
    Operation("column", "Board", (Key("h,left", "Column to the left", "-1", palette=False),
                                  Key("l,right", "Column to the right", "1", palette=False)), scope="board"),
    Operation("zoom", "Timeline", (Key("right_square_bracket", "Zoom in (shorter window)", "-1", display="]"),
                                   Key("left_square_bracket", "Zoom out (longer window)", "1", display="[")),
              scope="timeline"),
    Operation("quit_app", "View",
              (Key("q", "Quit (asks while work is running)", footer=True, short="quit"),
               Key("ctrl+q,ctrl+c", "Quit, as q does (asks while work is running)", palette=False, priority=True)),
              Verb("quit", "", "leave the control room (asks while work is running)"), asks=True),
)

KEYS: tuple[Key, ...] = tuple(sorted(
    (replace(k, action=f"{op.name}({k.params})" if k.params else op.name, group=op.group, scope=op.scope)
     for op in OPERATIONS for k in op.keys),
    key=lambda k: GROUPS.index(k.group)))
"""Every key of every operation, its operation's action, group and scope filled in, by ``GROUPS``."""

VERBS: dict[str, Verb] = {op.verb.name: replace(op.verb, action=op.name) for op in OPERATIONS if op.verb is not None}
"""Every verb by name, in table order, each with its operation's action filled in."""

_BY_NAME = {op.name: op for op in OPERATIONS}

COMMAND_KEYS: frozenset[tuple[str, str]] = frozenset(
    (k.scope, name) for k in KEYS if _BY_NAME[k.action.partition("(")[0]].commands for name in k.keys.split(","))
"""(scope, Textual key name) of every key whose operation commands the engine (``Operation.commands``)."""


def operation(action: str) -> Operation | None:
    """The operation whose action this is (its name, without arguments), if any."""
    return _BY_NAME.get(action)


def while_reading() -> tuple[Key, ...]:
    """The keys that work over the help and a task's detail too (``Operation.while_reading``)."""
    return tuple(k for k in KEYS if _BY_NAME[k.action.partition("(")[0]].while_reading)


def asks_first() -> frozenset[str]:
    """The actions that ask before they destroy work or stop the run."""
    return frozenset(op.name for op in OPERATIONS if op.asks)


def undoable_verbs() -> str:
    """What undo can undo, in words: ``pause, resume, depth, quarantine and release``."""
    names = [op.verb.name if op.verb is not None else op.name for op in OPERATIONS if op.undoable]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
