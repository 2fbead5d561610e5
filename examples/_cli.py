"""The input generators' shared command line: ``python -m warpdeck.examples.NAME DIR``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def input_cli(name: str, description: str, make_inputs: Callable[[Path, int, int], list[Path]],
              what: str, argv: Sequence[str] | None = None) -> int:
    """Parse ``DIR --count N --seed S``, write the inputs, say what was written."""
    parser = argparse.ArgumentParser(prog=f"python -m warpdeck.examples.{name}", description=description)
    parser.add_argument("directory", type=Path, help="folder to write into (created if missing)")
    parser.add_argument("--count", type=int, default=100, help="how many inputs (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="non-negative random seed (default 0)")
    args = parser.parse_args(argv)
    if args.count < 0 or args.seed < 0:
        parser.error("--count and --seed must be non-negative")
    paths = make_inputs(args.directory, args.count, args.seed)
    print(f"wrote {len(paths)} inputs of {what} to {args.directory}")
    return 0
