"""Helpers for control-plane tests: an engine with a control plane running on a thread of its own,
worker processes to kill and freeze, and an MQTT listener that records what the engine publishes."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
from wd_build import spec as build_spec

from warpdeck.engine.api import Command, CommandResult, Engine, EngineSnapshot, PipelineSpec
from warpdeck.engine.control.broker import BrokerAddress
from warpdeck.engine.control.monitor_types import MonitorConfig
from warpdeck.engine.control.plane import ControlSettings


def slow_spec(name: str = "ctl", count: int = 1_000_000) -> PipelineSpec:
    """Runs far longer than any test; mostly idle (a 100 ms stage per batch of 8)."""
    return build_spec(["wd_stages:sleep_100ms"], name=name,
                      source={"kind": "synthetic", "count": count, "shape": [4], "dtype": "float32"})


def wait_for(cond: Callable[[], object], limit_s: float, what: str = "condition", step: float = 0.01) -> float:
    """Poll ``cond`` until true; returns the seconds it took; fails after ``limit_s``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit_s:
            raise AssertionError(f"{what} not met within {limit_s} s")
        time.sleep(step)
    return time.monotonic() - t0


class EngineThread:
    """``Engine(spec, control=...)`` on its own thread and loop, for tests that act from outside."""

    def __init__(self, spec: PipelineSpec, address: BrokerAddress | None, *, secret: bytes | None = None,
                 monitor: MonitorConfig | None = None, heartbeat_s: float = 0.5, **engine_kw: Any) -> None:
        self.spec = spec
        self.settings = ControlSettings(broker=address, secret=secret, heartbeat_s=heartbeat_s, monitor=monitor)
        self.engine: Engine | None = None
        self._engine_kw = engine_kw
        self.report: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self.error: BaseException | None = None

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with Engine(self.spec, control=self.settings, **self._engine_kw) as eng:
                self.engine = eng
                self._ready.set()
                done = asyncio.ensure_future(eng.wait())
                stop = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({done, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if done.done():
                    self.report = done.result()
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._ready.set()

    def __enter__(self) -> EngineThread:
        self._thread.start()
        self._ready.wait(30)
        assert self.engine is not None, f"engine did not start: {self.error!r}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._thread.is_alive():
            faulthandler.dump_traceback(all_threads=True)  # where it hangs, for the log
            raise AssertionError("engine thread did not stop within 30 s")

    def finished(self) -> bool:
        return self.report is not None

    def command(self, cmd: Command) -> CommandResult:
        """Send ``cmd`` to the engine on its own loop, from this (test) thread; its answer."""
        assert self.engine is not None and self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.engine.command(cmd), self._loop).result(10)

    def snapshot(self) -> EngineSnapshot | None:
        assert self.engine is not None
        return self.engine.publisher.latest

    def worker(self, worker_id: str) -> Any:
        snap = self.snapshot()
        if snap is None:
            return None
        return next((w for w in snap.workers if w.id == worker_id), None)

    def verdict(self, worker_id: str, kind: str, after: float) -> Any:
        """The monitor's first ``kind`` verdict on ``worker_id`` at or after ``after`` (monotonic)."""
        assert self.engine is not None and self.engine.control is not None
        return next((v for v in list(self.engine.control.verdicts)
                     if v.worker_id == worker_id and v.kind == kind and v.at >= after), None)

    def state_of(self, worker_id: str) -> str | None:
        w = self.worker(worker_id)
        return None if w is None else w.state


@dataclass
class WorkerProcess:
    """``python -m warpdeck.engine.control.heartbeat``: a real worker process to kill or freeze."""

    url: str
    worker_id: str
    pipeline: str
    work: str = "steady"
    interval: float = 0.5
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = field(default=None, init=False)
    epoch: int = field(default=0, init=False)

    def start(self, limit_s: float = 20) -> WorkerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "warpdeck.engine.control.heartbeat", "--broker", self.url, "--worker-id",
             self.worker_id, "--pipeline", self.pipeline, "--work", self.work, "--interval", str(self.interval),
             *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "ready epoch=N" once its birth is out
        assert line.startswith("ready epoch="), f"worker {self.worker_id} did not come up: {line!r}"
        self.epoch = int(line.split("=", 1)[1])
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, 18)  # SIGCONT, in case the test froze it
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def workers(*procs: WorkerProcess) -> Iterator[tuple[WorkerProcess, ...]]:
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.close()


async def collect(address: BrokerAddress, topic: str, until: Callable[[list[aiomqtt.Message]], bool],
                  limit_s: float = 10.0) -> list[aiomqtt.Message]:
    """Subscribe to ``topic`` and gather messages until ``until(messages)`` holds."""
    got: list[aiomqtt.Message] = []
    async with aiomqtt.Client(**address.client_kwargs()) as c:
        await c.subscribe(topic, qos=1)

        async def read() -> None:
            async for m in c.messages:
                if not m.topic.matches(topic):  # amqtt sends retained messages of other topics too
                    continue
                got.append(m)
                if until(got):
                    return

        await asyncio.wait_for(read(), limit_s)
    return got
