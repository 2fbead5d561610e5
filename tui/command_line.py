"""Command mode (``:``): the verbs, their parsing, and completion of live task and worker ids.

The decision this module protects: a typed command is parsed here into a verb and arguments, or
refused with a sentence saying what would work; the app only dispatches. Completion looks ids up
in the newest snapshot, so it offers what exists now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.suggester import Suggester

from warpdeck.engine.api import EngineSnapshot

__all__ = ["VERBS", "CommandLineError", "IdSuggester", "Parsed", "parse"]

#: verb → (argument kind, what it does). Argument kinds: "" none, "keys" task keys (any number),
#: "keys?" optional task keys, "int" one whole number, "word" one word, "rest" free text.
VERBS: dict[str, tuple[str, str]] = {
    "pause": ("", "stop starting batches"),
    "resume": ("", "start batches again"),
    "drain": ("", "admit nothing more, finish what is admitted"),
    "cancel": ("keys", "cancel the named tasks"),
    "cancel-all": ("", "cancel every unfinished task (asks for the pipeline's name)"),
    "retry": ("keys?", "retry failed tasks (all, or the named ones)"),
    "requeue": ("", "requeue stalled tasks to the front"),
    "depth": ("int", "set the prefetch depth of every lane (2..64)"),
    "undo": ("", "undo the last reversible action"),
    "detail": ("keys", "open a task's detail"),
    "filter": ("rest", "set the task filter (empty clears it)"),
    "screen": ("word", "board, workers or timeline"),
    "theme": ("word", "switch to a theme by name"),
    "worker": ("word", "show the workers screen with this worker highlighted"),
    "quarantine": ("word", "give a worker no new batches until it is released"),
    "release": ("word", "give a quarantined worker batches again"),
    "follow": ("", "toggle following the newest"),
    "help": ("", "every key"),
    "quit": ("", "leave the control room"),
}


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
        raise CommandLineError("type a command: " + ", ".join(VERBS))
    verb, args = words[0].lower(), tuple(words[1:])
    if verb not in VERBS:
        close = [v for v in VERBS if v.startswith(verb[:2])]
        hint = f" (did you mean {', '.join(close)}?)" if close else f"; commands: {', '.join(VERBS)}"
        raise CommandLineError(f"unknown command {verb!r}{hint}")
    kind = VERBS[verb][0]
    if kind == "" and args:
        raise CommandLineError(f"{verb} takes no arguments")
    if kind == "keys" and not args:
        raise CommandLineError(f"{verb} needs at least one task key (tab completes)")
    if kind == "int" and (len(args) != 1 or not args[0].isdigit()):
        raise CommandLineError(f"{verb} takes one whole number")
    if kind == "word" and len(args) != 1:
        raise CommandLineError(f"{verb} takes one word")
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
        if not head:
            return next((v for v in VERBS if v.startswith(last) and v != last), None)
        verb = head.split()[0].removeprefix(":")
        for option in self._options(verb, last):
            if option.startswith(last) and option != last:
                return f"{head} {option}"
        return None

    def _options(self, verb: str, prefix: str) -> list[str]:
        if verb == "screen":
            return ["board", "workers", "timeline"]
        if verb == "theme":
            return self._themes()
        snap = self._snapshot()
        if snap is None:
            return []
        if verb in ("worker", "quarantine", "release"):
            return [w.id for w in snap.workers]
        if VERBS.get(verb, ("",))[0] in ("keys", "keys?"):
            # First match in table order; the key list is append-only, so this is a plain scan.
            return [next((k for k in snap.tasks.keys if k.startswith(prefix)), "")]
        return []
