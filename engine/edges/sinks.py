"""Where results go: ``.npy`` files committed atomically, a Python callable, or nowhere.

The decision this module protects: an output file either exists whole under its task's key or
not at all. It is written to a temporary name in the same directory and renamed into place, so
a crash never leaves a partial output and a re-run overwrites instead of duplicating.

A sink may also have ``write_batch(keys, outputs)`` (the Parquet sink, ``parquet_sink.py``; a
callable sink given ``write_batch``): a batch's outputs in one call, all durable when it returns,
or none (it raises, failing them all). The lanes call it instead of ``write`` per key where the
sink, and every wrapper around it, has it (``batch_writer``): the smallest extension that lets a
sink commit whole batches. So a sink that writes key by key has no ``write_batch`` at all, not one
of None.

A sink may instead have ``write_rows(keys, outputs)``, a batch in one call answered row by row: each
output's error (or None) in its place, so one bad output fails its task alone. The lanes' sink in
worker processes has it (engine/run/process_sink.py): a worker writes the whole batch, key by key
or with ``write_batch`` as the sink itself does, and says how each went. The sink wrappers pass it on
(``rows_writer``), as they do ``write_batch``.

A sink on storage other processes see (npy_dir, Parquet, null) may also split a write in two
(``StagingSink``): ``stage`` writes a batch's outputs under temp names of one attempt (``tag``) on
whatever machine computed them, ``commit`` renames them into place where the run is journaled.
Ray actors stage; the engine commits only what its epoch fence lets through, so an attempt it gave
up on leaves temp files, never outputs.

A durable sink keeps a checksum of every output it lands (CRC-32), so a resume trusts an output the
journal never recorded done only if it still matches: the npy sink takes the CRC of each file's
bytes as it writes them and appends ``key<TAB>crc`` to ``.warpdeck-checksums`` in its directory
before the rename (a staged write carries the crc in its temp name), and a finished run removes
that file; the Parquet sink keeps each row's CRC (of its values' bytes) in the part's metadata. An output
that does not match (or has no checksum: written by an older warpdeck) is removed, and its task runs
again.
"""

from __future__ import annotations

import os
import re
import threading
import zlib
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.config import CallableSink, NpyDirSink, NullSink, ParquetSink, resolve_target
from warpdeck.engine.edges.sources import SAFE_KEY

__all__ = [
    "CHECKSUMS",
    "TMP_SUFFIX",
    "BatchWriter",
    "CallableBatchSinkImpl",
    "CallableSinkImpl",
    "DurableSink",
    "NpyDirSinkImpl",
    "NullSinkImpl",
    "PartNumbers",
    "RowsWriter",
    "Sink",
    "Staged",
    "StagingSink",
    "batch_writer",
    "open_sink",
    "open_tmp",
    "rejected_outputs",
    "rows_writer",
    "settle",
    "sink_describes",
]

TMP_SUFFIX = ".tmp"
CHECKSUMS = ".warpdeck-checksums"
"""The npy sink's record of each landed output's checksum, in its directory."""
_CRC_DIGITS = 8


def open_tmp(tmp: Path) -> BinaryIO:
    """Open a sink's temp file for writing, making its directory at the first write: a disk that
    refuses the directory then fails a write (an outage), not the run's start."""
    try:
        return tmp.open("wb")
    except FileNotFoundError:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        return tmp.open("wb")


class PartNumbers:
    """The numbers of a sink's numbered files (``part-00000.parquet``, ``partial-00000.npz``): each
    taken once, from any sink thread, continuing after the highest already in the directory (looked
    at on the first take, under the run directory's lock), so a resumed run never reuses one."""

    def __init__(self, directory: Path, name: re.Pattern[str]) -> None:
        self._dir = directory
        self._name = name
        """Matches a numbered file's name; its first group is the number."""
        self._lock = threading.Lock()
        self._next: int | None = None

    def take(self) -> int:
        """The next free number."""
        with self._lock:
            if self._next is None:
                found = [int(m[1]) for p in self._dir.iterdir() if (m := self._name.match(p.name))]
                self._next = max(found, default=-1) + 1
            number = self._next
            self._next += 1
            return number


class Sink(Protocol):
    """Receives each finished task's output (only valid during the call)."""

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        """Store one output; raise to fail the task."""
        ...


BatchWriter = Callable[[Sequence[str], npt.NDArray[Any]], None]
"""A sink's ``write_batch``: every output of a batch durable when it returns, or none (it raises)."""


def batch_writer(sink: Sink) -> BatchWriter | None:
    """The sink's ``write_batch``, or None when it (or a wrapper around it) writes key by key."""
    return getattr(sink, "write_batch", None)


RowsWriter = Callable[[Sequence[str], npt.NDArray[Any]], list[BaseException | None]]
"""A sink's ``write_rows``: a batch's outputs in one call; each output's error (or None) in its place."""


def rows_writer(sink: Sink) -> RowsWriter | None:
    """The sink's ``write_rows``, or None where it (or a wrapper around it) has none."""
    return getattr(sink, "write_rows", None)


class _PlainWriter:
    """Only ``write``: numpy then writes through Python's file object, whose OSError carries the
    errno (ENOSPC, EDQUOT...). Handed a real file, numpy takes its ``tofile`` path, which on a full
    disk raises a bare "2048 requested and 496 written" with no errno and no reason a user can act on.
    Keeps the CRC-32 of every byte written (``crc``), while each chunk is still in cache."""

    __slots__ = ("_write", "crc")

    def __init__(self, f: BinaryIO) -> None:
        self._write = f.write
        self.crc = 0

    def write(self, data: bytes) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self._write(data)


@runtime_checkable
class DurableSink(Protocol):
    """A sink that can say whether an output is already in place and clean up after a crash;
    with it a resumed run writes each output exactly once."""

    def committed(self, key: str) -> bool:
        """Whether ``key``'s output exists whole. Asked only of tasks the journal does not show
        done; a sink that keeps checksums (``rejected``) checks the output against its own and
        removes one that does not match, answering False."""
        ...

    def clean_temps(self) -> int:
        """Remove partial writes left by a killed run; returns how many."""
        ...


def rejected_outputs(sink: Sink) -> int:
    """Outputs a durable sink found in place but could not verify, and removed (0 for a sink that
    does not check)."""
    return int(getattr(sink, "rejected", 0))


def settle(sink: Sink) -> None:
    """The run finished and its journal holds every output: a sink may drop what it kept only for
    checking a resume (``settle``, where it has one)."""
    done = getattr(sink, "settle", None)
    if done is not None:
        done()


Staged = tuple[str, ...]
"""The temp files one attempt staged, as names in the sink's directory."""


@runtime_checkable
class StagingSink(Protocol):
    """A sink whose writes can be staged by one process and committed by another."""

    def stage(self, keys: Sequence[str], outs: npt.NDArray[Any], tag: str) -> Staged:
        """Write ``outs[j]`` for ``keys[j]`` under temp names of attempt ``tag``; nothing lands.
        Raises (leaving nothing) when any of it fails."""
        ...

    def commit(self, keys: Sequence[str], staged: Staged, drop: Collection[str] = ()) -> None:
        """Put what ``stage`` wrote for ``keys`` in place, less the outputs of ``drop`` (removed)."""
        ...


class NpyDirSinkImpl:
    """``<dir>/<key>.npy`` through ``.<key>.npy.<pid>.tmp`` and ``os.replace``; each file's checksum
    appended to ``<dir>/.warpdeck-checksums`` before its rename."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._sums: dict[str, int] | None = None
        """Each logged key's checksum, read at the first output a resume has to check."""
        self._checked: dict[str, bool] = {}
        self.rejected = 0
        """Outputs found in place that did not match their checksum (or had none), and were removed."""

    def path(self, key: str) -> Path:
        """Where ``key``'s output lands."""
        return self.dir / f"{key}.npy"

    def describe(self, key: str) -> str:
        """Where ``key``'s output lands, in words."""
        return f"written to {self.path(key)}"

    def committed(self, key: str) -> bool:
        """Whether ``key``'s output is in place and its file's bytes match the checksum taken as
        they were written. The rename is atomic, so an output that exists is whole; the checksum
        says no byte changed since. One that does not match is removed: its task runs again."""
        with self._lock:
            known = self._checked.get(key)
            if known is not None:
                return known
            p = self.path(key)
            ok = p.is_file()
            if ok and not self._matches(key, p):
                p.unlink(missing_ok=True)
                self.rejected += 1
                ok = False
            self._checked[key] = ok
            return ok

    def _matches(self, key: str, p: Path) -> bool:
        if self._sums is None:
            self._sums = _read_sums(self.dir / CHECKSUMS)
        want = self._sums.get(key)
        if want is None:
            return False
        try:
            return zlib.crc32(p.read_bytes()) == want
        except OSError:
            return False

    def settle(self) -> None:
        """Every output is journaled: the checksums are no longer needed."""
        (self.dir / CHECKSUMS).unlink(missing_ok=True)

    def clean_temps(self) -> int:
        """Remove temp files a killed run left behind; returns how many. Call only while no
        engine writes here (the journal's run-directory lock)."""
        n = 0
        if not self.dir.is_dir():
            return 0
        for p in self.dir.glob(f".*.npy.*{TMP_SUFFIX}"):
            p.unlink(missing_ok=True)
            n += 1
        return n

    def _tmp(self, key: str, tag: str) -> Path:
        if not SAFE_KEY.match(key) or key.startswith("."):
            raise ValueError(f"task key {key!r} cannot name an output file")
        return self.dir / f".{key}.npy.{tag}{TMP_SUFFIX}"

    def _write_tmp(self, tmp: Path, out: npt.NDArray[Any]) -> int:
        """Write ``out`` to ``tmp``; the CRC-32 of the file's bytes."""
        try:
            with open_tmp(tmp) as f:
                writer = _PlainWriter(f)
                np.lib.format.write_array(writer, np.ascontiguousarray(out), allow_pickle=False)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return writer.crc

    def _log(self, sums: Sequence[tuple[str, int]]) -> None:
        """Append the checksums of outputs about to be renamed into place (one ``write``)."""
        # Opened for each append (1.7 us against 0.5 for a write alone): no descriptor stays open on
        # the outputs' disk between writes, which would keep it from being remounted.
        fd = os.open(self.dir / CHECKSUMS, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, "".join(f"{key}\t{crc:08x}\n" for key, crc in sums).encode())
        finally:
            os.close(fd)

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        tmp = self._tmp(key, str(self._pid))
        crc = self._write_tmp(tmp, out)
        try:
            self._log([(key, crc)])
            tmp.replace(self.path(key))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def stage(self, keys: Sequence[str], outs: npt.NDArray[Any], tag: str) -> Staged:
        """Each output to ``.<key>.npy.<tag>-<crc>.tmp``, not renamed (``commit`` does that, and
        logs the checksum the name carries)."""
        names: list[str] = []
        try:
            for j, key in enumerate(keys):
                tmp = self._tmp(key, tag)
                crc = self._write_tmp(tmp, outs[j])
                named = tmp.with_name(f"{tmp.name.removesuffix(TMP_SUFFIX)}-{crc:08x}{TMP_SUFFIX}")
                tmp.replace(named)
                names.append(named.name)
        except BaseException:
            for name in names:
                (self.dir / name).unlink(missing_ok=True)
            raise
        return tuple(names)

    def commit(self, keys: Sequence[str], staged: Staged, drop: Collection[str] = ()) -> None:
        """Rename each staged output to ``<key>.npy`` (atomic), removing those of ``drop``."""
        kept = [(key, name) for key, name in zip(keys, staged, strict=True) if key not in drop]
        for key, name in zip(keys, staged, strict=True):
            if key in drop:
                (self.dir / name).unlink(missing_ok=True)
        if kept:
            self._log([(key, int(name.removesuffix(TMP_SUFFIX).rsplit("-", 1)[1], 16)) for key, name in kept])
        for key, name in kept:
            (self.dir / name).replace(self.path(key))


def _read_sums(path: Path) -> dict[str, int]:
    """``key<TAB>crc`` lines, the last for a key winning; a line cut short by a crash is skipped."""
    sums: dict[str, int] = {}
    try:
        text = path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return sums
    for line in text.splitlines():
        key, _, crc = line.partition("\t")
        if len(crc) == _CRC_DIGITS:
            try:
                sums[key] = int(crc, 16)
            except ValueError:
                continue
    return sums


def _named(fn: Callable[..., Any]) -> str:
    """``fn`` as a spec's target names it (``module:function``)."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}:{name}"


class CallableSinkImpl:
    """Calls ``fn(key, array)``."""

    def __init__(self, fn: Callable[[str, npt.NDArray[Any]], Any]) -> None:
        self._fn = fn

    def describe(self, key: str) -> str:
        """The callable each output is handed to, named as a spec's target names it."""
        return f"handed to {_named(self._fn)}"

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        self._fn(key, out)


class CallableBatchSinkImpl:
    """Calls ``whole(keys, outputs)`` once per batch (``write_batch``: the lanes find it with
    ``batch_writer``); a lone output goes to ``fn(key, array)`` where given, else to ``whole`` as a
    batch of one. A separate class, not a ``write_batch`` of None on ``CallableSinkImpl``: a sink
    that writes key by key must not have the attribute at all."""

    def __init__(self, whole: Callable[[Sequence[str], npt.NDArray[Any]], Any],
                 fn: Callable[[str, npt.NDArray[Any]], Any] | None = None) -> None:
        self._whole = whole
        self._fn = fn

    def describe(self, key: str) -> str:
        """The callable each batch's outputs are handed to, named as a spec's target names it."""
        return f"handed to {_named(self._whole)}"

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        if self._fn is not None:
            self._fn(key, out)
        else:
            self._whole([key], out[np.newaxis])

    def write_batch(self, keys: Sequence[str], outputs: npt.NDArray[Any]) -> None:
        """Every output of the batch in one call: all durable when it returns, or none (it raises)."""
        self._whole(keys, outputs)


class NullSinkImpl:
    """Drops every output."""

    def describe(self, key: str) -> str:
        """Nowhere: the output is dropped."""
        return "discarded (null sink)"

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        pass

    def stage(self, keys: Sequence[str], outs: npt.NDArray[Any], tag: str) -> Staged:
        return ()

    def commit(self, keys: Sequence[str], staged: Staged, drop: Collection[str] = ()) -> None:
        pass


def open_sink(spec: NpyDirSink | ParquetSink | CallableSink | NullSink, run_dir: Path) -> Sink:
    """The sink a spec section describes; relative directories resolve inside ``run_dir``."""
    if isinstance(spec, NpyDirSink):
        return NpyDirSinkImpl(spec.path if spec.path.is_absolute() else run_dir / spec.path)
    if isinstance(spec, ParquetSink):
        # pyarrow is optional (warpdeck[parquet]): imported only by a run that writes Parquet.
        from warpdeck.engine.edges.parquet_sink import ParquetSinkImpl  # noqa: PLC0415

        return ParquetSinkImpl(spec.path if spec.path.is_absolute() else run_dir / spec.path, spec.row_group_size)
    if isinstance(spec, CallableSink):
        fn = resolve_target(spec.target) if spec.target is not None else None
        if spec.write_batch is not None:
            return CallableBatchSinkImpl(resolve_target(spec.write_batch), fn)
        assert fn is not None  # the spec refuses a callable sink with neither
        return CallableSinkImpl(fn)
    return NullSinkImpl()


def sink_describes(sink: Sink, key: str) -> str:
    """Where ``key``'s output goes, in words; for a sink without a ``describe`` method, its class."""
    ask = getattr(sink, "describe", None)
    return str(ask(key)) if ask is not None else f"handed to {type(sink).__qualname__}.write"
