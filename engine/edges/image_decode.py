"""Decoding one image file into its row: Pillow, the spec's mode, size, resize policy, layout and dtype.

The decisions this module protects:
- An image that cannot be used fails alone as an ``InputError`` naming its path and why (see
  engine/edges/image_source.py, which lists the folder and says more).
- It imports Pillow, NumPy and nothing of the spec: a fill worker process unpickles the decoder
  (its ``ImageFormat`` and nothing else) and so imports only this module. With the spec's model
  it had paid for pydantic too: 0.5 s of CPU for each worker's imports on the 2-core VM, a quarter
  of a 1,000-image pass for two workers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps, UnidentifiedImageError

from warpdeck.engine.edges.input_errors import InputError
from warpdeck.engine.edges.input_files import open_regular

__all__ = ["CHANNELS", "ImageDecoder", "ImageFormat"]

CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4}
"""Channels of each mode (``L`` keeps its channel axis)."""
_FORMATS = ("PNG", "JPEG", "WEBP")
_RESAMPLE = Image.Resampling.BILINEAR


@dataclass(frozen=True, slots=True)
class ImageFormat:
    """What every image becomes: the spec's ``source`` fields an image's decoding reads."""

    mode: Literal["RGB", "L", "RGBA"]
    size: tuple[int, int]
    """(height, width)."""
    dtype: Literal["uint8", "float32"]
    layout: Literal["HWC", "CHW"]
    resize: Literal["fit", "crop", "pad"]
    pad_value: int
    max_pixels: int


class ImageDecoder:
    """Decodes one image file into a row, by an ``ImageFormat``. Picklable (the format and nothing
    else), so a fill worker process runs the very decoder a fill thread runs."""

    def __init__(self, image_format: ImageFormat) -> None:
        self.format = image_format

    def __call__(self, path: Path, row: npt.NDArray[Any]) -> None:
        with open_regular(path) as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise InputError(str(path), "empty file")
            try:
                with Image.open(f, formats=_FORMATS) as img:
                    w, h = img.size
                    if w * h > self.format.max_pixels:
                        raise InputError(str(path), f"{w}x{h} = {w * h} pixels, over max_pixels "
                                                    f"({self.format.max_pixels}); refused before decoding")
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
        s = self.format
        if img.mode != s.mode:
            img = img.convert(s.mode)
        size = (s.size[1], s.size[0])  # Pillow sizes are (width, height)
        if s.resize == "crop":
            return ImageOps.fit(img, size, _RESAMPLE)
        if s.resize == "pad":
            return ImageOps.pad(img, size, _RESAMPLE, color=(s.pad_value,) * CHANNELS[s.mode])
        return img if img.size == size else img.resize(size, _RESAMPLE)

    def _store(self, img: Image.Image, row: npt.NDArray[Any]) -> None:
        h, w = self.format.size
        a = np.asarray(img, dtype=np.uint8).reshape(h, w, CHANNELS[self.format.mode])
        if self.format.layout == "CHW":
            a = a.transpose(2, 0, 1)
        if self.format.dtype == "float32":
            np.divide(a, np.float32(255.0), out=row, dtype=np.float32)
        else:
            row[...] = a
