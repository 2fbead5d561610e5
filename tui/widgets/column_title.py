"""A board column's title: its name and how many tasks it holds, fitted to the column's width.

The decision this module protects: a count is never cut. A title wider than its column first
abbreviates its numbers (``queued 924k``), then drops the cancelled and failed counts after the
column's own (the status bar shows both), then shortens the name (``comp… 126``); the column's
own count stays, whole or abbreviated. The title is worked out as it is drawn, at the width it is
drawn at, so a resize refits it and nothing else has to.
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.text import Text
from textual.widget import Widget

from warpdeck.tui.fit import ELLIPSIS, count_forms, first_fit

__all__ = ["ColumnTitle", "column_title"]

_LEVELS = 4  # exact, then two, one and no decimals (``fit.count_forms``)


def column_title(name: str, shown: int, total: int, failed: int, cancelled: int, width: int,
                 beside: tuple[int, str] = (0, "")) -> str:
    """The most that fits in ``width`` cells of ``name shown/total ✗failed ⊘cancelled +n words``
    (the total only when a filter hides some rows; the marks only when not zero). ``beside``
    counts tasks the column stands for but does not list (``+999,040 to come`` beside the
    queued ones: not yet admitted): abbreviated first, then dropped."""
    return first_fit(_candidates(name, shown, total, failed, cancelled, beside), width)


def _candidates(name: str, shown: int, total: int, failed: int, cancelled: int,
                beside: tuple[int, str] = (0, "")) -> Iterator[str]:
    def number(n: int, level: int) -> str:
        forms = count_forms(n)
        return forms[min(level, len(forms) - 1)]

    def counts(level: int) -> str:
        return number(shown, level) if shown == total else f"{number(shown, level)}/{number(total, level)}"

    def marks(level: int, keep: int) -> str:
        out = [f" ✗{number(failed, level)}"] if failed else []
        out += [f" ⊘{number(cancelled, level)}"] if cancelled else []
        return "".join(out[:keep])

    more, words = beside
    if more:  # abbreviated before its words go: ``+20,000`` alone would not say what it counts
        for level in range(_LEVELS):
            yield f"{name} {counts(level)}{marks(level, 2)} +{number(more, level)} {words}"
    for keep in (2, 1, 0):
        for level in range(_LEVELS):
            yield f"{name} {counts(level)}{marks(level, keep)}"
    coarsest = counts(_LEVELS - 1)
    for cut in range(len(name) - 1, 0, -1):
        yield f"{name[:cut]}{ELLIPSIS} {coarsest}"
    yield coarsest


class ColumnTitle(Widget):
    """One line: the column's name and counts, as much of them as its width holds."""

    DEFAULT_CSS = """
    ColumnTitle { height: 1; padding: 0 1; background: $panel; text-style: bold; }
    """

    def __init__(self, name: str, *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self.title_name = name
        self._counts: tuple[int, int, int, int, tuple[int, str]] | None = None

    def render(self) -> Text:
        if self._counts is None:  # no snapshot yet
            return Text(self.title_name, no_wrap=True)
        shown, total, failed, cancelled, beside = self._counts
        width = self.size.width
        title = column_title(self.title_name, shown, total, failed, cancelled, width if width > 0 else 1_000, beside)
        return Text(title, no_wrap=True)  # Text, not a str: Textual would read a str as markup

    def set_counts(self, shown: int, total: int, failed: int = 0, cancelled: int = 0,
                   beside: tuple[int, str] = (0, "")) -> bool:
        """Show these counts; True if the title changed (it then repaints, one line, no layout)."""
        counts = (shown, total, failed, cancelled, beside)
        if counts == self._counts:
            return False
        self._counts = counts
        self.refresh()
        return True
