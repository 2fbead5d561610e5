"""Real brokers for tests: Mosquitto on a free loopback port (a process we start, stop, restart,
and can stop and restart on the same port), and the embedded amqtt broker.

With ``CI=true`` a missing ``mosquitto`` binary is a failure, not a skip: the control plane's
tests against a real broker must run in CI.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from warpdeck.engine.control.broker import BrokerAddress, EmbeddedBroker, free_port

_SEARCH = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto")


def mosquitto_binary() -> str:
    """The mosquitto executable; skips (fails under CI=true) when there is none."""
    found = shutil.which("mosquitto") or next((p for p in _SEARCH if Path(p).is_file()), None)
    if found is None:
        msg = "mosquitto is not installed (apt install mosquitto; brew install mosquitto)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{msg}: CI must test against a real broker")
        pytest.skip(msg)
    return found


def _wait_listening(port: int, limit_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"mosquitto exited with {proc.returncode}: {out}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {limit_s} s")


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def make_tls(workdir: Path) -> TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=workdir)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=warpdeck-test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (workdir / "san.ext").write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.ext", "-out", "server.pem")
    return TlsFiles(workdir / "ca.pem", workdir / "server.pem", workdir / "server.key")


class Mosquitto:
    """A mosquitto process on one loopback port; ``stop()`` and ``start()`` again keep the port."""

    name = "mosquitto"

    def __init__(self, workdir: Path, tls: TlsFiles | None = None) -> None:
        self.binary = mosquitto_binary()
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.tls = tls
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence false",
                 "log_type error", "log_type warning"]
        if tls is not None:
            lines += [f"cafile {tls.ca}", f"certfile {tls.cert}", f"keyfile {tls.key}"]
        if os.geteuid() == 0:
            lines.append("user root")
        self.conf.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> BrokerAddress:
        if self.tls is not None:
            return BrokerAddress("127.0.0.1", self.port, tls=True, ca_file=self.tls.ca)
        return BrokerAddress("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return self.address.url

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        _wait_listening(self.port, 10, self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


class Amqtt:
    """The embedded broker (amqtt) on its own thread; restartable on the same port."""

    name = "amqtt"

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self._broker: EmbeddedBroker | None = None

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return self.address.url

    def start(self) -> None:
        self._broker = EmbeddedBroker(port=self.port)
        self._broker.start()  # returns once amqtt listens (a bare probe connection would upset it)

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.stop()
            self._broker = None


Broker = Mosquitto | Amqtt
