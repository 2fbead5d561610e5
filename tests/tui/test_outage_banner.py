"""An outage in the control room: a banner on every screen with its age and reason, the run's
state says it holds, and both go by themselves when the disk takes writes again. The engine is
real; only the disk's refusal is injected (a callable sink that raises ENOSPC while told to)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from wd_screen import screen_text
from wd_stages import DISK_FULL
from wd_tui import engine_app, slow_spec, until

from warpdeck.engine.api import parse_spec
from warpdeck.tui.widgets.alert_banner import AlertBanner

REASON = "sink: no space left on device (/data/outputs/)"


@pytest.fixture
def disk() -> Iterator[None]:
    DISK_FULL.clear()
    yield
    DISK_FULL.clear()


def _spec():
    base = slow_spec(stage="wd_stages:sleep_10ms").model_dump()
    base["sink"] = {"kind": "callable", "target": "wd_stages:refusing_disk"}
    return parse_spec(base, "<test>")


def _banner_shown(app) -> bool:  # type: ignore[no-untyped-def]
    return any(b.display for b in app.screen.query(AlertBanner))


@pytest.mark.parametrize("size", [(150, 42), (60, 30)])
async def test_an_outage_is_a_banner_on_every_screen_until_the_disk_takes_writes_again(
        tmp_path: Path, disk: None, size: tuple[int, int]) -> None:
    async with engine_app(tmp_path, _spec(), size=size) as (app, pilot, _link):
        DISK_FULL.set()
        await until(pilot, lambda: _banner_shown(app))
        for key in ("1", "2", "3"):
            await pilot.press(key)
            await until(pilot, lambda: _banner_shown(app))
            text = " ".join(line.strip() for line in screen_text(app))
            assert "⚠ outage" in text and REASON in text, text  # whole, wrapped where narrow
            assert "nothing fails" in text
        assert "outage: holding" in screen_text(app)[0]
        assert app.snapshot is not None and app.snapshot.counts.failed == 0
        DISK_FULL.clear()
        await until(pilot, lambda: not _banner_shown(app))
        await until(pilot, lambda: "outage" not in screen_text(app)[0])
        assert app.snapshot.counts.failed == 0
