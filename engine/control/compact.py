"""Compact forms for telemetry: batch records as arrays, key samples as runs.

The decisions this module protects:
- A telemetry frame must cross a 1 Mbit/s link four times a second (DESIGN.md section 9: at most
  16 KB at 1 M tasks and 10 k transitions/s), so what repeats in it is written once. A batch record
  is an array, not an object, its times whole microseconds; a board column's keys are runs: a key
  whose last number is one more than the key before it (``img-0000124`` after ``img-0000123``) is
  counted, not written. A source that numbers its keys (files, chunks, shards) fills every live
  column with such runs; keys that do not follow one another are written out, as before.
- Both forms round-trip: ``unpack_record(pack_record(r, t0))`` is ``r`` with its times made
  relative to ``t0`` (to the microsecond), and ``expand_keys(key_runs(keys)) == keys``.
- Times become relative to the engine's start: an attached control room has no use for the
  engine's ``perf_counter``, and its timeline is drawn against the snapshot's ``t`` (seconds since
  the engine started), which these times now share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

from pydantic import Field

from warpdeck.engine.state.records import BatchRecord

__all__ = [
    "MAX_COLUMN_KEYS",
    "MAX_RUN",
    "ColumnItem",
    "ColumnName",
    "PackedRecord",
    "expand_keys",
    "key_runs",
    "pack_record",
    "run_length",
    "successor",
    "unpack_record",
]

MAX_RUN = 100_000
"""The longest run one number may stand for (a column sample is far shorter)."""
MAX_COLUMN_KEYS = 1000
"""Keys one board column's sample may stand for on the wire."""
ColumnName = Literal["queued", "fill", "h2d", "compute", "d2h", "sink", "stalled", "done", "failed", "cancelled"]
"""Board columns telemetry samples: the board's, with done, failed and cancelled apart."""
_US = 1_000_000
_Key = Annotated[str, Field(max_length=4096)]
ColumnItem = _Key | Annotated[int, Field(ge=1, le=MAX_RUN)]
"""One item of a column's runs on the wire: a key, or how many successors follow the key before it."""
_Micros = Annotated[int, Field(ge=-(2**53), le=2**53)]
PackedRecord = tuple[
    Annotated[int, Field(ge=-1)], Annotated[int, Field(ge=-1)], Annotated[int, Field(ge=-1)],
    Annotated[int, Field(ge=0)], _Key, bool, Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)], _Micros,
    Annotated[tuple[_Micros | None, ...], Field(max_length=32)],
    Annotated[tuple[Annotated[int, Field(ge=0, le=2**53)], ...], Field(max_length=16)],
]
"""A batch record on the wire: ``[batch, lane, slot, tasks, key, ok, nbytes, out_nbytes, formed, phases, cpu]``
(``nbytes`` the batch's inputs, ``out_nbytes`` its outputs). ``formed`` is microseconds since the engine started;
``phases`` holds each phase's start and end in microseconds since ``formed`` (both null for a phase the batch never
reached); ``cpu`` each phase's CPU microseconds (empty when not measured)."""
_LAST_NUMBER = re.compile(r"(\d+)(\D*)\Z")
"""The last run of digits in a key, and what follows it."""


def _us(seconds: float) -> int:
    return round(seconds * _US)


def pack_record(r: BatchRecord, t0: float) -> PackedRecord:
    """``r`` as an array, its times in microseconds since ``t0`` (the engine's start)."""
    formed = _us(r.formed - t0)
    phases: list[int | None] = []
    for a, b in r.phases:
        if a == 0 and b == 0:  # never reached
            phases += (None, None)
        else:
            phases += (_us(a - t0) - formed, _us(b - t0) - formed)
    cpu = tuple(max(0, _us(c)) for c in r.cpu)
    return (r.batch, r.lane, r.slot, r.tasks, r.key, r.ok, r.nbytes, r.out_nbytes, formed, tuple(phases), cpu)


def unpack_record(p: PackedRecord) -> BatchRecord:
    """The record ``p`` stands for, its times in seconds since the engine's start."""
    batch, lane, slot, tasks, key, ok, nbytes, out_nbytes, formed_us, flat, cpu = p
    formed = formed_us / _US
    phases: list[tuple[float, float]] = []
    for i in range(0, len(flat) - 1, 2):
        a, b = flat[i], flat[i + 1]
        phases.append((0.0, 0.0) if a is None or b is None else ((formed_us + a) / _US, (formed_us + b) / _US))
    return BatchRecord(batch, lane, slot, tasks, key, formed, tuple(phases), ok, nbytes, tuple(c / _US for c in cpu),
                       out_nbytes)


def _numbered(key: str) -> tuple[str, int, int, str] | None:
    """``key`` as (before its last number, the number, its width, after it); None without one."""
    m = _LAST_NUMBER.search(key)
    if m is None:
        return None
    digits = m.group(1)
    return key[:m.start(1)], int(digits), len(digits), m.group(2)


def successor(key: str) -> str | None:
    """The key after ``key`` in a numbered series: its last number plus one, as wide as before
    (``img-0099.png`` → ``img-0100.png``); None for a key without a number."""
    p = _numbered(key)
    return None if p is None else f"{p[0]}{p[1] + 1:0{p[2]}d}{p[3]}"


def key_runs(keys: Iterable[str]) -> tuple[str | int, ...]:
    """``keys`` as runs: each key written out, unless it is the successor of the key before it;
    then a number after a written key counts the successors that follow it."""
    out: list[str | int] = []
    run = 0
    # The expected next key, parts kept: a key in a run costs one format, not a parse.
    head, n, width, tail = "", 0, 0, ""
    numbered = False
    for key in keys:
        if numbered and run < MAX_RUN and key == f"{head}{n + 1:0{width}d}{tail}":
            run, n = run + 1, n + 1
            continue
        if run:
            out.append(run)
            run = 0
        out.append(key)
        p = _numbered(key)
        numbered = p is not None
        if p is not None:
            head, n, width, tail = p
    if run:
        out.append(run)
    return tuple(out)


def expand_keys(runs: Sequence[str | int], limit: int | None = None) -> list[str]:
    """The keys ``runs`` stands for (``key_runs`` undone), at most ``limit`` of them. A run with no
    numbered key before it stands for nothing."""
    out: list[str] = []
    last: str | None = None
    for item in runs:
        room = MAX_RUN if limit is None else limit - len(out)
        if room <= 0:
            break
        if isinstance(item, str):
            last = item
            out.append(item)
            continue
        p = _numbered(last) if last is not None else None
        if p is None:
            continue
        head, n, width, tail = p
        out.extend(f"{head}{i:0{width}d}{tail}" for i in range(n + 1, n + 1 + min(item, room)))
        last = out[-1]
    return out


def run_length(runs: Sequence[str | int]) -> int:
    """How many keys ``runs`` stands for, without building them."""
    return sum(1 if isinstance(item, str) else item for item in runs)
