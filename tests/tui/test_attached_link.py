"""An attached room knows its link. While it hears nothing from its engine, the workers screen does
not say ``connected`` or ``online``: the broker's connection and each worker's state read unknown,
with why, until telemetry comes again. A broker that cannot be reached is said with its address and
why, and again while the room retries; ``q`` quits at once whatever the attempt is doing."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.widgets import Static
from wd_broker import Mosquitto
from wd_control import EngineThread, slow_spec
from wd_synthetic import SyntheticRun
from wd_tmux import TMUX_MARK, Pane
from wd_tui import SIZE, notes, until

from warpdeck.engine.api import BrokerAddress, LinkView
from warpdeck.engine.control.broker import free_port
from warpdeck.tui.app import WarpdeckApp
from warpdeck.tui.attach import AttachLink
from warpdeck.tui.link import StreamLink
from warpdeck.tui.screens.workers import WorkersScreen
from warpdeck.tui.widgets.worker_table import WorkerTable

_HEARD = LinkView(True, 3_200.0, 4.0, 0.042, 0.0, 0.1, 0)
_SILENT = LinkView(True, 0.0, 0.0, 0.042, 0.0, 12.4, 0)
_LOST = LinkView(False, 0.0, 0.0, 0.042, 0.0, 30.0, 0)


def _summary(app: WarpdeckApp, which: str) -> str:
    return str(app.screen.query_one(f"#{which}-summary", Static).render())


def _states(app: WarpdeckApp) -> list[str]:
    table = app.screen.query_one(WorkerTable)
    return [str(table.get_cell(str(key.value), "state")) for key in table.rows]


def _cells(app: WarpdeckApp, column: str) -> list[str]:
    table = app.screen.query_one(WorkerTable)
    return [str(table.get_cell(str(key.value), column)) for key in table.rows]


async def test_the_workers_screen_vouches_only_for_what_it_hears() -> None:
    run = SyntheticRun(2_000, seed=3, transitions_per_s=200)
    first, *_ = [dataclasses.replace(s, link=_HEARD) for s in run.stream(1.0, 1)]
    assert first.control is not None and first.control.connected and first.workers
    app = WarpdeckApp(StreamLink([first]))
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: app.snapshot is not None)
        await pilot.press("2")
        await until(pilot, lambda: isinstance(app.screen, WorkersScreen))
        await pilot.pause()
        heard_states = _states(app)
        assert any(s.startswith("● online") for s in heard_states), heard_states
        assert "● connected" in _summary(app, "control")
        last_seen = {w.id: str(w.state) for w in first.workers}

        for link, why in ((_SILENT, "no telemetry for 12s"), (_LOST, "broker lost")):
            app.snapshot = dataclasses.replace(first, link=link)
            await pilot.pause()
            control = _summary(app, "control")
            assert f"? unknown: {why} (last seen ● connected)" in control, control
            assert "monitor unknown" in control and "monitor on time" not in control
            table = app.screen.query_one(WorkerTable)
            assert _states(app) == [f"? unknown · {why} (last seen {last_seen[str(k.value)]})" for k in table.rows]
            assert set(_cells(app, "age")) == {"?"}, "no heartbeat age frozen at its last value"
            workers = _summary(app, "workers")
            assert f"? unknown: {why} (last seen 1 dead, 1 late, 1 online)" in workers, workers

        app.snapshot = dataclasses.replace(first, link=_HEARD)  # telemetry again
        await pilot.pause()
        assert _states(app) == heard_states
        assert "● connected" in _summary(app, "control") and "unknown" not in _summary(app, "workers")


async def test_a_frozen_broker_leaves_the_workers_unknown_until_it_thaws(mosquitto: Mosquitto,
                                                                          tmp_path: Path) -> None:
    with EngineThread(slow_spec("attach-workers"), mosquitto.address, secret=b"x" * 32):
        link = AttachLink(mosquitto.address, "attach-workers", readonly=True)
        app = WarpdeckApp(link, screenshot_dir=tmp_path)
        async with app.run_test(size=(200, 40)) as pilot:
            await until(pilot, lambda: app.snapshot is not None and bool(app.snapshot.workers))
            await pilot.press("2")
            await until(pilot, lambda: isinstance(app.screen, WorkersScreen))
            await until(pilot, lambda: "● connected" in _summary(app, "control")
                        and any(s.startswith("● online") for s in _states(app)))
            os.kill(mosquitto.proc.pid, signal.SIGSTOP)
            try:
                await until(pilot, lambda: "? unknown: no telemetry for" in _summary(app, "control"), 15)
                await until(pilot, lambda: all(s.startswith("? unknown · no telemetry for") for s in _states(app)))
                assert "● connected" not in _summary(app, "control").split("(last seen")[0]
            finally:
                os.kill(mosquitto.proc.pid, signal.SIGCONT)
            await until(pilot, lambda: "● connected" in _summary(app, "control")
                        and "unknown" not in _summary(app, "control"), 30)
            await until(pilot, lambda: any(s.startswith("● online") for s in _states(app)))
        link.stop()


async def test_a_broker_not_there_is_said_with_its_address_until_it_comes(tmp_path: Path) -> None:
    broker = Mosquitto(tmp_path)  # its port: nothing listens there until it starts
    link = AttachLink(broker.address, "nobody", readonly=True)
    app = WarpdeckApp(link, screenshot_dir=tmp_path)
    try:
        async with app.run_test(size=SIZE) as pilot:
            said = f"cannot reach broker mqtt://127.0.0.1:{broker.port}: connection refused · retrying"
            await until(pilot, lambda: any(n.startswith(said) for n in notes(app)))
            broker.start()
            back = f"connected to broker mqtt://127.0.0.1:{broker.port} after "
            await until(pilot, lambda: any(n.startswith(back) for n in notes(app)), 15)
            await pilot.press("q")
        assert app.return_code == 0
    finally:
        link.stop()
        broker.stop()


@dataclasses.dataclass
class MuteBroker:
    """A server that takes the call and never answers it: an attempt waits on its CONNACK."""

    address: BrokerAddress
    calls: list[asyncio.StreamWriter]


@pytest.fixture
async def mute_broker() -> AsyncIterator[MuteBroker]:
    calls: list[asyncio.StreamWriter] = []

    async def take(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        calls.append(writer)

    server = await asyncio.start_server(take, "127.0.0.1", 0)
    try:
        yield MuteBroker(BrokerAddress("127.0.0.1", server.sockets[0].getsockname()[1]), calls)
    finally:
        for writer in calls:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_q_quits_at_once_while_an_attempt_waits(mute_broker: MuteBroker, tmp_path: Path) -> None:
    link = AttachLink(mute_broker.address, "nobody", readonly=True)
    app = WarpdeckApp(link, screenshot_dir=tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: bool(mute_broker.calls))  # the attempt is under way: no answer coming
        t0 = time.monotonic()
        await pilot.press("q")
    took = time.monotonic() - t0  # the app's exit stops the link (``on_unmount``)
    assert app.return_code == 0
    assert link.remote._thread.join(0), "the client's thread has ended"
    assert took < 2.0, f"quitting took {took:.1f} s"


@TMUX_MARK
def test_warpdeck_attach_to_an_address_where_nothing_listens(tmp_path: Path) -> None:
    # As a person runs it (issue 29: it waited for ever, without a word).
    port = free_port()
    warpdeck = Path(sys.executable).parent / "warpdeck"
    pane = Pane(f"{warpdeck} attach mqtt://127.0.0.1:{port} --pipeline x; echo EXIT=$?; sleep 30", tmp_path)
    try:
        screen = pane.wait_for("cannot reach broker", 20)
        # (The notification wraps in its box: the address and the reason, then the rest.)
        assert f"cannot reach broker mqtt://127.0.0.1:{port}: connection" in screen, screen
        assert "refused · retrying" in screen, screen
        pane.keys("q")
        pane.wait_for("EXIT=0", 5)
    finally:
        pane.close()
