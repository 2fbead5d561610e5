"""A reduce step's sink: each batch folded by the step's reducer into a partial file of its own, renamed
into place whole, so a done task in the journal always has its share in exactly one partial and a
resumed run folds no output twice.

The decisions this module protects:
- Exactly once, the Parquet sink's way (``parquet_sink.py``): ``write_batch`` folds the batch
  (``combine(None, batch)``) and writes its keys and the accumulator to
  ``.partial-staged.npz.<pid>-<n>.tmp``, renamed to ``partial-NNNNN.npz`` before it returns; the
  engine records the tasks done only after that. A kill between the rename and the journal's commit
  leaves a partial whose tasks the journal does not show done: ``committed`` answers from the keys of
  the partials present when the run began (read in ``clean_temps``), so those tasks are recorded done
  and neither run nor folded again, but only once the partial matches the checksum it keeps
  (``__crc__``: CRC-32 over its keys and accumulator arrays, taken from the arrays ``combine``
  returned before they were encoded, so an array that changed under the write does not match). A
  partial that does not match is removed and its tasks run again; so is one whose keys cannot even be
  read (truncated, not a zip), which is counted by name only (``rejected_parts``). A kill before the
  rename leaves only a temp file, removed at the next start.
- A partial is checked when a resume first asks about one of its keys, as a Parquet part is, not
  when the run opens: the journal records a batch's tasks done together, so a partial asked about
  holds no task the journal shows done, and removing it loses nothing. A partial of recorded tasks
  that fails its checksum stays, and ``partials`` refuses it (``BadPartial``) instead of the result
  silently lacking those tasks.
- One file per batch, never appended to nor rewritten: a partial holds one batch's keys and the
  accumulator of exactly those outputs, so no write can put a batch's values under another batch's
  keys (what a SIGTERM once did to a Parquet part, through a buffer freed under a sink thread:
  engine/run/lanes.py). Nothing of the batch outlives the call: the accumulator is written out
  before ``write_batch`` returns and the outputs' buffer goes back to its lane.
- Merging is the step runner's: ``partials`` hands back every landed accumulator in part order, and
  refuses a key held by two partials (``KeyFoldedTwice``): merged, it would be counted twice.
- No fsync, as the npy and Parquet sinks: a killed process leaves its written pages to the kernel,
  so a renamed partial is whole; an OS crash may lose the last partials as it may lose the journal's
  last commits (``synchronous=NORMAL``), and ``covered`` against the tasks done tells the step.
- Part numbers continue after the highest already in the directory (found at the first write, under
  the sink's lock), so a resumed run never overwrites an earlier run's partial.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import re
import threading
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from warpdeck.engine.edges.sinks import TMP_SUFFIX, PartNumbers, open_tmp

__all__ = ["ACC_PREFIX", "CRC_NAME", "KEYS_NAME", "PARTIAL_GLOB", "Acc", "BadPartial", "Combines",
           "KeyFoldedTwice", "ReduceSinkImpl", "read_partial"]

Acc = dict[str, npt.NDArray[Any]]
"""An accumulator: named arrays, saveable with ``np.savez`` (the reducers' ``Acc``)."""

PARTIAL_GLOB = "partial-*.npz"
_PARTIAL = re.compile(r"^partial-(\d+)\.npz$")
_TMP_GLOB = f".partial-*.npz.*{TMP_SUFFIX}"
KEYS_NAME = "__keys__"
"""The partial's member holding its batch's keys, a 1-D unicode array."""
CRC_NAME = "__crc__"
"""The partial's member holding its checksum, a 0-d uint32 (``_checksum``)."""
ACC_PREFIX = "acc."
"""Prefixes each accumulator array's name in a partial, so no name of the reducer's meets a reserved one."""
_UNREADABLE = (OSError, ValueError, KeyError, EOFError, RuntimeError, zipfile.BadZipFile)
"""What numpy and zipfile raise on a damaged zip of arrays: a bad CRC, a cut-short member, a garbled
header; a flag bit flipped reads as encryption or an unknown compression (RuntimeError)."""


class Combines(Protocol):
    """What the sink needs of a reducer (``engine/state/reducers.py``'s ``Reducer`` has it)."""

    def combine(self, acc: Acc | None, batch: npt.NDArray[Any]) -> Acc:
        """``acc`` (None: a fresh one) with every output of ``batch`` (``(n, *task_shape)``) folded in."""
        ...


class BadPartial(ValueError):
    """The partial at ``path`` cannot be used: unreadable, truncated, not shaped as this sink writes
    them, or not matching its checksum (``reason``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        """The partial file."""
        self.reason = reason
        """What is wrong with it, in words."""

    def __reduce__(self) -> tuple[type[BadPartial], tuple[str, str]]:
        # Errors cross process boundaries (Ray actors): keep both fields.
        return (BadPartial, (self.path, self.reason))


class KeyFoldedTwice(ValueError):
    """Task ``key`` is held by two partials (``first`` and ``second``): merging them would count its
    output twice. The sink never writes that; a partial copied in by hand can."""

    def __init__(self, key: str, first: str, second: str) -> None:
        super().__init__(f"task {key!r} is folded into both {first} and {second}: merged, it would count"
                         " twice; remove the partial that should not be there")
        self.key = key
        """The task held twice."""
        self.first = first
        """The partial (lower part number) that holds it first."""
        self.second = second
        """The other partial that holds it."""

    def __reduce__(self) -> tuple[type[KeyFoldedTwice], tuple[str, str, str]]:
        return (KeyFoldedTwice, (self.key, self.first, self.second))


def _bytes_of(arr: npt.NDArray[Any]) -> memoryview:
    """``arr``'s values in C order as bytes, without copying a contiguous array (datetimes included,
    which export no buffer of their own)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    return flat.view(np.uint8).data if flat.dtype.itemsize else memoryview(b"")


def _checksum(keys: npt.NDArray[Any], acc: Mapping[str, npt.NDArray[Any]]) -> int:
    """CRC-32 over the keys, then each accumulator array in name order: each one's name, dtype and
    shape as well as its bytes, so an array renamed, retyped or reshaped does not match either."""
    crc = 0
    for name, arr in [(KEYS_NAME, keys), *sorted(acc.items(), key=operator.itemgetter(0))]:
        crc = zlib.crc32(f"{name}\0{arr.dtype.str}\0{arr.shape}\0".encode(), crc)
        crc = zlib.crc32(_bytes_of(arr), crc)
    return crc


def _members(keys: Sequence[str], acc: Acc) -> dict[str, npt.NDArray[Any]]:
    """The partial's members for ``keys`` and ``acc``, checksum included; raises when the
    accumulator cannot be saved and read back as it is."""
    names = np.array(list(keys), dtype=np.str_)
    if names.tolist() != list(keys):  # a non-string key, or one numpy's strings cut (trailing NULs)
        raise ValueError(f"task keys {list(keys)[:5]!r} do not survive a unicode array")
    arrays: dict[str, npt.NDArray[Any]] = {}
    for name, value in acc.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"the reducer's accumulator names an array {name!r}: names are non-empty strings")
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            raise TypeError(f"the reducer's accumulator array {name!r} holds Python objects ({arr.dtype}),"
                            " which a partial cannot keep without pickle")
        arrays[name] = arr
    return {KEYS_NAME: names, CRC_NAME: np.asarray(_checksum(names, arrays), np.uint32),
            **{ACC_PREFIX + name: arr for name, arr in arrays.items()}}


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    """The partial at ``path`` as numpy's lazy ``NpzFile``; ``BadPartial`` when it is not a zip of arrays."""
    # Opened here, not by numpy: given a path to a file that is no zip, np.load leaves it open.
    with path.open("rb") as f:
        try:
            z = np.load(f, allow_pickle=False)
        except _UNREADABLE as exc:
            raise BadPartial(str(path), f"cannot be read ({exc})") from exc
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise BadPartial(str(path), "holds a single array, not a partial")
        with z:
            yield z


def _keys_from(z: Any, path: Path) -> npt.NDArray[Any]:
    """The keys member of the open partial ``z``."""
    keys = z[KEYS_NAME]
    if keys.ndim != 1 or keys.dtype.kind != "U":
        raise BadPartial(str(path), f"its keys are {keys.dtype} of shape {keys.shape}, not a 1-D unicode array")
    return keys  # type: ignore[no-any-return]


def _read_keys(path: Path) -> tuple[str, ...]:
    """The keys the partial at ``path`` holds, read without its accumulator nor checking it."""
    try:
        with _open(path) as z:
            return tuple(_keys_from(z, path).tolist())
    except BadPartial:
        raise
    except _UNREADABLE as exc:
        raise BadPartial(str(path), f"its keys cannot be read ({exc})") from exc


def read_partial(path: Path) -> tuple[tuple[str, ...], Acc]:
    """The keys and accumulator of the partial at ``path``, once it matches its checksum; raises
    ``BadPartial`` saying why not."""
    try:
        with _open(path) as z:
            keys = _keys_from(z, path)
            crc = z[CRC_NAME]
            acc = {name.removeprefix(ACC_PREFIX): z[name] for name in z.files if name.startswith(ACC_PREFIX)}
            stray = sorted(set(z.files) - {KEYS_NAME, CRC_NAME} - {ACC_PREFIX + name for name in acc})
    except BadPartial:
        raise
    except _UNREADABLE as exc:
        raise BadPartial(str(path), f"cannot be read ({exc})") from exc
    if stray:
        raise BadPartial(str(path), f"holds arrays no partial has: {stray}")
    if crc.shape != () or crc.dtype.kind not in "ui":
        raise BadPartial(str(path), f"its checksum is {crc.dtype} of shape {crc.shape}, not one integer")
    if int(crc) != _checksum(keys, acc):
        raise BadPartial(str(path), "does not match its checksum")
    if len(set(keys.tolist())) < len(keys):
        raise BadPartial(str(path), "names a task twice: merged, its output would count twice")
    return tuple(keys.tolist()), acc


def _number(path: Path) -> int:
    """The part number in a partial's name (names past 99999 have more digits, so never sort by name)."""
    m = _PARTIAL.match(path.name)
    assert m is not None
    return int(m[1])


class ReduceSinkImpl:
    """``<dir>/partial-NNNNN.npz`` through ``.partial-staged.npz.<pid>-<n>.tmp`` and ``os.replace``,
    one per batch, each holding the batch's keys and ``reducer.combine(None, batch)``."""

    def __init__(self, directory: Path, reducer: Combines) -> None:
        self.dir = directory
        self.reducer = reducer
        self._pid = os.getpid()
        self._calls = itertools.count()
        """Numbers this process's own writes' temp names (sink threads write at once)."""
        self._lock = threading.Lock()
        self._numbers = PartNumbers(directory, _PARTIAL)
        self._part_of: dict[str, Path] | None = None
        """The partial each landed key is in (present when the run began), once read."""
        self._keys_of: dict[Path, tuple[str, ...]] = {}
        self._checked: dict[Path, bool] = {}
        """What checking each landed partial against its checksum found."""
        self.rejected = 0
        """Landed outputs (keys) whose partial did not match its checksum, removed with their partial:
        their tasks run again. The keys of a partial that could not be read are unknown and not counted
        here; ``rejected_parts`` names every partial removed."""
        self.rejected_parts: list[str] = []
        """The names of the partials removed as unusable, in the order found."""

    def describe(self, key: str) -> str:
        """Where ``key``'s output goes, in words."""
        name = getattr(self.reducer, "name", None) or type(self.reducer).__qualname__
        return f"folded by the reducer {name!r} into a partial-NNNNN.npz in {self.dir} (key {key!r})"

    def _paths(self) -> list[Path]:
        """The partials now in the directory, in part-number order."""
        if not self.dir.is_dir():
            return []
        return sorted((p for p in self.dir.glob(PARTIAL_GLOB) if _PARTIAL.match(p.name)), key=_number)

    def _scan(self) -> dict[str, Path]:
        """Read the landed partials' keys (under the lock); one whose keys cannot be read is removed."""
        part_of: dict[str, Path] = {}
        self._keys_of = {}
        for p in self._paths():
            try:
                keys = _read_keys(p)
            except BadPartial:
                p.unlink(missing_ok=True)
                self.rejected_parts.append(p.name)
                continue
            self._keys_of[p] = keys
            for k in keys:
                part_of[k] = p
        self._part_of = part_of
        return part_of

    def committed(self, key: str) -> bool:
        """Whether a partial holds ``key``'s output, matching its checksum: the keys of the partials
        present when the run began (read once). The rename is atomic, so a partial that exists is
        whole; one that does not match is removed (its tasks run again)."""
        with self._lock:
            part_of = self._part_of if self._part_of is not None else self._scan()
            part = part_of.get(key)
            if part is None:
                return False
            ok = self._checked.get(part)
            if ok is None:
                try:
                    read_partial(part)
                    ok = True
                except BadPartial:
                    ok = False
                self._checked[part] = ok
                if not ok:
                    gone = self._keys_of.pop(part, ())
                    for k in gone:
                        if part_of.get(k) == part:
                            del part_of[k]
                    self.rejected += len(gone)
                    self.rejected_parts.append(part.name)
                    part.unlink(missing_ok=True)
            return ok

    def clean_temps(self) -> int:
        """Remove temp files a killed run left behind and read the landed partials' keys; returns how
        many temps. Call only while no engine writes here (the journal's run-directory lock)."""
        n = 0
        if self.dir.is_dir():
            for p in self.dir.glob(_TMP_GLOB):
                p.unlink(missing_ok=True)
                n += 1
        with self._lock:
            self._scan()
        return n

    def write(self, key: str, out: npt.NDArray[Any]) -> None:
        """One output as a partial of its own (callers that hold whole batches use ``write_batch``)."""
        self.write_batch([key], out[np.newaxis])

    def write_batch(self, keys: Sequence[str], outputs: npt.NDArray[Any]) -> None:
        """Fold ``outputs[:len(keys)]`` (row j is ``keys[j]``'s output) into one partial, renamed into
        place before returning; raises (and leaves nothing) when any of it fails, the reducer's
        ``combine`` included. No keys, no partial."""
        if not keys:
            return
        if len(outputs) < len(keys):
            raise ValueError(f"{len(keys)} keys for {len(outputs)} outputs")
        if len(set(keys)) < len(keys):
            raise ValueError("a batch names a task twice: its output would be folded twice")
        members = _members(keys, self.reducer.combine(None, outputs[: len(keys)]))
        tmp = self.dir / f".partial-staged.npz.{self._pid}-{next(self._calls)}{TMP_SUFFIX}"
        try:
            # Through a Python file: a full disk raises OSError with its errno (an outage, not a failure).
            with open_tmp(tmp) as f:
                np.savez(f, allow_pickle=False, **members)
            tmp.replace(self.dir / f"partial-{self._numbers.take():05d}.npz")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _landed(self) -> list[tuple[Path, tuple[str, ...], Acc]]:
        """Every partial now in the directory, read and checked, in part-number order."""
        return [(p, *read_partial(p)) for p in self._paths()]

    def partials(self) -> list[Acc]:
        """Every landed partial's accumulator (names without ``ACC_PREFIX``), checked, in part-number
        order, for the step to merge. Raises ``BadPartial`` for one that does not match its checksum
        (left in place: its tasks may be recorded done) and ``KeyFoldedTwice`` for a key in two."""
        return self.landed()[0]

    def covered(self) -> int:
        """How many outputs the landed partials hold (the sum over the partials, each checked): the
        step compares it with the tasks its journal shows done."""
        return sum(len(keys) for _, keys, _ in self._landed())

    def landed(self) -> tuple[list[Acc], int]:
        """``partials()`` and ``covered()`` at once, each file read once (the step's end reads both)."""
        landed = self._landed()
        total = sum(len(keys) for _, keys, _ in landed)
        if len(set().union(*(keys for _, keys, _ in landed))) != total:  # the files are looked at only to name them
            seen: dict[str, Path] = {}
            for path, keys, _ in landed:
                for k in keys:
                    first = seen.setdefault(k, path)
                    if first is not path:
                        raise KeyFoldedTwice(k, first.name, path.name)
        return [acc for _, _, acc in landed], total
