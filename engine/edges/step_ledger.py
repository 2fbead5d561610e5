"""The ledger of a run of several steps: which segments finished, each reduce's result, every gate's
decision; ``steps.json`` in the run directory, read by the next run in it.

The decisions this module protects:
- A segment recorded finished is never run again, and a gate decided is never asked again: the
  ledger is written (temp file, fsync, rename) before the run goes on, so a kill at any moment
  leaves either the old ledger or the new one, never half of one.
- A reduce's result is its own file (``steps/<name>/result.npz``, written the same way) and the
  ledger names it only once it is in place.
- The ledger belongs to one spec: a run directory whose ledger was made by another spec's steps
  is refused (``LedgerMismatch``), as the journal refuses another spec's tasks.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["LEDGER_NAME", "GateDecision", "Ledger", "LedgerError", "LedgerMismatch", "SegmentDone", "load_result",
           "save_result"]

LEDGER_NAME = "steps.json"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class GateDecision(_Model):
    """An operator's answer at a gate."""

    decision: Literal["approved", "rejected"]
    """Whether the step may start."""
    note: str = ""
    """What the operator said of it."""
    by: str = ""
    """Who decided: ``command line``, ``control room``, or an attached room's name."""
    at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    """When (UTC, ISO 8601)."""


class SegmentDone(_Model):
    """A segment that finished: never run again in this run directory."""

    seconds: float
    """How long its engine ran."""
    done: int
    """Tasks it finished."""
    failed: int
    """Tasks that failed (or were cancelled) in it."""
    result: str | None = None
    """A reduce's result file, relative to the run directory."""


class Ledger(_Model):
    """What a run of several steps has done so far."""

    spec: str
    """The SHA-256 of the spec whose steps these are."""
    finished: dict[str, SegmentDone] = Field(default_factory=dict)
    """Finished segments by name."""
    gates: dict[str, GateDecision] = Field(default_factory=dict)
    """Gate decisions by step name."""

    def with_finished(self, name: str, done: SegmentDone) -> Ledger:
        """This ledger with ``name`` finished."""
        return self.model_copy(update={"finished": {**self.finished, name: done}})

    def with_gate(self, step: str, decision: GateDecision) -> Ledger:
        """This ledger with ``step``'s gate decided."""
        return self.model_copy(update={"gates": {**self.gates, step: decision}})

    @classmethod
    def open(cls, run_dir: Path, spec_sha: str) -> Ledger:
        """The ledger in ``run_dir``, or a new one; raises ``LedgerMismatch`` for another spec's."""
        path = run_dir / LEDGER_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(spec=spec_sha)
        except OSError as exc:
            raise LedgerError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            ledger = cls.model_validate_json(text)
        except ValidationError as exc:
            raise LedgerError(f"{path} is not a warpdeck steps ledger: {exc.errors()[0]['msg']}") from None
        if ledger.spec != spec_sha:
            raise LedgerMismatch(f"{path} was written by another spec's steps: use another run directory "
                                 "(--run-dir), or remove it to start afresh")
        return ledger

    def save(self, run_dir: Path) -> None:
        """Write the ledger whole, in place of the one before."""
        _replace(run_dir / LEDGER_NAME, self.model_dump_json(indent=2).encode())


class LedgerError(RuntimeError):
    """The ledger could not be read or written."""


class LedgerMismatch(LedgerError):
    """The run directory's ledger is another spec's."""


def _replace(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_result(path: Path, result: Mapping[str, npt.NDArray[Any]]) -> None:
    """Write a reduce's result (names to arrays) whole, in place."""
    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in result.items()}  # np.savez's stubs reject **arrays
    np.savez(buf, **arrays)
    _replace(path, buf.getvalue())


def load_result(path: Path) -> dict[str, npt.NDArray[Any]]:
    """A reduce's result as ``save_result`` wrote it."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
