"""Small helpers the benchmark scripts share: a plain-text table and the --json dump."""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent.parent / "tests" / "support"
"""The scaffolding tests and benchmarks share (the synthetic snapshot stream, ``wd_synthetic``) lives in tests/support,
never in the wheel; every benchmark imports this module first, so it is importable."""
if str(SUPPORT) not in sys.path:
    sys.path.append(str(SUPPORT))

PASS, MISS, INFO = "PASS", "MISS", "-"


def verdict(ok: bool | None) -> str:
    """PASS / MISS, or '-' for a figure without a target."""
    if ok is None:
        return INFO
    return PASS if ok else MISS


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
                right: Sequence[bool] | None = None) -> None:
    """One plain-text table (copyable into an issue or a commit message verbatim)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    right = right or [i > 0 for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    rule = "-" * len(line(cells[0]))
    print(title)
    print(rule)
    print(line(cells[0]))
    print(rule)
    for r in cells[1:]:
        print(line(r))
    print(rule)


def write_json(path: str | None, name: str, figures: dict[str, Any]) -> None:
    """Save ``figures`` (plus where and when they were taken) to ``path`` when given."""
    if not path:
        return
    doc = {
        "benchmark": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": _cpus(),
        "argv": sys.argv[1:],
        "figures": figures,
    }
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc, indent=2, default=float) + "\n", encoding="utf-8")
    print(f"figures written to {p}")


def _cpus() -> int:
    import os  # noqa: PLC0415

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
