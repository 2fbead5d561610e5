"""Opening an input file: the file, or an ``InputError`` naming why it cannot be one.

The decision this module protects: a path that is gone, unreadable or not a regular file (a FIFO,
a directory, a device) fails its task alone, never blocks a fill (a FIFO is opened non-blocking)
and never stops the run. It imports nothing of the spec, so a fill worker process that opens
files pays only for what it decodes (engine/edges/image_decode.py).
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

from warpdeck.engine.edges.input_errors import InputError

__all__ = ["open_regular"]


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


def open_regular(path: Path) -> io.BufferedReader:
    """``path`` opened for reading, or an InputError: gone, unreadable, or not a regular file.
    Non-blocking, so opening a FIFO returns at once and is then refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(str(path), "no such file (removed after the directory was listed, "
                                    "or a link to nothing)") from None
    except OSError as exc:
        raise InputError(str(path), f"unreadable: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise InputError(str(path), f"not a regular file ({_file_kind(mode)})")
    return os.fdopen(fd, "rb")
