"""Image folders as inputs: PNG, JPEG and WebP files decoded with Pillow into one fixed array.

The decisions this module protects:
- Every task has one shape and dtype (one batching key): the spec fixes the mode, size, dtype and
  layout, and each image is converted, resized (``fit``, ``crop`` or ``pad``) and scaled to them.
  The channel axis is kept for ``L`` too, so a layout means the same thing for every mode.
- Enumerating only lists file names: counting a folder of a million images opens none of them.
  Decoding happens in ``load``, on a lane's fill threads, never on the event loop.
- An image that cannot be used (empty, truncated, corrupt, not the format its name says,
  unreadable, gone) fails alone as an ``InputError`` naming its path and the reason: never retried,
  never its batch. An image whose header declares more than ``max_pixels`` pixels is refused after
  ``Image.open`` has read only the header, before a pixel is decoded. Pillow's own bomb check
  (``Image.MAX_IMAGE_PIXELS``) runs inside ``Image.open``; this module never changes it (it is
  process-wide, and other code may rely on it) nor the warnings filters (not thread-safe), so its
  ``DecompressionBombError`` (over twice that limit), and its warning where a filter makes it an
  error, become the same refusal; with default filters the warning is only printed, and the
  ``max_pixels`` check (the same limit by default) refuses the image.
- Task keys come from the path relative to the folder, without its suffix, made safe for a file
  name (folders joined by ``__``, other characters outside ``SAFE_KEY`` become ``_``); two files
  that give one key are a spec error naming both, found when the folder is listed.
- Only PNG, JPEG and WebP decoders are asked (``Image.open(formats=...)``), so a file cannot reach
  a rarer, less hardened plugin by its content. EXIF orientation is not applied: pixels as stored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps, UnidentifiedImageError

from warpdeck.engine.edges.config import ImageSource, SpecError, SpecIssue
from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.npy_inputs import open_regular
from warpdeck.engine.edges.sources import KeyedTasks, load_each, safe_key
from warpdeck.engine.state.batches import BatchKey, TaskInput

__all__ = ["SUFFIXES", "ImageDecoder", "ImageSourceImpl", "image_key"]

SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})
"""Names that are tasks (compared lower-cased); anything else the glob matches is skipped."""
_FORMATS = ("PNG", "JPEG", "WEBP")
_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}
_RESAMPLE = Image.Resampling.BILINEAR


def image_key(relative: Path) -> str:
    """The task key of the image at ``relative`` (to the source folder): its folders and stem joined
    by ``__``, unsafe characters as ``_``, a leading dot as ``_`` (a hidden output is refused); a key
    over 200 characters keeps its start and ends in a hash of the whole path, so it stays unique."""
    return safe_key(relative.with_suffix("").parts, relative.as_posix().encode("utf-8", "surrogateescape"))


class ImageSourceImpl(KeyedTasks):
    """Every image file ``glob`` names in ``path``, sorted by path; each decoded into its row."""

    def __init__(self, spec: ImageSource, tasks: bool = True) -> None:
        self.spec = spec
        if not spec.path.is_dir():
            raise FileNotFoundError(f"source.path: {spec.path} is not a directory")
        # A loader only (``tasks=False``) lists nothing: the handles it decodes are paths. Whatever is
        # named like an image is a task, a directory too: it fails alone, named, as in an npy source.
        files = sorted(p for p in spec.path.glob(spec.glob) if p.suffix.lower() in SUFFIXES) if tasks else []
        self._tasks: dict[str, Path] = {}
        for p in files:
            key = image_key(p.relative_to(spec.path))
            other = self._tasks.setdefault(key, p)
            if other is not p:
                raise SpecError(str(spec.path), [SpecIssue(
                    "source.glob", f"{other} and {p} both make task key {key!r}; rename one or narrow the glob")])
        self.total: int | None = len(self._tasks) if tasks else None
        h, w = spec.size
        c = _CHANNELS[spec.mode]
        self._key = BatchKey("image", (h, w, c) if spec.layout == "HWC" else (c, h, w), spec.dtype)
        self._decode = ImageDecoder(spec)

    @property
    def batch_key(self) -> BatchKey:
        """The one batching key every task of this source has."""
        return self._key

    def describe(self, key: str) -> str:
        """The image file the task is decoded from; "" when the list holds none."""
        p = self._tasks.get(key)
        return "" if p is None else f"{p} (as {self.spec.mode} {self.spec.size[0]}x{self.spec.size[1]}, " \
                                    f"{self.spec.resize}, {self.spec.dtype} {self.spec.layout})"

    def load(self, items: Sequence[TaskInput], out: npt.NDArray[Any]) -> list[BaseException | None]:
        """Decode item j into ``out[j]``; each item's error (or None). Runs on a fill thread."""
        decode = self._decode
        return load_each(items, out, lambda t, row: decode(t.handle, row))

    def row_loader(self) -> ImageDecoder:
        """Decodes one task's image into its row in a fill worker process (``host.fill_pool``)."""
        return self._decode


class ImageDecoder:
    """Decodes one image file into a row, by the source's spec. Picklable (the spec and nothing
    else), so a fill worker process runs the very decoder a fill thread runs."""

    def __init__(self, spec: ImageSource) -> None:
        self.spec = spec

    def __call__(self, path: Path, row: npt.NDArray[Any]) -> None:
        with open_regular(path) as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise InputError(str(path), "empty file")
            try:
                with Image.open(f, formats=_FORMATS) as img:
                    w, h = img.size
                    if w * h > self.spec.max_pixels:
                        raise InputError(str(path), f"{w}x{h} = {w * h} pixels, over max_pixels "
                                                    f"({self.spec.max_pixels}); refused before decoding")
                    img.load()
                    fixed = self._fixed(img)
            except (InputError, MemoryError):
                raise
            except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
                raise InputError(str(path), f"refused before decoding: {exc}") from None
            except UnidentifiedImageError:
                raise InputError(str(path), "not a PNG, JPEG or WebP image (or its header is corrupt)") from None
            except Exception as exc:  # noqa: BLE001 - whatever a bad file provokes in a decoder, it is corrupt
                raise InputError(str(path), f"corrupt or truncated image ({type(exc).__name__}: "
                                            f"{' '.join(str(exc).split())})") from None
        self._store(fixed, row)

    def _fixed(self, img: Image.Image) -> Image.Image:
        """``img`` in the spec's mode and size, by its resize policy."""
        s = self.spec
        if img.mode != s.mode:
            img = img.convert(s.mode)
        size = (s.size[1], s.size[0])  # Pillow sizes are (width, height)
        if s.resize == "crop":
            return ImageOps.fit(img, size, _RESAMPLE)
        if s.resize == "pad":
            return ImageOps.pad(img, size, _RESAMPLE, color=(s.pad_value,) * _CHANNELS[s.mode])
        return img if img.size == size else img.resize(size, _RESAMPLE)

    def _store(self, img: Image.Image, row: npt.NDArray[Any]) -> None:
        h, w = self.spec.size
        a = np.asarray(img, dtype=np.uint8).reshape(h, w, _CHANNELS[self.spec.mode])
        if self.spec.layout == "CHW":
            a = a.transpose(2, 0, 1)
        if self.spec.dtype == "float32":
            np.divide(a, np.float32(255.0), out=row, dtype=np.float32)
        else:
            row[...] = a
