"""The processes heartbeats.py runs: Mosquitto, the monitor, the simulators, real worker processes
to kill and freeze, and busy loops; and per-thread CPU time read from ``/proc``.

The decision this module protects: every process is started and ended by its handle, by pid; a
benchmark that dies half-way leaves nothing behind (each child gets SIGKILL when the benchmark
process dies: ``setpriv --pdeathsig``, on Linux, as the rest of this benchmark is).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warpdeck.engine.control.broker import free_port

HERE = Path(__file__).resolve().parent
_MOSQUITTO = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto")
_TICK = os.sysconf("SC_CLK_TCK")
_GUARD = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
"""Every child runs under ``setpriv --pdeathsig KILL`` (util-linux; it execs, so the pid is the child's): the kernel
kills it when the benchmark dies, however it dies, so no busy loop, broker or stopped worker outlives a benchmark that
was itself killed."""


def raise_open_files(want: int) -> int:
    """Lift this process's (and so its children's) open-files limit towards ``want``; the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def thread_cpu_s(pid: int, tid: int) -> float:
    """CPU seconds of one thread: ``/proc/PID/task/TID/schedstat`` (nanoseconds on the CPU)."""
    text = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text(encoding="ascii")
    return int(text.split()[0]) / 1e9


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads, dead ones included."""
    text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15 of stat(5)


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, wait_s: float = 10.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(wait_s)


class Mosquitto:
    """Mosquitto on a free loopback port, in the tests' configuration (no persistence), with no
    connection limit; a fresh one per population, so no retained message outlives it. It can be
    stopped by a signal and started again on the same port (the broker-restart case)."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("mosquitto") or next((p for p in _MOSQUITTO if Path(p).is_file()), None)
        if binary is None:
            raise SystemExit("mosquitto is not installed (apt install mosquitto; brew install mosquitto)")
        self.port = free_port()
        self.conf = workdir / f"mosquitto-{self.port}.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence false",
                 "max_connections -1", "log_type error", "log_type warning"]
        if os.geteuid() == 0:
            lines.append("user root")
        self.conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self._argv = [*_GUARD, binary, "-c", str(self.conf)]
        self.start()

    def start(self) -> float:
        """Start the broker; once it accepts connections, return when it was started (monotonic)."""
        started = time.monotonic()
        self.proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        end = started + 10
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode} (config {self.conf})")
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return started
            time.sleep(0.01)
        raise RuntimeError(f"mosquitto does not listen on 127.0.0.1:{self.port}")

    def stop(self, sig: int) -> float:
        """Send ``sig`` and wait for the broker to exit; return when it was sent (monotonic)."""
        sent = time.monotonic()
        _stop(self.proc, sig)
        return sent

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def close(self) -> None:
        _stop(self.proc)


class JsonChild:
    """A Python child that speaks JSON lines on stdout, read on a thread of its own; it ends when we
    close its stdin (or on SIGTERM)."""

    def __init__(self, argv: list[str], on_line: Callable[[dict[str, Any]], None] | None = None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([*_GUARD, sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self._on_line = on_line
        self._err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # stderr is drained too (its last lines kept for an error message): a child that logs more
        # than a pipe holds must never block on a write.
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with contextlib.suppress(ValueError):
                doc = json.loads(raw)
                if self._on_line is None or not self._on_line(doc):
                    self.lines.put(doc)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._err.append(raw)
            del self._err[:-40]

    @property
    def stderr_tail(self) -> str:
        return "".join(self._err[-40:])

    def expect(self, key: str, limit_s: float) -> dict[str, Any]:
        """The next line that holds ``key`` (others are dropped); fails with the child's stderr."""
        end = time.monotonic() + limit_s
        while True:
            try:
                doc = self.lines.get(timeout=max(0.0, min(0.5, end - time.monotonic())))
            except queue.Empty:
                if self.proc.poll() is not None or time.monotonic() >= end:
                    self._err_reader.join(1.0)
                    raise RuntimeError(f"{' '.join(self.proc.args[-8:])}: no {key!r} within {limit_s} s "
                                       f"(exit {self.proc.poll()}): {self.stderr_tail[-2000:]}") from None
                continue
            if key in doc:
                return doc
            if "error" in doc:
                raise RuntimeError(f"{' '.join(self.proc.args[-8:])}: {doc['error']}")

    def send(self, doc: dict[str, Any]) -> None:
        """One JSON line on the child's stdin (a command; closing stdin ends it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(doc) + "\n")
        self.proc.stdin.flush()

    def finish(self, key: str, limit_s: float = 20.0) -> dict[str, Any] | None:
        """Close stdin (the child's signal to end), wait for its ``key`` line and for it to exit."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            doc = self.expect(key, limit_s)
        except RuntimeError:
            doc = None
        _stop(self.proc, wait_s=limit_s)
        return doc

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(slots=True)
class VerdictLog:
    """Every verdict the monitor reported, its latest count of known and online workers, and while
    it tracks a reconnection, how many workers it has heard since (``Monitor.track``)."""

    verdicts: list[tuple[str, int, str, str, float]] = field(default_factory=list)
    known: int = 0
    online: int = 0
    back: tuple[int, float, float] | None = None
    """(workers heard since the monitor reconnected, when the last of them was first heard, when
    it reconnected); None before the reconnection."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def feed(self, doc: dict[str, Any]) -> bool:
        """Take a verdict or worker-count line; True when it was one (the rest go to the queue)."""
        with self.lock:
            if "v" in doc:
                wid, epoch, kind, reason, at = doc["v"][:5]
                self.verdicts.append((wid, int(epoch), kind, reason, float(at)))
            elif "workers" in doc:
                self.known, self.online = int(doc["workers"]), int(doc["online"])
            elif "back" in doc:
                count, last, since = doc["back"]
                self.back = (int(count), float(last), float(since))
            else:
                return False
            self.changed.notify_all()
            return True

    def wait(self, cond: Callable[[], bool], limit_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(cond, limit_s)

    def dead(self, since: int = 0) -> list[tuple[str, int, str, str, float]]:
        with self.lock:
            return [v for v in self.verdicts[since:] if v[2] == "dead"]


class Monitor(JsonChild):
    """``_hb_monitor.py``: a real engine with its control plane, and its verdicts as they come."""

    def __init__(self, port: int, pipeline: str) -> None:
        self.log = VerdictLog()
        super().__init__([str(HERE / "_hb_monitor.py"), "--port", str(port), "--pipeline", pipeline], self.log.feed)
        ready = self.expect("ready", 60)
        self.threads: dict[str, int] = ready["threads"]
        self.worker_id: str = ready["worker_id"]
        self.control_tid = self.threads["warpdeck-control"]
        self.engine_tid = self.threads["MainThread"]

    def track(self, on: bool) -> None:
        """Start (or stop) tracking the monitor's next reconnection: from it on, the first heartbeat
        of each worker is noted, and ``log.back`` says how many and when the last came."""
        with self.log.lock:
            self.log.back = None
        self.send({"track": on})

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the control thread, the engine's loop thread, and the whole process."""
        return {"control": thread_cpu_s(self.pid, self.control_tid),
                "engine_loop": thread_cpu_s(self.pid, self.engine_tid),
                "process": process_cpu_s(self.pid)}


class TrialWorker:
    """``python -m warpdeck.engine.control.heartbeat``: a real worker process, to SIGKILL or SIGSTOP."""

    def __init__(self, url: str, worker_id: str, pipeline: str) -> None:
        self.worker_id = worker_id
        self.epoch = -1
        self.proc = subprocess.Popen(
            [*_GUARD, sys.executable, "-m", "warpdeck.engine.control.heartbeat", "--broker", url, "--worker-id",
             worker_id, "--pipeline", pipeline], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def ready(self) -> bool:
        """Wait for its "ready epoch=N" (its birth is out); False when it could not connect."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.startswith("ready epoch="):
            self.epoch = int(line.split("=", 1)[1])
            return True
        return False

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        _stop(self.proc, signal.SIGKILL)  # a stopped process dies of SIGKILL too
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Hogs:
    """One busy loop per core, at the same priority as everything else: the CPU stays saturated."""

    def __init__(self, n: int) -> None:
        argv = [*_GUARD, sys.executable, "-c", "while True: pass"]
        self.procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL) for _ in range(n)]

    def close(self) -> None:
        for p in self.procs:
            _stop(p, signal.SIGKILL)
