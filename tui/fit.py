"""Making ids, counts and lines of figures fit a width without cutting anything silently.

The decision this module protects: the screen never shows a look-alike. An id that does not fit
is shortened in the middle with ``…`` and keeps its tail, which is what tells two ids of one run
apart (``syn-…46720``), never cut at the end into another id's prefix; a count that does not fit
is abbreviated (``148.9k``), never cut into a smaller number; a line of figures that does not fit
drops whole parts, least important first, never a figure in the middle. Abbreviations round
down, so a count of done tasks never reads as more than were done.

Everything here is pure and measured in terminal cells (``rich.cells``), so wide characters in a
user's ids are counted as the terminal draws them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from rich.cells import cell_len, get_character_cell_size

__all__ = ["ELLIPSIS", "Part", "count", "count_forms", "first_fit", "fit_parts", "middle"]

ELLIPSIS = "…"
HEAD = 4
"""Cells of an id's head kept before the ``…`` (``syn-``): enough to tell a run's kind of id."""
_UNITS = ("k", "M", "G", "T", "P")

P = TypeVar("P")


def middle(text: str, width: int, head: int = HEAD) -> str:
    """``text`` in at most ``width`` cells: whole if it fits, else a short head, ``…`` and as
    much of the tail as fits. The tail gets at least half the room, and below nine cells all of
    it (``…046720``): it is what tells ids apart. Width 1 is ``…`` alone; 0 or less is empty."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    room = width - 1  # the ellipsis is one cell
    if not room:
        return ELLIPSIS
    start = _head(text, min(head, room // 2) if room >= 8 else 0)
    return start + ELLIPSIS + _tail(text, room - cell_len(start))


def _head(text: str, cells: int) -> str:
    if text.isascii():
        return text[:cells]
    out, used = [], 0
    for ch in text:
        size = get_character_cell_size(ch)
        if used + size > cells:
            break
        out.append(ch)
        used += size
    return "".join(out)


def _tail(text: str, cells: int) -> str:
    if text.isascii():
        return text[len(text) - cells:] if cells > 0 else ""
    out, used = [], 0
    for ch in reversed(text):
        size = get_character_cell_size(ch)
        if used + size > cells:
            break
        out.append(ch)
        used += size
    return "".join(reversed(out))


def count_forms(n: int) -> tuple[str, ...]:
    """Every way to write ``n``, most exact first: ``148,990``, ``148.99k``, ``148.9k``, ``148k``.
    Abbreviations round down (truncate), so none overstates the count."""
    exact = f"{n:,}"
    sign, m = ("-", -n) if n < 0 else ("", n)
    if m < 1000:
        return (exact,)
    unit = 0
    while unit + 1 < len(_UNITS) and m >= 1000 ** (unit + 2):
        unit += 1
    scale = 1000 ** (unit + 1)
    forms = [exact]
    for decimals in (2, 1, 0):
        q = m * 10 ** decimals // scale
        whole, frac = divmod(q, 10 ** decimals)
        text = f"{sign}{whole:,}" + (f".{frac:0{decimals}d}" if decimals else "") + _UNITS[unit]
        if text not in forms:
            forms.append(text)
    return tuple(forms)


def count(n: int, width: int) -> str:
    """``n`` exactly (with thousands separators) if it fits ``width`` cells, else the most exact
    abbreviation that fits, else the shortest one: a count is never cut."""
    return first_fit(count_forms(n), width)


def first_fit(candidates: Iterable[str], width: int) -> str:
    """The first candidate at most ``width`` cells wide, else the last (the shortest, by the
    callers' convention): the caller lists them from most to least informative."""
    last = ""
    for last in candidates:
        if cell_len(last) <= width:
            return last
    return last


@dataclass(frozen=True, slots=True)
class Part(Generic[P]):
    """One droppable piece of a line: its text (any renderable ``P``), its width in cells, and its
    rank (0 is kept first). ``where`` names where the part can still be seen when it is dropped
    (``3 timeline``), or is empty."""

    item: P
    cells: int
    rank: int
    where: str = ""


def fit_parts(parts: Sequence[Part[P]], width: int, gap: int = 0,
              note_gap: int | None = None) -> tuple[list[Part[P]], str]:
    """The parts that fit in ``width`` cells, ``gap`` cells between two, in line order, and a note
    for the line: empty when every part fits, else ``…`` and where the dropped parts can be seen
    (``… 3 timeline``). Parts are taken by rank (ties in line order) while they fit, with room
    kept for the note and ``note_gap`` cells beside it (``gap`` unless given)."""
    total = sum(p.cells for p in parts) + gap * max(0, len(parts) - 1)
    if total <= width:
        return list(parts), ""
    reserve = cell_len(_note(parts)) + (gap if note_gap is None else note_gap)
    kept = _take(parts, width - reserve, gap)
    note = _note([p for i, p in enumerate(parts) if i not in kept])
    return [p for i, p in enumerate(parts) if i in kept], note


def _take(parts: Sequence[Part[P]], width: int, gap: int) -> set[int]:
    kept: set[int] = set()
    used = 0
    for i in sorted(range(len(parts)), key=lambda i: (parts[i].rank, i)):
        need = parts[i].cells + (gap if kept else 0)
        if used + need <= width:
            kept.add(i)
            used += need
    return kept


def _note(dropped: Sequence[Part[P]]) -> str:
    """``…`` and where the dropped parts are shown (each place once), or ``…`` alone."""
    where = list(dict.fromkeys(p.where for p in dropped if p.where))
    return " ".join([ELLIPSIS, *where])
