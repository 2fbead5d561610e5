"""Opening an input ``.npy`` file without trusting it: what it is, what its header says, and
whether this engine can use what it holds.

The decisions this module protects:
- Nothing an input holds can run code or stall the run: a file is opened non-blocking and must
  be a regular file (a FIFO would block its reader for ever), only its header is parsed (never
  ``np.load``, so ``allow_pickle`` stays False and pickled object arrays are never loaded), and a
  header over NumPy's safety limit is refused.
- A header cannot claim more than the file holds: its data size is checked against the file's
  size before any buffer is sized from it, so a lying header cannot make the engine allocate.
- Usable element types are exactly those a spec can name (``config.Dtype``); byte order and
  Fortran order are only layouts, converted when the file is read.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np

from warpdeck.engine.edges.config import Dtype
from warpdeck.engine.edges.input_errors import InputError

__all__ = ["SUPPORTED_DTYPES", "NpyHeader", "dtype_problem", "read_header", "usable"]

SUPPORTED_DTYPES: tuple[str, ...] = get_args(Dtype)
"""The element types a spec can name, and so the only ones an input may hold."""
_MAX_DIMS = 8  # as many as a spec's shape may have
_MAX_HEADER = 10_000  # NumPy's own default max_header_size

_KINDS = {
    "O": "Python objects (pickled data is never loaded)",
    "U": "unicode text",
    "S": "byte strings",
    "V": "raw or structured records",
    "M": "datetime64 values",
    "m": "timedelta64 values",
    "b": "booleans (arithmetic stages cannot store their results back as bool)",
}


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What a ``.npy`` header declares, and where its data starts in a file of ``size`` bytes."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran: bool
    offset: int
    size: int

    @property
    def nbytes(self) -> int:
        """Bytes of data the header promises."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def read_header(path: Path, f: io.BufferedReader) -> NpyHeader:
    """The header of ``f`` (opened from ``path``), left positioned at the data."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        raise InputError(str(path), "corrupt .npy: empty file")
    try:
        version = np.lib.format.read_magic(f)
        if version in ((1, 0), (2, 0)):
            fmt = "<H" if version == (1, 0) else "<I"
            (length,) = struct.unpack(fmt, f.peek(struct.calcsize(fmt))[:struct.calcsize(fmt)])
            if length > _MAX_HEADER:
                raise InputError(str(path), f"corrupt .npy header (declares {length} bytes, over NumPy's"
                                            f" {_MAX_HEADER}-byte limit for a header it cannot trust)")
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise InputError(str(path), f"unsupported .npy format version {version[0]}.{version[1]}")
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a hostile header provokes, the file is corrupt
        raise InputError(str(path), f"corrupt .npy header ({' '.join(str(exc).split())})") from None
    return NpyHeader(tuple(shape), dtype, bool(fortran), f.tell(), size)


def dtype_problem(dtype: np.dtype[Any]) -> str:
    """Why arrays of ``dtype`` cannot be inputs here; empty when they can (any byte order)."""
    if dtype.hasobject:
        return "object array: " + _KINDS["O"]
    if dtype.kind in _KINDS:
        return f"dtype {dtype.str} holds {_KINDS[dtype.kind]}; supported: {', '.join(SUPPORTED_DTYPES)}"
    name = dtype.newbyteorder("=").name
    if name not in SUPPORTED_DTYPES:
        return f"dtype {name} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}"
    return ""


def usable(path: Path, h: NpyHeader) -> np.dtype[Any]:
    """The native dtype of an input with header ``h``, or an InputError saying why it is unusable."""
    problem = dtype_problem(h.dtype)
    if problem:
        raise InputError(str(path), problem)
    if len(h.shape) > _MAX_DIMS:
        raise InputError(str(path), f"{len(h.shape)} dimensions; at most {_MAX_DIMS} are supported")
    if 0 in h.shape:
        raise InputError(str(path), f"empty array (shape {list(h.shape)}): nothing to compute")
    if h.size - h.offset < h.nbytes:
        raise InputError(str(path), f"truncated ({h.size - h.offset} of {h.nbytes} data bytes)")
    return h.dtype.newbyteorder("=")
