"""Words from outside the control room (task keys, error text, a worker's host and device, a note
from the cluster) are shown as written, brackets and all: never read as Rich markup, where a
``[/data]`` in a path is a closing tag, and one the app would have crashed on."""

from __future__ import annotations

from dataclasses import replace

from wd_screen import screen_text
from wd_synthetic import SyntheticRun
from wd_tui import notes, until

from warpdeck.engine.api import EngineSnapshot, TaskFailure
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.link import StreamLink

PREFIX = "[/data]-"
ERROR = "OSError: cannot read [/data/cat [bold]7.png] [/]"


def _hostile() -> tuple[list[EngineSnapshot], dict]:  # type: ignore[type-arg]
    run = SyntheticRun(3000, seed=7, transitions_per_s=300, stalled_every=29, failed_every=41, batch=8,
                       prefix=PREFIX, digits=4)
    stream = list(run.stream(1.0, 6))
    last = stream[-1]
    failures = tuple(TaskFailure(f.key, ERROR, f.attempt) for f in last.failures)
    worker = replace(last.workers[0], id="odd-1", host="[/] [bold]node", device="[red]gpu[/red]",
                     note="restarting: waiting for [/] 1 GPU")
    stalled = tuple(replace(st, note="waiting on [/mnt/nfs] [blink]") for st in last.stalled)
    figures = replace(last.figures, bottleneck="bottleneck: sink [/out] [bold]slow")
    stream[-1] = replace(last, failures=failures, workers=(*last.workers, worker), stalled=stalled,
                         device="[/] cpu [b]", backend_reason="[/why]", figures=figures)
    details = {f.key: replace(run.detail(f.key, last.t), error=ERROR, traceback=f"Traceback\n{ERROR}")
               for f in failures}
    return stream, details


async def test_every_screen_shows_bracketed_words_as_written() -> None:
    stream, details = _hostile()
    app = WarpdeckApp(StreamLink(stream, details=details))
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq == stream[-1].seq)
        await pilot.pause()
        board = "\n".join(screen_text(app))
        assert f"✗ {PREFIX}" in board and "numpy·[/] cpu [b]" in board, board
        await pilot.press("2")
        await pilot.pause()
        workers = "\n".join(screen_text(app))
        assert "[/] [bold]node" in workers and "[red]gpu[/red]" in workers, workers
        assert "restarting: waiting for [/] 1 GPU" in workers, workers
        for key in ("3", "question_mark", "escape", "1"):
            await pilot.press(key)
            await pilot.pause()
        await pilot.press("colon", *f"detail {stream[-1].failures[0].key}", "enter")
        await until(pilot, lambda: "[/data/cat [bold]7.png] [/]" in "\n".join(screen_text(app)))
        await pilot.press("escape", "colon", *"detail [/nope]", "enter")  # typed brackets, quoted back
        await until(pilot, lambda: any("no task '[/nope]'" in n for n in notes(app)))
        assert app.errors == 0 and app.is_running
