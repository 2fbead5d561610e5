"""Text lines to sentence vectors: your own per-item loading, in pure Python, in worker processes.

One task is one line of a text file. Its input is the line tokenised the way a small text model's
front end does it, in plain Python: lower-cased, split into words at anything that is not a letter
or a digit, each word hashed (FNV-1a, 32 bits) into one of ``VOCAB - 1`` ids (0 is padding), the
first ``LENGTH`` ids kept, the rest of the row padded with 0. That loop holds the GIL, so on threads
it runs on one core at a time; with ``host.fill_pool = "processes"`` each worker process
tokenises its batches on a core of its own, writing the ids straight into the slot.

The stage looks the ids up in a fixed embedding table (``VOCAB`` x ``DIM`` float32, seed 7) and
averages the vectors of the line's words (padding left out): a ``DIM``-long float32 vector per line.

    python -m warpdeck.examples.tokens examples/data/lines.txt --count 20000
    warpdeck run examples/tokens-lines.toml --headless
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DIM", "LENGTH", "TABLE", "VOCAB", "lines", "load", "main", "make_lines", "out_spec", "reference",
           "stage", "tokenize"]

VOCAB = 32_768
"""Token ids, 0 (padding) included."""
LENGTH = 128
"""Ids per line: longer lines are cut, shorter ones padded with 0."""
DIM = 64
"""Length of a line's vector."""
TABLE = np.random.default_rng(7).standard_normal((VOCAB, DIM)).astype(np.float32)
"""The embedding table, ``VOCAB`` x ``DIM`` float32, fixed by seed 7 (row 0, padding, is unused)."""

_WORD = re.compile(r"[^\W_]+")
_TABLES: dict[tuple[str, int], Any] = {}


def tokenize(text: str) -> list[int]:
    """The line's ids, as ``load`` writes them (before padding): FNV-1a of each word, in Python."""
    ids = []
    for word in _WORD.findall(text.lower()):
        h = 0x811C9DC5
        for ch in word.encode("utf-8"):
            h = ((h ^ ch) * 0x01000193) & 0xFFFFFFFF
        ids.append(1 + h % (VOCAB - 1))
        if len(ids) == LENGTH:
            break
    return ids


def lines(path: str, limit: int = 0) -> Iterator[tuple[str, tuple[str, int, int]]]:
    """Every line of the file at ``path`` (relative to the working directory), the first ``limit``
    when it is above 0: its key (``line-00000042``) and a handle of (path, byte offset, length).
    Listing reads the file once, in large blocks, and tokenises nothing."""
    where = Path(path).resolve()
    offset = 0
    with where.open("rb") as f:
        for n, raw in enumerate(f):
            if limit and n >= limit:
                return
            yield f"line-{n:08d}", (str(where), offset, len(raw))
            offset += len(raw)


def load(handle: tuple[str, int, int], row: npt.NDArray[np.int32]) -> None:
    """Read the line ``handle`` points at and write its ids into ``row`` (``LENGTH`` int32), padded."""
    path, offset, length = handle
    with Path(path).open("rb") as f:
        f.seek(offset)
        text = f.read(length).decode("utf-8", errors="replace")
    ids = tokenize(text)
    row[: len(ids)] = ids
    row[len(ids):] = 0


def out_spec(in_item_shape: tuple[int, ...], in_dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    """Per-task output: ``((DIM,), "float32")``; the input must be ``LENGTH`` int32 ids."""
    if tuple(in_item_shape) != (LENGTH,) or np.dtype(in_dtype) != np.int32:
        raise ValueError(f"tokens needs ({LENGTH},) int32 ids, got {in_item_shape} {in_dtype}")
    return (DIM,), "float32"


def _table(xp: ModuleType) -> Any:
    if xp is np:
        return TABLE
    cuda = getattr(xp, "cuda", None)
    key = (xp.__name__, cuda.runtime.getDevice() if cuda is not None else -1)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = xp.asarray(TABLE)
        if cuda is not None:
            cuda.get_current_stream().synchronize()  # the upload lands before any lane's stream reads it
    return t


def stage(xp: ModuleType, inp: Any, out: Any) -> None:
    """Each row's mean word vector: ``TABLE[ids]`` averaged over the ids that are not padding."""
    vectors = xp.take(_table(xp), inp, axis=0)  # (n, LENGTH, DIM)
    words = (inp > 0).astype(xp.float32)  # (n, LENGTH)
    total = xp.einsum("nld,nl->nd", vectors, words)
    out[...] = total / xp.maximum(words.sum(axis=1, keepdims=True), 1.0)


stage.out_spec = out_spec  # type: ignore[attr-defined]  # the engine reads the output shape from here


def reference(text: str) -> npt.NDArray[np.float32]:
    """One line's vector, computed independently in float64."""
    ids = tokenize(text)
    if not ids:
        return np.zeros(DIM, np.float32)
    return TABLE[ids].astype(np.float64).mean(axis=0).astype(np.float32)


_COMMA = 0.1  # a word's chance of a comma after it
_WORDS = ("the", "device", "batch", "queue", "kernel", "stream", "pinned", "memory", "worker", "lane",
          "slot", "copy", "host", "fill", "sink", "token", "line", "vector", "über", "naïve", "東京", "42")


def make_lines(path: str | Path, count: int, seed: int = 0) -> Path:
    """Write ``count`` lines of 5 to 150 words drawn from a small word list (seeded), one per line."""
    rng = np.random.default_rng(seed)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for _ in range(count):
            words = rng.choice(len(_WORDS), int(rng.integers(5, 151)))
            commas = rng.random(len(words)) < _COMMA
            f.write(" ".join(_WORDS[w] + ("," if c else "") for w, c in zip(words, commas, strict=True)) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m warpdeck.examples.tokens FILE --count N --seed S`` writes a text file of lines."""
    parser = argparse.ArgumentParser(prog="python -m warpdeck.examples.tokens", description=main.__doc__)
    parser.add_argument("file", type=Path, help="text file to write (its folder is created)")
    parser.add_argument("--count", type=int, default=20_000, help="lines (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="non-negative random seed (default 0)")
    args = parser.parse_args(argv)
    if args.count < 0 or args.seed < 0:
        parser.error("--count and --seed must be non-negative")
    make_lines(args.file, args.count, args.seed)
    print(f"wrote {args.count} lines to {args.file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
