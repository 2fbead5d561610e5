"""Regenerate docs/control-room.svg: the board during a synthetic run, saved by the app's own
screenshot method (``App.save_screenshot``, what ``ctrl+s`` calls) at 160x48.

    .venv/bin/python scripts/screenshot.py [--out docs/control-room.svg]

The picture is the same on every run: the snapshots are a pure function of the seed and the time
(``wd_synthetic``, the tests' own scaffolding in tests/support), they are handed to the app one
after another with no clock between them (the figures strip's sparkline is one point per
snapshot), and the screenshot is taken once the board shows the last one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.board import BoardScreen

SIZE = (160, 48)
ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests" / "support"))
from wd_synthetic import SyntheticRun  # noqa: E402 - test scaffolding, found once its folder is on the path

TASKS, RATE, SNAPSHOTS, DT, T0 = 200_000, 2_000, 40, 0.5, 40.0
"""A run a few minutes in: every column holds tasks, stalls of every kind and failures show."""


async def shoot(out: Path) -> Path:
    """Feed the snapshots, wait until the board shows the last, save the SVG; returns its path."""
    run = SyntheticRun(TASKS, seed=7, transitions_per_s=RATE, stalled_every=97, failed_every=193, batch=32)
    snaps = [run.snapshot_at(T0 + i * DT, seq=i + 1) for i in range(SNAPSHOTS)]
    app = WarpdeckApp(StreamLink([]))
    async with app.run_test(size=SIZE) as pilot:
        board = app.screen
        assert isinstance(board, BoardScreen)
        for snap in snaps:
            app.snapshot = snap
            await pilot.pause()
        for _ in range(500):  # a condition, not a sleep: the last snapshot spread over every column
            if board.shown_seq == snaps[-1].seq:
                break
            await pilot.pause()
        else:
            raise RuntimeError(f"the board never showed snapshot {snaps[-1].seq}")
        await pilot.pause()
        return Path(app.save_screenshot(filename=out.name, path=str(out.parent)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "control-room.svg", help="where the SVG goes")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(asyncio.run(shoot(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
