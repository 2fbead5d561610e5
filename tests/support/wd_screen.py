"""Reading a running control room's screen as text, and telling a whole or fairly shortened id or
count from a cut one: what the "nothing cut" tests assert with."""

from __future__ import annotations

import io
import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from textual.app import App

from warpdeck.tui.fit import ELLIPSIS, count_forms

PART_SEPARATORS = re.compile(r"\s{2,}|\s*│\s*|\s·\s")
"""What separates the parts of a status, figures or timeline header line."""
_NUMBER = re.compile(r"^[✗⊘]?([\d,]+(?:\.\d+)?[kMGTP]?)(?:/([\d,]+(?:\.\d+)?[kMGTP]?))?$")


def screen_text(app: App[Any]) -> list[str]:
    """The current screen (with the screens under a dialog) as plain lines, as a screenshot shows it."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False).splitlines()


def parts(line: str) -> list[str]:
    """A status, figures or header line cut into its parts (two spaces, ``│`` or `` · `` apart)."""
    return [p for p in PART_SEPARATORS.split(line.strip()) if p]


def shows_count(text: str, n: int) -> bool:
    """``text`` is ``n`` written exactly or abbreviated (``148,990``, ``148.9k``), never cut."""
    return text in count_forms(n)


def same_part(shown: str, whole: str) -> bool:
    """``shown`` says what ``whole`` says, word for word, a count perhaps abbreviated."""
    a, b = shown.split(" "), whole.split(" ")
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        mx, my = _NUMBER.match(x), _NUMBER.match(y)
        if not (mx and my and mx.group(1) in count_forms(int(my.group(1).replace(",", "")))):
            return False
        if my.group(2) is not None and (mx.group(2) is None
                                        or mx.group(2) not in count_forms(int(my.group(2).replace(",", "")))):
            return False
    return True


def matches(token: str, key: str) -> bool:
    """``token`` is ``key``, or ``key`` shortened in the middle (its head, ``…``, its tail)."""
    if token == key:
        return True
    head, ellipsis, tail = token.partition(ELLIPSIS)
    return bool(ellipsis) and bool(tail) and key.startswith(head) and key.endswith(tail) and len(token) < len(key)


def unmatched_ids(tokens: Iterable[str], keys: Iterable[str]) -> list[tuple[str, int]]:
    """The tokens that do not stand for exactly one of ``keys``, with how many they match."""
    keys = list(keys)
    out = []
    for token in tokens:
        n = sum(1 for k in keys if matches(token, k))
        if n != 1:
            out.append((token, n))
    return out
