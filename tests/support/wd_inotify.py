"""Count renames into a directory as the kernel sees them (Linux inotify through ctypes).

The crash test uses it to prove each output was renamed into place exactly once across kills:
the count comes from the kernel, not from the process being killed, so a kill at any instant
cannot make it lie.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections import Counter
from pathlib import Path

IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")


class RenameWatch:
    """``counts[name]``: how many times a file was renamed into ``directory`` under ``name``."""

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(self.fd, os.fsencode(directory), IN_MOVED_TO) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"inotify_add_watch({directory}) failed")
        self.counts: Counter[str] = Counter()
        self.overflowed = False

    def poll(self) -> None:
        """Read every event queued so far (call often: the kernel's queue is bounded)."""
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            off = 0
            while off < len(buf):
                _, mask, _, length = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size: off + _EVENT.size + length].rstrip(b"\0").decode()
                if mask & IN_Q_OVERFLOW:
                    self.overflowed = True
                if mask & IN_MOVED_TO:
                    self.counts[name] += 1
                off += _EVENT.size + length

    def close(self) -> None:
        """Stop watching."""
        os.close(self.fd)


def assert_outputs_as_reference(out: Path, ref_out: Path, watch: RenameWatch, n: int) -> None:
    """``out`` holds the ``n`` outputs of an uninterrupted run's ``ref_out``, byte for byte, each
    renamed into place exactly once as ``watch`` saw it, and no temp file (a dot name) is left."""
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names == sorted(p.name for p in ref_out.iterdir() if not p.name.startswith(".")) and len(names) == n
    for name in names:
        assert (out / name).read_bytes() == (ref_out / name).read_bytes(), name
    assert not watch.overflowed
    twice = {name: c for name, c in watch.counts.items() if c != 1}
    assert not twice, f"outputs renamed into place more than once: {twice}"
    assert set(watch.counts) == set(names)
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp files left
