"""Every key binding, derived from the one table of operations (``operations.py``).

The decision this module protects: the footer, the help screen and the command palette are all
generated from ``KEYS``, so a key can never do one thing and be documented as another. Widgets
and screens take their ``BINDINGS`` from ``bindings(scope)``.
"""

from __future__ import annotations

from textual.binding import Binding, BindingType

from warpdeck.tui.operations import KEYS, SCOPES, Key, while_reading

__all__ = ["KEYS", "SCOPES", "Key", "bindings", "keys_in", "reading_bindings"]


def keys_in(scope: str) -> tuple[Key, ...]:
    """The keys of one scope, in table order."""
    return tuple(k for k in KEYS if k.scope == scope)


def bindings(scope: str) -> list[BindingType]:
    """Textual bindings for one scope. App keys are not priority bindings (tab aside), so a
    focused input gets its letters first."""
    return [Binding(k.keys, k.action, k.short or k.description, show=k.footer, key_display=k.display,
                    tooltip=k.description, priority=k.priority) for k in keys_in(scope)]


def reading_bindings() -> list[BindingType]:
    """The app's keys that work over the help and a task's detail too (``Operation.while_reading``):
    those screens hide the app's keys, so they bind these to the app's actions, not shown."""
    return [Binding(k.keys, f"app.{k.action}", k.short or k.description, show=False, key_display=k.display,
                    tooltip=k.description) for k in while_reading()]
