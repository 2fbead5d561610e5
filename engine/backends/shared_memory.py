"""Slot buffers in shared memory: host memory that worker processes write into directly.

The decisions this module protects:
- One copy from the source into the slot. A worker process attaches to the slot's buffer by name
  and writes its rows in place; nothing is pickled back. (A DataLoader makes three: the worker's
  tensor, the shared-memory transfer, the pin-memory copy.)
- Plain files on a memory file system (``/dev/shm``), one folder per arena, mapped with ``mmap``;
  not ``multiprocessing.shared_memory``, whose resource tracker unlinks a segment when any
  process that attached to it exits, and warns about segments it did not make.
- Nothing outlives its owner for long. The owner holds an exclusive ``flock`` on the folder's
  ``owner.lock`` for as long as the arena is open; the kernel lets go of it when the process ends,
  however it ends (a SIGKILL too). ``reap_stale`` removes every arena folder whose lock it can take:
  each new arena reaps what a killed run left before it makes its own.
- The CuPy backend page-locks these buffers for the device (``cudaHostRegister``), so h2d reads them
  directly. It must let go of them before they are unmapped: a buffer runs its ``on_close`` calls
  first (engine/backends/cupy_backend.py registers the unregister there).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import mmap
import os
import secrets
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["ARENA_PREFIX", "SharedArena", "SharedBuffer", "attach", "default_root", "memory_backed", "reap_stale"]

ARENA_PREFIX = "warpdeck-shm-"
"""Every arena's folder name starts with this (``reap_stale`` looks for nothing else)."""
_LOCK = "owner.lock"
_UNLOCKED_GRACE_S = 60.0
"""A folder with no lock file yet is another start making it, unless it is older than this."""


def default_root() -> Path:
    """Where arenas live: ``/dev/shm`` where it is a writable folder (Linux: memory, never disk),
    else the temporary folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


_MEMORY_FS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})
"""File systems whose files live in memory: a mapping of one can be page-locked for a device."""


def memory_backed(path: Path) -> bool | None:
    """Whether ``path`` is on a file system held in memory (tmpfs), by the mount that holds it in
    ``/proc/mounts``; None where that cannot be read (not Linux)."""
    try:
        lines = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    target = str(Path(path).resolve())
    best, fstype = "", ""
    for line in lines:
        fields = line.split()
        if len(fields) < 3:  # noqa: PLR2004 - device, mount point, type
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fstype = mount, fields[2]
    return fstype in _MEMORY_FS if best else None


class SharedBuffer:
    """One buffer of ``nbytes`` in an arena: ``array`` (uint8) maps the file ``path``, which another
    process maps with ``attach(path, nbytes)`` to write the same bytes."""

    def __init__(self, path: Path, nbytes: int) -> None:
        self.path = path
        self.nbytes = nbytes
        self._map = _map(path, nbytes, create=True)
        self.array: npt.NDArray[np.uint8] = np.frombuffer(self._map, np.uint8, nbytes)
        self.on_close: list[Callable[[], None]] = []
        """Called, last added first, before the memory is unmapped (the device lets go of it)."""

    @property
    def address(self) -> int:
        """The first byte's address in this process."""
        return int(self.array.ctypes.data)

    @property
    def closed(self) -> bool:
        return self._map.closed

    def close(self) -> None:
        """Let go of the memory: the ``on_close`` calls, then unmap (views still alive keep the
        mapping until they go; the file is removed with its arena)."""
        if self._map.closed:
            return
        while self.on_close:
            with contextlib.suppress(Exception):  # one failing release must not keep the rest
                self.on_close.pop()()
        self.array = np.empty(0, np.uint8)
        with contextlib.suppress(BufferError):  # a view still exported: the map goes with the last view
            self._map.close()


def _map(path: Path, nbytes: int, create: bool) -> mmap.mmap:
    flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if create:
            os.ftruncate(fd, max(nbytes, 1))
        elif os.fstat(fd).st_size < nbytes:
            raise ValueError(f"shared buffer {path} holds {os.fstat(fd).st_size} bytes, not {nbytes}")
        return mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def attach(path: str | os.PathLike[str], nbytes: int) -> npt.NDArray[np.uint8]:
    """Map an arena's buffer in this process (a worker): writes land in the owner's ``array``.
    The mapping lives as long as the returned array (and its views)."""
    m = _map(Path(path), nbytes, create=False)
    return np.frombuffer(m, np.uint8, nbytes)


class SharedArena:
    """A folder of shared buffers owned by this process; ``close`` removes it."""

    def __init__(self, root: Path | None = None, label: str = "") -> None:
        self.root = Path(root) if root is not None else default_root()
        self.reaped = reap_stale(self.root)
        tag = "".join(c if c.isalnum() else "-" for c in label)[:24]
        self.path = self.root / f"{ARENA_PREFIX}{tag + '-' if tag else ''}{os.getpid()}-{secrets.token_hex(4)}"
        self.path.mkdir(mode=0o700)
        self._lock_fd = os.open(self.path / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.set_inheritable(self._lock_fd, False)
        self._buffers: list[SharedBuffer] = []
        self._count = 0
        _OPEN.add(self)

    @property
    def nbytes(self) -> int:
        """Bytes held by the open buffers."""
        return sum(b.nbytes for b in self._buffers if not b.closed)

    @property
    def closed(self) -> bool:
        return self._lock_fd < 0

    def allocate(self, nbytes: int) -> SharedBuffer:
        """A new buffer of ``nbytes`` (zeroed: a fresh file reads as zeros)."""
        if self.closed:
            raise RuntimeError(f"shared arena {self.path} is closed")
        self._count += 1
        buf = SharedBuffer(self.path / f"buf-{self._count}", nbytes)
        self._buffers.append(buf)
        return buf

    def locate(self, arr: npt.NDArray[np.generic]) -> tuple[SharedBuffer, int] | None:
        """The open buffer that holds all of ``arr``'s bytes, one C-ordered piece of it, and where
        they start in it; None where ``arr`` is anywhere else (a copy, a strided view)."""
        if not arr.flags.c_contiguous:
            return None
        start = int(arr.ctypes.data)
        for b in self._buffers:
            if not b.closed and b.address <= start and start + arr.nbytes <= b.address + b.nbytes:
                return b, start - b.address
        return None

    def release(self, buf: SharedBuffer) -> None:
        """Close one buffer and remove its file (a slot that grew lets go of its old buffer)."""
        buf.close()
        with contextlib.suppress(FileNotFoundError):
            buf.path.unlink()
        with contextlib.suppress(ValueError):
            self._buffers.remove(buf)

    def close(self) -> None:
        """Close every buffer and remove the folder; safe to call twice."""
        if self.closed:
            return
        for b in reversed(self._buffers):
            b.close()
        self._buffers.clear()
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = -1

    def __enter__(self) -> SharedArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_OPEN: weakref.WeakSet[SharedArena] = weakref.WeakSet()
"""Arenas not closed yet: closed at interpreter exit, so a process that ends normally leaves none behind even where an
owner forgot (a SIGKILL is for ``reap_stale``)."""


@atexit.register
def _close_open() -> None:
    for arena in list(_OPEN):
        with contextlib.suppress(Exception):
            arena.close()


def reap_stale(root: Path | None = None) -> list[Path]:
    """Remove the arena folders under ``root`` whose owner is gone (their lock is free); the folders
    removed. A live owner's arena, this process's included, is left alone."""
    root = Path(root) if root is not None else default_root()
    reaped: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(ARENA_PREFIX) and p.is_dir()]
    except OSError:
        return reaped
    for folder in candidates:
        try:
            fd = os.open(folder / _LOCK, os.O_RDWR)
        except FileNotFoundError:
            # Made and not yet locked (a start racing this one), or half removed: only a folder
            # older than a minute is taken for abandoned.
            with contextlib.suppress(OSError):
                if _age_s(folder) > _UNLOCKED_GRACE_S:
                    shutil.rmtree(folder, ignore_errors=True)
                    reaped.append(folder)
            continue
        except OSError:
            continue  # another user's arena, or unreadable: not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its owner lives
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        reaped.append(folder)
    return reaped


def _age_s(path: Path) -> float:
    return time.time() - path.stat().st_mtime
