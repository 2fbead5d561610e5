"""How the control room ends on SIGTERM or SIGHUP: as ``q`` does with work running, without asking.

The decision this module protects: a signal never leaves the terminal as the app had it. Python's
default for SIGTERM and SIGHUP ends the process at once, in the alternate screen, with mouse
reporting on and the cursor hidden, and with no report (issue 29). Here each is taken on the app's
own loop: the app exits the way a confirmed quit does (the run stops, its report is written, exit
4), and Textual hands the terminal back as it found it. The app's thread must be the main thread
(asyncio's rule for signal handlers); elsewhere (an app in a test's thread) nothing is installed.

A SIGHUP usually means the terminal is gone (its window closed, the ssh link dropped): every write
to it fails with EIO, and Textual's output thread dies on the first, after which its shutdown
waits forever to queue the escapes that would restore a terminal nobody sees. Where the terminal
no longer answers (``terminal_gone``), its descriptors are pointed at /dev/null first and Textual's
output thread is told to drop what it is handed (``release_dead_terminal``), so the run still stops
and writes its report.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import termios
from collections.abc import Callable
from typing import Any

__all__ = ["STOP_SIGNALS", "StopSignals", "release_dead_terminal", "terminal_gone"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals that end the control room as a confirmed quit does."""


class StopSignals:
    """Handlers for ``STOP_SIGNALS`` on the running loop, calling ``on_signal(signum)``."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed: list[int] = []
        self.received: int | None = None
        """The first signal that came, if one did."""

    def install(self) -> None:
        """Take the signals on the running loop (call from the app's loop)."""
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, self._arrived, sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
                break
            self._installed.append(sig)
        self._loop = loop

    def _arrived(self, signum: int) -> None:
        if self.received is None:
            self.received = signum
        self._on_signal(signum)

    def remove(self) -> None:
        """Give the signals back to their defaults (asyncio restores SIG_DFL)."""
        if self._loop is None:
            return
        for sig in self._installed:
            with contextlib.suppress(ValueError, RuntimeError):
                self._loop.remove_signal_handler(sig)
        self._installed.clear()


def terminal_gone(fd: int = 1) -> bool:
    """Whether ``fd`` was a terminal that has hung up (its attributes no longer read: EIO)."""
    try:
        termios.tcgetattr(fd)
    except termios.error as exc:
        return bool(exc.args) and exc.args[0] == errno.EIO
    return False


def release_dead_terminal(app: Any) -> None:
    """Point stdin, stdout and stderr at /dev/null, and make Textual's output thread (``App._driver.
    _writer_thread``, private: if it is renamed, only the descriptors change) drop what it is handed:
    it dies, or is dying, on the hung-up terminal, and the app's shutdown must not wait on it."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    writer = getattr(getattr(app, "_driver", None), "_writer_thread", None)
    if writer is not None:  # dead or dying on the hung-up terminal: nothing it writes can be seen
        writer.write = lambda text: None
        writer.stop = lambda: None
