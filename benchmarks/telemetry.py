"""Telemetry frame size at 1 M tasks and 10 k transitions/s, against the 16 KB an attach over a
1 Mbit/s link allows (DESIGN.md section 9), and what a frame costs to encode and to decode.

Snapshots come from the synthetic stream (``tests/support/wd_synthetic.py``: a real
``EngineSnapshot`` of 1 000 000 tasks, 10 000 transitions/s over 2 lanes, every 499th task stalled
and every 997th failed; the control room's benchmark uses the same). Frames are made exactly as the
plane publishes them: one ``TelemetryFrames`` per run, ``frame(snapshot, control)``, four a second
of the run's time (so 2 500 transitions and their batch records between two frames). Five windows
of 40 frames are measured, at 5, 25, 50, 75 and 95 % of the run (one frame before each is sent and
not counted: the first frame after a gap carries the whole timeline the snapshot holds).

Scenarios: the target's (keys ``img-0000123``, batches of 64); the same with long keys (an object
store's paths); batches of 1 (1 600 batch records a second); keys that do not follow one another
(``uuid4``: no key runs, zlib's worst case). Each prints its frame size p50 / p99 / max on the wire
beside the 16 KB bound, the link that p99 needs at 4 Hz beside 1 Mbit/s, the compression ratio
(JSON → zlib), how many frames had to shrink their samples to fit the budget
(``telemetry.FRAME_BUDGET``), the encode time per frame (the plane's thread) and the decode time
(the attached client's: decode, batch records unpacked, ``snapshot_from``).

    python benchmarks/telemetry.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
import zlib
from typing import Any

import numpy as np
from _common import print_table, verdict, write_json
from wd_synthetic import SyntheticRun

from warpdeck.engine.control.compact import unpack_record
from warpdeck.engine.control.telemetry import FRAME_BUDGET, TelemetryFrames, snapshot_from
from warpdeck.engine.control.wire import Telemetry, decode

TASKS = 1_000_000
TRANSITIONS_S = 10_000
HZ = 4.0
FRAME_P99_BYTES = 16 * 1024
LINK_BITS_S = 1_000_000
WINDOWS = (0.05, 0.25, 0.5, 0.75, 0.95)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def measure(run: SyntheticRun, windows: tuple[float, ...], frames: int) -> dict[str, Any]:
    """Frames of ``run`` as the plane makes them; sizes, ratios and times."""
    length = run.n / (TRANSITIONS_S / 6)  # seconds the run lasts: six transitions a task
    sizes: list[int] = []
    ratios: list[float] = []
    encode_s: list[float] = []
    decode_s: list[float] = []
    shrunk = 0
    first = 0
    for w in windows:
        plane = TelemetryFrames()
        for i in range(frames + 1):
            snap = run.snapshot_at(w * length + i / HZ)
            t0 = time.perf_counter()
            body = plane.frame(snap, snap.control)
            t1 = time.perf_counter()
            tel = decode(body, frozenset(("telemetry",)))
            assert isinstance(tel, Telemetry)
            attached = snapshot_from(tel, tuple(unpack_record(p) for p in tel.timeline))
            t2 = time.perf_counter()
            assert attached.counts == snap.counts and attached.figures == snap.figures
            if i == 0:
                first = max(first, len(body))
                continue
            sizes.append(len(body))
            ratios.append(len(zlib.decompress(body)) / len(body))
            encode_s.append(t1 - t0)
            decode_s.append(t2 - t1)
            shrunk += plane.level > 0
    return {
        "frames": len(sizes), "size_p50": _pct(sizes, 50), "size_p99": _pct(sizes, 99), "size_max": max(sizes),
        "first_frame": first, "ratio_p50": statistics.median(ratios), "shrunk": shrunk,
        "encode_p50_ms": _pct(encode_s, 50) * 1e3, "encode_p99_ms": _pct(encode_s, 99) * 1e3,
        "decode_p50_ms": _pct(decode_s, 50) * 1e3, "link_p99_kbit_s": _pct(sizes, 99) * HZ * 8 / 1000,
    }


def _uuid_run() -> SyntheticRun:
    run = SyntheticRun(TASKS, transitions_per_s=TRANSITIONS_S)
    raw = np.random.default_rng(7).bytes(16 * TASKS)
    run.keys = [str(uuid.UUID(bytes=raw[i:i + 16], version=4)) for i in range(0, 16 * TASKS, 16)]
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two windows of 10 frames, two scenarios")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    windows, frames = ((0.25, 0.75), 10) if args.quick else (WINDOWS, 40)
    scenarios = {
        "numbered keys, batch 64 (the target)": lambda: SyntheticRun(TASKS, transitions_per_s=TRANSITIONS_S),
        "long keys (object-store paths)": lambda: SyntheticRun(
            TASKS, transitions_per_s=TRANSITIONS_S, prefix="s3://lab-bucket/datasets/imagenet/train/n01440764/img-"),
        "batch 1 (1 600 records a second)": lambda: SyntheticRun(TASKS, transitions_per_s=TRANSITIONS_S, batch=1),
        "random keys (uuid4: no runs)": _uuid_run,
    }
    if args.quick:
        scenarios = dict(list(scenarios.items())[::3])
    figures: dict[str, Any] = {}
    rows: list[list[str]] = []
    for name, make in scenarios.items():
        r = measure(make(), windows, frames)
        figures[name] = r
        kb = (r["size_p50"] / 1024, r["size_p99"] / 1024, r["size_max"] / 1024)
        rows += [
            [name, "", "", ""],
            ["  frame on the wire p50 / p99 / max", "{:.1f} / {:.1f} / {:.1f} KB".format(*kb),
             f"p99 <= {FRAME_P99_BYTES // 1024} KB", verdict(r["size_p99"] <= FRAME_P99_BYTES)],
            ["  link at 4 Hz (p99 frames)", f"{r['link_p99_kbit_s']:,.0f} kbit/s",
             f"<= {LINK_BITS_S // 1000:,} kbit/s", verdict(r["link_p99_kbit_s"] * 1000 <= LINK_BITS_S)],
            ["  compression, JSON -> zlib (p50)", f"{r['ratio_p50']:.1f}x", "", verdict(None)],
            [f"  frames shrunk to fit {FRAME_BUDGET // 1024} KB", f"{r['shrunk']} of {r['frames']}", "",
             verdict(None)],
            ["  first frame after a gap (whole timeline)", f"{r['first_frame'] / 1024:.1f} KB",
             f"<= {FRAME_P99_BYTES // 1024} KB", verdict(r["first_frame"] <= FRAME_P99_BYTES)],
            ["  encode per frame p50 / p99 (plane)", f"{r['encode_p50_ms']:.1f} / {r['encode_p99_ms']:.1f} ms", "",
             verdict(None)],
            ["  decode + snapshot p50 (attached client)", f"{r['decode_p50_ms']:.1f} ms", "", verdict(None)],
        ]
    print_table(f"telemetry: {TASKS:,} tasks, {TRANSITIONS_S:,} transitions/s, {HZ:g} frames/s, "
                f"{len(windows)} windows x {frames} frames", ["figure", "measured", "bound", "result"], rows,
                right=[False, True, True, False])
    write_json(args.json, "telemetry", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
