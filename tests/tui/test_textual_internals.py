"""The canary: every private Textual name the control room relies on still exists, and the pinned
Textual is the one installed. When Textual changes, this fails first, naming what moved."""

from __future__ import annotations

import importlib.metadata

from textual.screen import Screen

from warpdeck.tui.textual_internals import TEXTUAL_WRITTEN_FOR, USED, check, missing


def test_every_private_textual_name_the_control_room_uses_is_there() -> None:
    assert missing() == [], f"Textual internals gone: {missing()} (see tui/textual_internals.py)"
    check()


def test_the_installed_textual_is_the_one_the_overrides_were_written_for() -> None:
    assert importlib.metadata.version("textual") == TEXTUAL_WRITTEN_FOR


def test_a_missing_name_is_named_in_the_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("warpdeck.tui.textual_internals.USED", (*USED, (Screen, ("_gone_in_textual_9",), "x.py")))
    assert missing() == ["Screen._gone_in_textual_9 (x.py)"]
    try:
        check()
    except RuntimeError as exc:
        assert "Screen._gone_in_textual_9 (x.py)" in str(exc) and TEXTUAL_WRITTEN_FOR in str(exc)
    else:
        raise AssertionError("check() did not refuse")
