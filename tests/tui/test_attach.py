"""The control room attached to an engine elsewhere, through a real Mosquitto, shows the same counts
as the engine itself, and its keys send signed commands the engine applies."""

from __future__ import annotations

from pathlib import Path

from wd_broker import Mosquitto
from wd_control import EngineThread, slow_spec
from wd_tui import SIZE, until

from warpdeck.engine.api import Pause
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.attach import AttachLink, replay_link

SECRET = b"attach-tui-secret-0123456789"


async def test_attached_counts_match_the_engine_and_keys_command_it(mosquitto: Mosquitto, tmp_path: Path) -> None:
    with EngineThread(slow_spec("attach"), mosquitto.address, secret=SECRET) as et:
        eng = et.engine
        assert eng is not None
        link = AttachLink(mosquitto.address, "attach", secret=SECRET, record=tmp_path / "rec.jsonl")
        app = WarpdeckApp(link, screenshot_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.snapshot is not None and app.snapshot.counts.done > 0)
            await pilot.press("p")
            await until(pilot, lambda: bool(link.sent) and eng.feeder.paused)
            assert link.sent[0].command == Pause() and link.sent[0].result.ok
            await until(pilot, lambda: not any(lane.inflight_ids() for lane in eng.lanes))
            seq = et.snapshot().seq
            await until(pilot, lambda: app.snapshot is not None and app.snapshot.seq > seq + 1)
            assert app.snapshot.counts == et.snapshot().counts
            assert app.snapshot.pipeline == "attach"
            await pilot.press("q")  # detaches at once: the engine is not ours to stop
        assert app.return_code == 0
        assert not eng.feeder.draining and et.engine is not None and not et.finished()
        link.stop()
    # What was recorded plays back in the control room.
    replay = replay_link(tmp_path / "rec.jsonl", speed=50)
    app2 = WarpdeckApp(replay, screenshot_dir=tmp_path)
    async with app2.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app2.snapshot is not None and app2.snapshot.counts.done > 0)
    replay.stop()


async def test_readonly_attach_sends_nothing(mosquitto: Mosquitto, tmp_path: Path) -> None:
    with EngineThread(slow_spec("attach-ro"), mosquitto.address, secret=SECRET) as et:
        link = AttachLink(mosquitto.address, "attach-ro", secret=SECRET, readonly=True)
        app = WarpdeckApp(link, screenshot_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.snapshot is not None)
            await pilot.press("p")
            await until(pilot, lambda: bool(link.sent))
            assert not link.sent[0].result.ok and "read-only" in link.sent[0].result.message
            assert not et.engine.feeder.paused  # type: ignore[union-attr]
        link.stop()
