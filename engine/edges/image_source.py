"""Image folders as inputs: PNG, JPEG and WebP files decoded with Pillow into one fixed array.

The decisions this module protects:
- Every task has one shape and dtype (one batching key): the spec fixes the mode, size, dtype and
  layout, and each image is converted, resized (``fit``, ``crop`` or ``pad``) and scaled to them.
  The channel axis is kept for ``L`` too, so a layout means the same thing for every mode.
- Enumerating only lists file names: counting a folder of a million images opens none of them.
  Decoding happens in ``load``, on a lane's fill threads (or its fill worker processes), never on
  the event loop, by an ``ImageDecoder`` (engine/edges/image_decode.py).
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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

from warpdeck.engine.edges.config import ImageSource, SpecError, SpecIssue
from warpdeck.engine.edges.image_decode import CHANNELS, ImageDecoder, ImageFormat
from warpdeck.engine.edges.sources import KeyedTasks, load_each, safe_key
from warpdeck.engine.state.batches import BatchKey, TaskInput

__all__ = ["SUFFIXES", "ImageSourceImpl", "image_key"]

SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})
"""Names that are tasks (compared lower-cased); anything else the glob matches is skipped."""


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
        c = CHANNELS[spec.mode]
        self._key = BatchKey("image", (h, w, c) if spec.layout == "HWC" else (c, h, w), spec.dtype)
        self._decode = ImageDecoder(ImageFormat(spec.mode, spec.size, spec.dtype, spec.layout, spec.resize,
                                                spec.pad_value, spec.max_pixels))

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
