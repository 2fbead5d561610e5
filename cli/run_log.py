"""The run's log file: where anything unexpected goes, so that stderr keeps only what a user acts on.

The decision this module protects: faults the engine handles say so in their own words (an
outage's line, a closing note), and nothing else reaches the terminal. A library's warning, an
exception in a thread or in a callback nobody awaited, a Python warning: each is appended, with
its traceback, to ``<run-dir>/warpdeck.log`` (the control room's own errors go there too), and
the first one makes the command print the file's path once. While the control room owns the
terminal that line waits until the app has closed.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["LOG_NAME", "RunLog"]

LOG_NAME = "warpdeck.log"
_FORMAT = "--- %(asctime)s %(levelname)s %(name)s (%(threadName)s)\n%(message)s"


class _Handler(logging.Handler):
    """Appends records to the file (opened at the first one) and announces the file once."""

    def __init__(self, log: RunLog) -> None:
        super().__init__(logging.WARNING)
        self._log = log
        self._file: logging.FileHandler | None = None
        self.setFormatter(logging.Formatter(_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._file is None:
                self._log.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = logging.FileHandler(self._log.path, encoding="utf-8")
                self._file.setFormatter(self.formatter)
            self._file.emit(record)
            self._log.wrote(None)
        except OSError as exc:
            self._log.wrote(exc)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


class RunLog:
    """Routes the unexpected to ``path`` while installed (``with log.installed(): ...``)."""

    def __init__(self, path: Path, err: TextIO | None = None) -> None:
        self.path = path
        self._err = err
        self._lock = threading.Lock()
        self.records = 0
        """Records written so far."""
        self._told = False
        self._held = False
        self._failure: OSError | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[RunLog]:
        """Catch warnings, thread exceptions and every logger's warnings and errors into the file."""
        root = logging.getLogger()
        handler = _Handler(self)
        old_level, old_hook = root.level, threading.excepthook
        root.addHandler(handler)
        if root.level > logging.WARNING or root.level == logging.NOTSET:
            root.setLevel(logging.WARNING)
        logging.captureWarnings(True)
        threading.excepthook = self._thread_exception
        try:
            yield self
        finally:
            threading.excepthook = old_hook
            logging.captureWarnings(False)
            root.removeHandler(handler)
            root.setLevel(old_level)
            handler.close()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While the control room owns the terminal: the line that names the file waits."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
            self._tell()

    def wrote(self, failure: OSError | None) -> None:
        with self._lock:
            self.records += failure is None
            self._failure = self._failure or failure
        self._tell()

    def _tell(self) -> None:
        with self._lock:
            if self._told or self._held or not (self.records or self._failure):
                return
            self._told = True
        err = self._err or sys.stderr
        if self.records:
            print(f"warpdeck: something unexpected happened; details in {self.path}", file=err, flush=True)
        else:
            print(f"warpdeck: something unexpected happened, and {self.path} could not be written: "
                  f"{self._failure}", file=err, flush=True)

    @staticmethod
    def _thread_exception(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "?"
        log = logging.getLogger("warpdeck")
        if args.exc_value is None:  # the hook may be given a type alone: there is no traceback to log
            log.error("uncaught %s in thread %s", args.exc_type.__name__, name)
            return
        log.error("uncaught exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
