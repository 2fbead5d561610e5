"""Command mode (``:``): parsing the verbs, and completion of verbs, names and live ids.

The decision this module protects: a typed command is parsed here into a verb and arguments, or
refused with a sentence saying what would work; the app only dispatches. The verbs and what each
takes are rows of ``operations.OPERATIONS``; this module says how each kind of argument is
written, checked and completed. Completion looks ids up in the newest snapshot, so it
offers what exists now; the list of candidates is shown, not only the first. What was typed is
repeated in an answer at most ``ECHO_CELLS`` wide (``echo``): a pasted 10,000-character key must
not be written over the screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice

from textual.suggester import Suggester

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.fit import middle
from warpdeck.tui.operations import SCREENS, VERBS, ArgKind

__all__ = ["ECHO_CELLS", "VERBS", "CommandLineError", "IdSuggester", "Parsed", "echo", "parse", "usage"]

_WRITTEN: dict[ArgKind, str] = {"": "", "keys": "KEY…", "keys?": "[KEY…]", "key": "KEY", "int": "N", "text": "[TEXT]",
                                "screen": "|".join(SCREENS), "theme": "NAME", "worker": "ID"}
"""How help and errors write each kind of argument."""
_TASK_KEYS: tuple[ArgKind, ...] = ("keys", "keys?", "key")
_ONE_WORD: tuple[ArgKind, ...] = ("screen", "theme", "worker")

_MAX_CANDIDATES = 12

ECHO_CELLS = 60
"""The most cells of typed text (a key, a filter, a name) that an answer repeats."""


def echo(text: str) -> str:
    """``text`` as an answer repeats it: whole if it fits ``ECHO_CELLS``, else shortened in the
    middle, its tail kept (``fit.middle``)."""
    return middle(text, ECHO_CELLS)


def usage(verb: str) -> str:
    """``verb`` with its arguments, as help and errors write it."""
    return f"{verb} {_WRITTEN[VERBS[verb].args]}".rstrip()


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
        raise CommandLineError(f"unknown command {echo(verb)!r}{hint}")
    kind = VERBS[verb].args
    if kind == "" and args:
        raise CommandLineError(f"{verb} takes no arguments")
    if kind == "keys" and not args:
        raise CommandLineError(f"{usage(verb)}: needs at least one task key (tab completes)")
    if kind == "key" and len(args) != 1:
        raise CommandLineError(f"{usage(verb)}: takes one task key (tab completes)")
    if kind == "int" and (len(args) != 1 or not (args[0].isascii() and args[0].isdecimal())):
        raise CommandLineError(f"{usage(verb)}: takes one whole number")
    if kind in _ONE_WORD and len(args) != 1:
        raise CommandLineError(f"{usage(verb)}: takes one word")
    if kind == "text":
        args = (" ".join(args),)
    return Parsed(verb, args)


class IdSuggester(Suggester):
    """Completes the verb, then task keys (or worker ids after ``worker``) from the newest
    snapshot, and theme and screen names where those are asked for."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot | None], themes: Callable[[], list[str]]) -> None:
        super().__init__(use_cache=False, case_sensitive=True)
        self._snapshot = snapshot
        self._themes = themes

    def completion(self, value: str) -> str | None:
        """What tab makes of ``value``: its last word completed to the first candidate, and a
        space after it when that is the only candidate, so the next word is typed at once
        (``dep`` → ``depth ``); None where nothing completes it (no candidate, or the word is
        already whole and the start of another: ``cancel``, ``cancel-all``)."""
        if not value.strip():
            return None  # (an empty line lists the verbs instead)
        head, _, last = value.rpartition(" ")
        found = self.candidates(value, limit=2)
        if not found:
            return None
        completed = f"{head} {found[0]}" if head else found[0]
        if len(found) == 1:
            return completed + " "
        return completed if found[0] != last else None

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
        kind = VERBS[verb].args if verb in VERBS else ""
        if not task_keys and kind in _TASK_KEYS:
            return []
        return list(islice((o for o in self._options(kind) if o.startswith(last)), limit))

    def _options(self, kind: ArgKind) -> Iterable[str]:
        if kind == "screen":
            return list(SCREENS)
        if kind == "theme":
            return self._themes()
        snap = self._snapshot()
        if snap is None:
            return []
        if kind == "worker":
            return [w.id for w in snap.workers]
        if kind in _TASK_KEYS:
            return filter(None, snap.tasks.keys)  # a lazy scan: islice stops it at the limit
        return []
