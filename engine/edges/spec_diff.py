"""Why a run directory refuses a spec: the fields that differ, and how to start afresh.

The decision this module protects: a refused resume names what changed, field by field
(``stages[0].fn: warpdeck.examples.conv2d:stage → relstages:conv2d_x2``), from the spec the
journal stored beside its identity, so the user can tell a typo from another pipeline. Only
what decides the tasks and their outputs is stored and compared (the journal's identity JSON),
so a tuning field never shows up here. A journal older than the stored spec gets the identities
alone, and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

__all__ = ["MAX_LINES", "Identity", "mismatch_message", "spec_differences"]

MAX_LINES = 12
"""At most this many differing fields are listed; the rest are counted."""
_ABSENT = object()


class Identity(Protocol):
    """A spec's name, identity digest and identity JSON (empty where a journal did not store it)."""

    @property
    def name(self) -> str: ...
    @property
    def digest(self) -> str: ...
    @property
    def spec(self) -> str: ...


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _walk(path: str, old: Any, new: Any, out: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(old.keys() | new.keys()):
            _walk(f"{path}.{k}" if path else k, old.get(k, _ABSENT), new.get(k, _ABSENT), out)
    elif isinstance(old, list) and isinstance(new, list) and old and new:
        for i in range(max(len(old), len(new))):
            _walk(f"{path}[{i}]", old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT, out)
    elif old != new:
        out.append(f"{path or '(spec)'}: {_show(old)} → {_show(new)}")


def spec_differences(old_json: str, new_json: str) -> list[str]:
    """``field: old → new`` for every field that differs between two identity JSON texts."""
    out: list[str] = []
    _walk("", json.loads(old_json), json.loads(new_json), out)
    return out


def mismatch_message(run_dir: Path, made_by: Identity, offered: Identity) -> str:
    """The refusal of ``run_dir``, made by spec ``made_by``, to run spec ``offered``."""
    head = (f"{run_dir}: run directory was made by spec {made_by.name!r} (identity {made_by.digest[:12]}),"
            f" not by spec {offered.name!r} ({offered.digest[:12]})")
    afresh = (f"Resume it with the spec that made it, or start afresh: pass another --run-dir,"
              f" or remove {run_dir}.")
    if not made_by.spec:
        return f"{head} (this journal predates field-level comparison). {afresh}"
    try:
        lines = spec_differences(made_by.spec, offered.spec)
    except ValueError:  # a damaged stored spec: the identities still tell the specs apart
        lines = []
    if not lines:
        return f"{head} (the stored spec cannot be compared field by field). {afresh}"
    more = len(lines) - MAX_LINES
    shown = lines[:MAX_LINES] + ([f"… and {more} more"] if more > 0 else [])
    fields = "\n".join(f"  {line}" for line in shown)
    return f"{head}; the specs differ in:\n{fields}\n{afresh}"
