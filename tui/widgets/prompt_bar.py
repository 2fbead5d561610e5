"""A one-line prompt at the foot of a screen: the filter (``/``) and command mode (``:``).

The decision this module protects: opening the prompt costs a few lines of repaint, not a whole
screen. Each of the three main screens holds a hidden bar on a layer of its own, docked over its
figures strip and footer, so showing it moves no other widget and the screen beneath stays as it
is (a modal screen over the board would re-render all of it through a translucent backdrop, on
opening and on every snapshot while open). Screens without a bar (help, detail, a confirmation)
get the same bar inside a ``PromptScreen``.

Enter hands the line over while its key is being handled (``_PromptInput``), not through Textual's
``Submitted`` message, which is queued behind the key: by then the key gate (``tui/keygate.py``)
had routed the next keys of a burst, and ``:depth 11⏎:depth 12⏎`` ran only the first (issue 29).

While the bar is open the footer under it is hidden. Textual's compositor cuts every line at the
edge of every widget on it, whatever its layer, and a wide character (``任``, an emoji) of the top
widget that straddles a cut is drawn as two blanks (Textual issue #6357): the footer's keys, a row
of small widgets under the input line, blanked the characters typed over their edges.

A paste of several lines is kept whole, its lines joined by a space, and the hint says so: a
command line is one line, and a paste never runs it (enter does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol, runtime_checkable

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.suggester import Suggester
from textual.widget import Widget
from textual.widgets import Footer, Input, Label

__all__ = ["PromptBar"]

Check = Callable[[str], "str | None"]


class _PromptInput(Input):
    """The bar's input: enter submits at once (``PromptBar.submit``), within the key's handling; a
    paste of several lines is taken as one line (``PromptBar.noted``)."""

    def _on_paste(self, event: events.Paste) -> None:
        pasted = event.text.splitlines()
        if len(pasted) < 2:
            return  # one line: Textual's handler (Input's, next in line) takes it
        event.prevent_default()  # Input's would keep the first line only
        event.stop()
        lines = [line.strip() for line in pasted if line.strip()]
        text = " ".join(lines)
        if self.selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *self.selection)
        bar = self.parent
        if len(lines) > 1 and isinstance(bar, PromptBar):
            bar.noted(f"pasted {len(lines)} lines as one")

    async def action_submit(self) -> None:
        bar = self.parent
        if isinstance(bar, PromptBar):
            bar.submit(self.value)
        else:  # pragma: no cover - the input lives in a bar
            await super().action_submit()


@runtime_checkable
class Candidates(Protocol):
    """A suggester that can also list every candidate and say what tab completes (``IdSuggester``)."""

    def candidates(self, value: str, limit: int = ..., *, task_keys: bool = True) -> list[str]: ...

    def completion(self, value: str) -> str | None: ...


class PromptBar(Vertical):
    """A hint, an error line (empty unless ``check`` refused the text) and the input. ``ask`` opens
    it; enter hands the text to the asker, escape hands None, and the bar hides itself again."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    DEFAULT_CSS = """
    PromptBar { layer: prompt; dock: bottom; height: auto; background: $panel; padding: 0 1; visibility: hidden; }
    PromptBar.-open { visibility: visible; }
    PromptBar Input, PromptBar Input:focus { border: none; height: 1; padding: 0; background: $panel; }
    PromptBar Label { width: 1fr; height: auto; }  /* wrapped, never cut (a long hint at 80 columns) */
    PromptBar .hint { color: $text-muted; }
    PromptBar .error { color: $error; }
    PromptBar .candidates { color: $text-muted; }
    """

    class Closed(Message):
        """The prompt closed: ``value`` is the text entered, or None (escape)."""

        def __init__(self, bar: PromptBar, value: str | None) -> None:
            super().__init__()
            self.bar = bar
            self.value = value

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self._hint = Label("", classes="hint")
        self._error = Label("", classes="error", id="prompt-error")
        self._candidates = Label("", classes="candidates", id="prompt-candidates")
        self._candidates.display = False
        self._input = _PromptInput(id="prompt-input")
        self._input.can_focus = False  # while hidden: a screen's auto focus must not land in it
        self._check: Check | None = None
        self._then: Callable[[str | None], object] | None = None
        self._before: Widget | None = None
        self._hint_text = ""

    def compose(self) -> ComposeResult:
        yield self._hint
        yield self._candidates
        yield self._error
        yield self._input

    # -- handlers ----------------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.value or self.candidates_shown:  # an empty line lists the verbs on tab only
            self._show_candidates(task_keys=False)

    def submit(self, value: str) -> None:
        """Enter: the line to the asker, unless ``check`` refuses it (the error line says why)."""
        error = self._check(value) if self._check else None
        if error:
            self._error.update(Text(error))  # it quotes what was typed: text, not markup
            return
        self.close(value)

    # -- actions -----------------------------------------------------------------------------------
    def action_cancel(self) -> None:
        self.close(None)

    # -- public ------------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def ask(self, prompt: str, *, value: str = "", hint: str = "", suggester: Suggester | None = None,
            check: Check | None = None, then: Callable[[str | None], object] | None = None) -> None:
        """Open the prompt (or re-open it for a new question) with the cursor in the input."""
        if not self.is_open:
            focused = self.screen.focused
            self._before = focused if focused is not None and focused not in self.query("*") else None
            self._cover_footer(True)
        self._check, self._then = check, then
        # Each update lays the bar out again: only what changed (opening costs a frame, not three).
        self._hint_text = hint
        _set(self._hint, hint)
        _set(self._error, "")
        if self._candidates.display:
            self._candidates.update("")
            self._candidates.display = False
        field = self._input
        field.placeholder, field.suggester = prompt, suggester
        field.value = value
        field.cursor_position = len(value)
        self.add_class("-open")
        field.can_focus = True
        # At once, not ``focus()`` (a callback later): the next key is routed by this focus.
        self.screen.set_focus(field)

    def close(self, value: str | None) -> None:
        """Hide the prompt, give the focus back and hand ``value`` to the asker."""
        if not self.is_open:
            return
        then, before = self._then, self._before
        self._then = self._check = self._before = None
        self.remove_class("-open")
        self._cover_footer(False)
        self._input.can_focus = False
        if before is not None and before.is_attached and before.screen is self.screen:
            self.screen.set_focus(before)  # not ``focus()``, which repaints all of it
        else:
            self._input.blur()  # keys must not go on reaching a hidden input
        self.post_message(self.Closed(self, value))
        if then is not None:
            then(value)

    def complete(self) -> None:
        """Tab: complete the last word, with a space after it where only one candidate was left
        (``Candidates.completion``); with nothing to complete, list what could follow (on an
        empty line: every verb). Worked out here, not taken from the suggestion shown, which
        Textual looks up in a worker and which a burst of keys can overtake."""
        field = self._input
        before = field.value
        suggester = field.suggester
        if isinstance(suggester, Candidates):
            completed = suggester.completion(before)
            if completed is not None:
                field.value = completed
        else:  # another suggester: take its suggestion, as the right arrow does at the end of the line
            field.cursor_position = len(before)
            field.action_cursor_right()
        field.cursor_position = len(field.value)
        if field.value == before:
            self._show_candidates(task_keys=True)

    def noted(self, note: str) -> None:
        """Say ``note`` in the hint line, before the hint, until the prompt is asked again."""
        _set(self._hint, f"{note} · {self._hint_text}" if self._hint_text else note)

    @property
    def candidates_shown(self) -> str:
        """The candidate line as shown (empty: none)."""
        return str(self._candidates.render())

    def _cover_footer(self, covered: bool) -> None:
        """Hide the screen's footer while the open bar covers it (the module docstring says why);
        it keeps its place, so nothing moves."""
        for footer in self.screen.query_children(Footer):
            if covered:
                footer.styles.visibility = "hidden"
            else:
                footer.styles.clear_rule("visibility")

    def _show_candidates(self, *, task_keys: bool) -> None:
        suggester = self._input.suggester
        value = self._input.value
        found: list[str] = []
        if isinstance(suggester, Candidates) and (value or task_keys):
            found = suggester.candidates(value, task_keys=task_keys)
        self._candidates.update(Text("tab: " + " · ".join(found)) if found else "")  # Text: [KEY…] is no markup
        self._candidates.display = bool(found)


def _set(label: Label, text: str) -> None:
    """``label.update(text)`` unless it already shows ``text``."""
    if str(label.render()) != text:
        label.update(text)
