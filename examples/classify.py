"""A small convolutional image classifier in PyTorch, over a folder of images.

One task is an RGB image as float32 (3, H, W) in [0, 1] (``[source] kind = "images"`` with
``layout = "CHW"``, ``dtype = "float32"``); the output is its 10 class probabilities, float32 (10,),
the softmax of ``Net``'s logits. The weights are drawn from a fixed seed (no download, no training):
the classes mean nothing, but every run and every machine computes the same function, so the
engine's outputs can be checked against the same model called directly.

This is a torch stage with a factory (docs/torch.md): ``make_model`` builds the model once per
lane, ``classify(model, inp, out)`` writes the probabilities into ``out`` in place.

Generate images with ``python -m warpdeck.examples.classify make-images DIR --count 500``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn

__all__ = ["CLASSES", "INPUT_SHAPE", "MIN_SIDE", "SEED", "Net", "classify", "main", "make_images", "make_model",
           "out_spec"]

CLASSES = 10
"""Output probabilities per task."""
INPUT_SHAPE = (3, 64, 64)
"""Shape of one task as ``classify-images.toml`` decodes it: RGB, 64x64, channels first."""
SEED = 1234
"""Seed of the weights."""
MIN_SIDE = 16
"""Smallest height and width the model takes: two 2x2 poolings, then an average pool to 4x4."""
# (mode, file suffix) of image i, by i modulo the list: both encoders, and the modes the source
# converts from (grey, and RGBA whose alpha it drops).
_KINDS = (("RGB", ".png"), ("RGB", ".jpg"), ("L", ".png"), ("RGBA", ".png"), ("L", ".jpg"))


class Net(nn.Module):
    """Two 3x3 convolutions (16 and 32 channels), each with ReLU and 2x2 max pooling, an average
    pool to 4x4 (so any input of at least 16x16 works) and a linear layer to ``CLASSES`` logits."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        )
        self.head = nn.Linear(32 * 4 * 4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, shape (n, CLASSES), for images ``x`` of shape (n, 3, H, W)."""
        logits: torch.Tensor = self.head(self.features(x))
        return logits


def make_model() -> Net:
    """The classifier in eval mode on the CPU, weights from ``SEED`` (He-normal, zero biases).

    The weights come from NumPy's generator, not torch's global one, so building the model changes
    no other code's random stream and the weights do not depend on the torch version. ``classify``
    moves the model to its inputs' device on its first batch.
    """
    model = Net()
    rng = np.random.default_rng(SEED)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.zero_()
            else:
                fan_in = int(np.prod(p.shape[1:]))
                w = rng.standard_normal(tuple(p.shape)) * np.sqrt(2.0 / fan_in)
                p.copy_(torch.from_numpy(w.astype(np.float32)))
    return model.eval()


def out_spec(in_item_shape: tuple[int, ...], in_dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    """Per-task output shape and dtype: ``((CLASSES,), "float32")``; raises ``ValueError`` unless the
    input is a channels-first RGB image of at least 16x16."""
    shape = tuple(in_item_shape)
    if len(shape) != len(INPUT_SHAPE) or shape[0] != INPUT_SHAPE[0] or min(shape[1:]) < MIN_SIDE:
        raise ValueError(f"classify needs (3, H, W) images, H and W >= {MIN_SIDE}, got shape {shape}")
    return (CLASSES,), "float32"


def classify(model: Net, inp: torch.Tensor, out: torch.Tensor) -> None:
    """Write the class probabilities of each image in ``inp`` (n, 3, H, W) into ``out`` (n, CLASSES)."""
    if next(model.parameters()).device != inp.device:  # the first batch on a GPU lane: once per lane
        model.to(inp.device)
    out.copy_(torch.softmax(model(inp), dim=-1))


classify.out_spec = out_spec  # type: ignore[attr-defined]  # the engine reads the output shape from here


def make_images(directory: str | Path, count: int, seed: int = 0, sizes: tuple[int, int] = (48, 160)) -> list[Path]:
    """Write ``count`` images ``<directory>/img-00000.png``… of coloured shapes on noise.

    Width and height are each drawn from ``sizes`` (inclusive); the mode and format cycle through
    RGB PNG, RGB JPEG, grey PNG, RGBA PNG and grey JPEG. Image i depends only on (seed, i, sizes),
    so a larger ``count`` extends a smaller one.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    lo, hi = sizes
    if not 1 <= lo <= hi:
        raise ValueError(f"sizes must be 1 <= low <= high, got {sizes}")
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        w, h = (int(v) for v in rng.integers(lo, hi + 1, 2))
        base = rng.integers(0, 256, 3)
        noise = rng.integers(-24, 25, (h, w, 3))
        img = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(2, 6))):
            x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
            y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            if rng.integers(2):  # an ellipse or a rectangle, evenly
                draw.ellipse((x0, y0, x1, y1), fill=colour)
            else:
                draw.rectangle((x0, y0, x1, y1), fill=colour)
        mode, suffix = _KINDS[i % len(_KINDS)]
        path = out_dir / f"img-{i:05d}{suffix}"
        if suffix == ".jpg":
            img.convert(mode).save(path, quality=90)
        else:
            img.convert(mode).save(path)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m warpdeck.examples.classify make-images DIR --count N --seed S``."""
    parser = argparse.ArgumentParser(prog="python -m warpdeck.examples.classify",
                                     description="Tools of the image classifier example.")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make-images", help="write seeded images of coloured shapes on noise")
    make.add_argument("directory", type=Path, help="folder to write into (created if missing)")
    make.add_argument("--count", type=int, default=100, help="how many images (default 100)")
    make.add_argument("--seed", type=int, default=0, help="non-negative random seed (default 0)")
    make.add_argument("--min-size", type=int, default=48, help="smallest width or height in pixels (default 48)")
    make.add_argument("--max-size", type=int, default=160, help="largest width or height in pixels (default 160)")
    args = parser.parse_args(argv)
    if args.count < 0 or args.seed < 0:
        make.error("--count and --seed must be non-negative")
    if not 1 <= args.min_size <= args.max_size:
        make.error("sizes must satisfy 1 <= --min-size <= --max-size")
    paths = make_images(args.directory, args.count, args.seed, (args.min_size, args.max_size))
    print(f"wrote {len(paths)} images ({args.min_size}-{args.max_size} px; RGB, grey and RGBA; PNG and JPEG) "
          f"to {args.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
