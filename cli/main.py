"""``warpdeck``: run a pipeline spec, the demo, or (later) attach and replay.

Exit status (DESIGN.md section 7): 0 when every task is done; 1 when any failed or was
cancelled; 2 for bad usage or a bad spec.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
from pathlib import Path

from rich.console import Console

from warpdeck.engine.api import BackendError, PipelineSpec, SpecError, load_spec, parse_spec

__all__ = ["main"]

_DEMO = "warpdeck.examples.spectrogram:stage"


def _version() -> str:
    try:
        return importlib.metadata.version("warpdeck")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warpdeck", description="A control room for GPU batch pipelines.")
    p.add_argument("--version", action="version", version=f"warpdeck {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a pipeline spec (TOML)")
    run.add_argument("spec", type=Path)
    _common(run)
    demo = sub.add_parser("demo", help="run a built-in example pipeline on generated inputs")
    demo.add_argument("--count", type=int, default=4000, help="how many synthetic signals (default 4000)")
    _common(demo)
    return p


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--headless", action="store_true", help="no control room: a progress display and a summary")
    p.add_argument("--json", type=Path, metavar="REPORT.json", help="write the run report as JSON")
    p.add_argument("--backend", choices=("auto", "numpy", "cupy"), help="override the spec's backend")
    p.add_argument("--run-dir", type=Path, help="journal and outputs (default .warpdeck/<pipeline>)")


def _demo_spec(count: int) -> PipelineSpec:
    return parse_spec({
        "name": "demo-spectrogram", "batch_size": 64, "lanes": 2,
        "source": {"kind": "synthetic", "count": count, "shape": [8192], "dtype": "float32", "seed": 7},
        "sink": {"kind": "npy_dir", "path": "outputs"},
        "stages": [{"fn": _DEMO, "deadline_s": 30}],
    }, "<demo>")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``warpdeck`` command."""
    args = _parser().parse_args(argv)
    err = Console(stderr=True)
    try:
        spec = load_spec(args.spec) if args.command == "run" else _demo_spec(args.count)
    except SpecError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return 2
    if args.backend:
        spec = spec.model_copy(update={"backend": args.backend})
    run_dir = args.run_dir or Path(".warpdeck") / spec.name
    if not args.headless:
        # The interactive control room is a separate package that is not in this build yet.
        err.print("warpdeck: the interactive control room is not available in this build; running headless.")
    console = Console(stderr=False)
    from warpdeck.cli.headless import run_headless  # noqa: PLC0415 - rich loads only for a run

    try:
        report = asyncio.run(run_headless(spec, run_dir, console, live=console.is_terminal))
    except BackendError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 1
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    return report.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
