"""Command mode (``:``): the verbs, their parsing, and completion of verbs, names and live ids.

The decision this module protects: a typed command is parsed here into a verb and arguments, or
refused with a sentence saying what would work; the app only dispatches, and a verb without
arguments runs the same action as its key. Completion looks ids up in the newest snapshot, so it
offers what exists now; the list of candidates is shown, not only the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice

from textual.suggester import Suggester

from warpdeck.engine.api import EngineSnapshot

__all__ = ["SCREENS", "VERBS", "CommandLineError", "IdSuggester", "Parsed", "Verb", "parse", "usage"]

SCREENS = ("board", "workers", "timeline")


@dataclass(frozen=True, slots=True)
class Verb:
    """One ``:`` verb. ``args``: "" none, "keys" task keys (one or more), "keys?" optional task keys,
    "key" one task key, "int" one whole number, "word" one word, "rest" free text (may be empty).
    ``action``: the app action a verb without arguments runs (the same as its key's)."""

    args: str
    usage: str
    what: str
    action: str | None = None


VERBS: dict[str, Verb] = {
    "pause": Verb("", "", "stop starting batches", "pause"),
    "resume": Verb("", "", "start batches again", "resume"),
    "drain": Verb("", "", "admit nothing more, finish what is admitted (asks)", "drain"),
    "cancel": Verb("keys", "KEY…", "cancel the named tasks (asks; a task not admitted yet is cancelled when it is)"),
    "cancel-all": Verb("", "", "cancel every unfinished task (asks for the pipeline's name)", "cancel_all"),
    "retry": Verb("keys?", "[KEY…]", "retry failed tasks: all, or the named ones"),
    "requeue": Verb("", "", "requeue stalled tasks to the front", "requeue_stalled"),
    "depth": Verb("int", "N", "set the prefetch depth of every lane (2..64; auto tuning off)"),
    "undo": Verb("", "", "undo the last reversible action (again: the one before)", "undo"),
    "detail": Verb("key", "KEY", "open a task's detail"),
    "filter": Verb("rest", "[TEXT]", "set the task filter (empty clears it)"),
    "failed": Verb("", "", "show failed tasks only (again: clear the filter)", "failed"),
    "screen": Verb("word", "board|workers|timeline", "switch screen"),
    "theme": Verb("word", "NAME", "switch to a theme by name"),
    "worker": Verb("word", "ID", "show the workers screen with this worker highlighted"),
    "quarantine": Verb("word", "ID", "give a worker no new batches until it is released (asks for the last one)"),
    "release": Verb("word", "ID", "give a quarantined worker batches again"),
    "follow": Verb("", "", "toggle following the newest", "follow"),
    "help": Verb("", "", "every key and verb", "help"),
    "quit": Verb("", "", "leave the control room (asks while work is running)", "quit_app"),
}

_MAX_CANDIDATES = 12


def usage(verb: str) -> str:
    """``verb`` with its arguments, as help and errors write it."""
    v = VERBS[verb]
    return f"{verb} {v.usage}".rstrip()


class CommandLineError(ValueError):
    """A command line that does not parse; the message says what would."""


@dataclass(frozen=True, slots=True)
class Parsed:
    """A verb and its arguments."""

    verb: str
    args: tuple[str, ...]


def parse(text: str) -> Parsed:
    """Parse one command line, or raise ``CommandLineError``."""
    words = text.strip().removeprefix(":").split()
    if not words:
        raise CommandLineError("type a command (tab lists them): " + ", ".join(VERBS))
    verb, args = words[0].lower(), tuple(words[1:])
    if verb not in VERBS:
        close = [v for v in VERBS if v.startswith(verb[:2])]
        hint = f" (did you mean {', '.join(close)}?)" if close else f"; commands: {', '.join(VERBS)}"
        raise CommandLineError(f"unknown command {verb!r}{hint}")
    kind = VERBS[verb].args
    if kind == "" and args:
        raise CommandLineError(f"{verb} takes no arguments")
    if kind == "keys" and not args:
        raise CommandLineError(f"{usage(verb)}: needs at least one task key (tab completes)")
    if kind == "key" and len(args) != 1:
        raise CommandLineError(f"{usage(verb)}: takes one task key (tab completes)")
    if kind == "int" and (len(args) != 1 or not (args[0].isascii() and args[0].isdecimal())):
        raise CommandLineError(f"{usage(verb)}: takes one whole number")
    if kind == "word" and len(args) != 1:
        raise CommandLineError(f"{usage(verb)}: takes one word")
    if kind == "rest":
        args = (" ".join(args),)
    return Parsed(verb, args)


class IdSuggester(Suggester):
    """Completes the verb, then task keys (or worker ids after ``worker``) from the newest
    snapshot, and theme and screen names where those are asked for."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot | None], themes: Callable[[], list[str]]) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self._snapshot = snapshot
        self._themes = themes

    async def get_suggestion(self, value: str) -> str | None:
        head, _, last = value.rpartition(" ")
        found = self.candidates(value, limit=1) if value else []
        if not found or found[0] == last:
            return None
        return f"{head} {found[0]}" if head else found[0]

    def candidates(self, value: str, limit: int = _MAX_CANDIDATES, *, task_keys: bool = True) -> list[str]:
        """What the last word of ``value`` may complete to: verbs (with their arguments' usage when
        nothing is typed yet), then arguments. ``task_keys`` False: not task keys, whose scan
        costs a pass over the table when nothing matches (tab asks for them)."""
        head, _, last = value.rpartition(" ")
        if not head.strip():
            verbs = [v for v in VERBS if v.startswith(last.lower())]
            return [usage(v) for v in verbs] if not last else verbs[:limit]
        verb = head.split()[0].removeprefix(":").lower()
        if not task_keys and verb in VERBS and VERBS[verb].args in ("keys", "keys?", "key"):
            return []
        return list(islice((o for o in self._options(verb) if o.startswith(last)), limit))

    def _options(self, verb: str) -> Iterable[str]:
        if verb == "screen":
            return list(SCREENS)
        if verb == "theme":
            return self._themes()
        snap = self._snapshot()
        if snap is None:
            return []
        if verb in ("worker", "quarantine", "release"):
            return [w.id for w in snap.workers]
        if verb in VERBS and VERBS[verb].args in ("keys", "keys?", "key"):
            return filter(None, snap.tasks.keys)  # a lazy scan: islice stops it at the limit
        return []
