"""Images: the classifier example over an image folder, warpdeck against a hand-tuned DataLoader.

The workload is ``examples/classify-images.toml``'s: images written by the example's own
``make_images`` (2,000 of 256-512 px by default: RGB, grey and RGBA, PNG and JPEG) into a temporary
folder, each decoded with Pillow to RGB, scaled to cover 64x64 and centre-cropped (bilinear),
float32 in [0, 1], channels first; the compute is the example's CNN (``make_model``, ``classify``),
batches of 64, outputs discarded. Decoding is CPU work, so on a small machine the cores, not the
model, are likely the bound: the figures say which.

Runners (same process, same folder, one full pass each):
  warpdeck    NumPy backend, 1 lane, the spec's defaults: no host threads pinned, the autotuner
              on; the image source decodes on the lane's fill threads
  pinned      as warpdeck, with [host] fill_workers = 2 (one per core): a diagnostic of the
              tuner's choice, not judged
  processes   as warpdeck, with [host] fill_pool = "processes": each fill thread's batch decoded
              by a warm worker process straight into the slot's shared memory; tuned, and pinned at 2
  dataloader  torch DataLoader(batch_size=64) over a Dataset that decodes one image the same way
              with Pillow; the model in the main process; num_workers tuned by hand: the best of
              0, 1, 2 and 4 (each a full pass)

Before any runner, one untimed forward pass of the model and one image of each format decoded, so
the first runner does not pay the process's first-call costs alone. Both call
``torch.set_num_threads(1)`` first: the model's own threads would otherwise compete with
decoding for the same cores. Rate: images / wall seconds of the whole pass (start-up included, the
same for both). Device busy: compute's share of the wall time from the first compute's start to the
last one's end (warpdeck: ``report.device_busy``; DataLoader: ``perf_counter`` around the model).

    python benchmarks/images.py [--quick] [--count N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from _common import print_table, verdict, write_json

from warpdeck.engine.api import Engine, parse_spec

BATCH = 64
SIZE = 64
SIZES = (256, 512)
DL_WORKERS = (0, 1, 2, 4)
PINNED_FILL = 2
SHARED_LOAD = 1.5  # load average above which the figures are marked as taken on a shared machine


def run_warpdeck(folder: Path, fill: int | None = None, pool: str = "threads") -> dict[str, Any]:
    """One engine run over ``folder`` in a fresh run directory: the spec's defaults, or ``fill``
    threads pinned (the tuner then leaves the fill alone); ``pool = "processes"``: the fill in worker
    processes (``host.fill_pool``), one per fill thread."""
    host: dict[str, Any] = {"fill_pool": pool}
    if fill is not None:
        host["fill_workers"] = fill
    spec = parse_spec({
        "name": "bench-images", "backend": "numpy", "batch_size": BATCH,
        "source": {"kind": "images", "path": str(folder), "size": [SIZE, SIZE], "mode": "RGB",
                   "dtype": "float32", "layout": "CHW", "resize": "crop"},
        "sink": {"kind": "null"},
        "stages": [{"fn": "warpdeck.examples.classify:classify", "framework": "torch",
                    "factory": "warpdeck.examples.classify:make_model", "out_shape": [10], "out_dtype": "float32"}],
        "host": host,
    })

    async def go(run_dir: str) -> Any:
        async with Engine(spec, run_dir) as eng:
            return await eng.wait()

    with tempfile.TemporaryDirectory(prefix="wd-bench-") as run_dir:
        t0 = time.perf_counter()
        report = asyncio.run(go(run_dir))
        wall = time.perf_counter() - t0
    if report.status != "finished" or report.counts.failed:
        raise RuntimeError(f"warpdeck run did not finish cleanly: {report.status} {report.counts}")
    return {"images": report.counts.done, "wall_s": wall, "images_s": report.counts.done / wall,
            "steady_tasks_s": report.steady_tasks_s, "device_busy": report.device_busy,
            "bottleneck": report.bottleneck, "bottleneck_phase": report.bottleneck_phase,
            "host_threads": report.host_threads, "slot_depth": report.slot_depth,
            "mean_phase_s": report.mean_phase_s, "tuning": list(report.tuning)}


def warm_up(paths: list[Path]) -> None:
    """What the first runner would pay alone: the model's first forward pass (torch's lazy set-up)
    and Pillow's first decode of each format (its plugins load on first use). Measured on the 2-core
    VM, the first runner in a process ran about 10 % slower than the same runner after it."""
    import torch  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    from warpdeck.examples import classify  # noqa: PLC0415

    model = classify.make_model()
    with torch.inference_mode():
        classify.classify(model, torch.zeros((BATCH, 3, SIZE, SIZE)), torch.empty((BATCH, classify.CLASSES)))
    for suffix in sorted({p.suffix for p in paths}):
        with Image.open(next(p for p in paths if p.suffix == suffix)) as img:
            img.load()


def run_dataloader(paths: list[Path], workers: int) -> dict[str, Any]:
    """One pass of DataLoader(num_workers=workers); the model in this process."""
    import torch  # noqa: PLC0415 - optional, like the example itself
    from PIL import Image, ImageOps  # noqa: PLC0415
    from torch.utils.data import DataLoader, Dataset  # noqa: PLC0415

    from warpdeck.examples import classify  # noqa: PLC0415

    class Folder(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return len(paths)

        def __getitem__(self, i: int) -> torch.Tensor:
            with Image.open(paths[i]) as img:
                fixed = ImageOps.fit(img.convert("RGB"), (SIZE, SIZE), Image.Resampling.BILINEAR)
            a = np.asarray(fixed, dtype=np.uint8).transpose(2, 0, 1)
            return torch.from_numpy(np.divide(a, np.float32(255.0), dtype=np.float32))

    # More workers than cores is part of the hand tuning; torch warns each time.
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    t0 = time.perf_counter()
    model = classify.make_model()
    loader = DataLoader(Folder(), batch_size=BATCH, num_workers=workers)
    spans: list[tuple[float, float]] = []
    done = 0
    for x in loader:
        a = time.perf_counter()
        out = torch.empty((len(x), classify.CLASSES))
        with torch.inference_mode():
            classify.classify(model, x, out)
        spans.append((a, time.perf_counter()))
        done += len(x)
    wall = time.perf_counter() - t0
    span = spans[-1][1] - spans[0][0]
    busy = sum(b - a for a, b in spans) / span if span > 0 else 0.0
    return {"images": done, "wall_s": wall, "images_s": done / wall, "device_busy": busy, "num_workers": workers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="400 images instead of 2,000")
    ap.add_argument("--count", type=int, help="how many images (overrides --quick)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        print("images.py needs torch and Pillow: pip install 'warpdeck[images,torch]'", file=sys.stderr)
        return 2
    from warpdeck.examples import classify  # noqa: PLC0415

    torch.set_num_threads(1)
    n = args.count or (400 if args.quick else 2000)
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wd-bench-images-") as tmp:
        folder = Path(tmp)
        g0 = time.perf_counter()
        paths = classify.make_images(folder, n, seed=0, sizes=SIZES)
        gen_s = time.perf_counter() - g0
        mb = sum(p.stat().st_size for p in paths) / 1e6
        warm_up(paths)
        wd = run_warpdeck(folder)
        pinned = run_warpdeck(folder, fill=PINNED_FILL)
        procs = run_warpdeck(folder, pool="processes")
        procs_pinned = run_warpdeck(folder, fill=PINNED_FILL, pool="processes")
        dls = {w: run_dataloader(paths, w) for w in DL_WORKERS}
    best = max(dls, key=lambda w: dls[w]["images_s"])
    dl = dls[best]
    load_after = os.getloadavg()[0]
    ratio = wd["images_s"] / dl["images_s"]
    rows = [
        [f"dataloader, {best} workers (best of {', '.join(map(str, DL_WORKERS))})", f"{dl['images_s']:.1f}",
         f"{dl['wall_s']:.2f}", f"{dl['device_busy']:.3f}", "", "", verdict(None)],
        ["warpdeck (defaults, tuner on)", f"{wd['images_s']:.1f}", f"{wd['wall_s']:.2f}",
         f"{wd['device_busy']:.3f}", f"{ratio:.3f}", "> 1.00", verdict(ratio > 1.0)],
        [f"warpdeck, fill pinned at {PINNED_FILL} (diagnostic)", f"{pinned['images_s']:.1f}", f"{pinned['wall_s']:.2f}",
         f"{pinned['device_busy']:.3f}", f"{pinned['images_s'] / dl['images_s']:.3f}", "", verdict(None)],
        ["warpdeck, fill in processes (tuner on)", f"{procs['images_s']:.1f}", f"{procs['wall_s']:.2f}",
         f"{procs['device_busy']:.3f}", f"{procs['images_s'] / dl['images_s']:.3f}", ">= 0.98",
         verdict(procs["images_s"] / dl["images_s"] >= 0.98)],
        [f"warpdeck, fill in {PINNED_FILL} processes", f"{procs_pinned['images_s']:.1f}",
         f"{procs_pinned['wall_s']:.2f}", f"{procs_pinned['device_busy']:.3f}",
         f"{procs_pinned['images_s'] / dl['images_s']:.3f}", ">= 0.98",
         verdict(procs_pinned["images_s"] / dl["images_s"] >= 0.98)],
    ]
    print_table(
        f"images: {n} images of {SIZES[0]}-{SIZES[1]} px ({mb:.0f} MB, PNG and JPEG) -> {SIZE}x{SIZE} RGB float32 CHW, "
        f"batches of {BATCH}, the classify example's CNN, torch threads 1, {cores} cores; "
        "rate = images / wall seconds of the whole pass",
        ["runner", "images/s", "wall s", "busy", "/ dataloader", "target", "result"],
        rows, right=[False, True, True, True, True, False, False])
    print("  dataloader num_workers " + "  ".join(
        f"{w}: {r['images_s']:.1f}/s busy {r['device_busy']:.2f}" for w, r in dls.items()) + f"  (best: {best})")
    threads = "  ".join(f"lane {k}: fill {v['fill']} sink {v['sink']}" for k, v in wd["host_threads"].items())
    ph = " ".join(f"{k} {v * 1e3:.2f}" for k, v in wd["mean_phase_s"].items())
    print(f"  warpdeck: {threads}; depth {wd['slot_depth']}; steady {wd['steady_tasks_s']:.1f} tasks/s; "
          f"phase means (ms per batch) {ph}")
    print(f"  warpdeck {wd['bottleneck'] or 'bottleneck: (none reported)'}")
    ph = " ".join(f"{k} {v * 1e3:.2f}" for k, v in pinned["mean_phase_s"].items())
    print(f"  pinned: phase means (ms per batch) {ph}; {pinned['bottleneck'] or 'bottleneck: (none reported)'}")
    for label, r in (("processes", procs), (f"{PINNED_FILL} processes", procs_pinned)):
        ph = " ".join(f"{k} {v * 1e3:.2f}" for k, v in r["mean_phase_s"].items())
        threads = "  ".join(f"fill {v['fill']} sink {v['sink']}" for v in r["host_threads"].values())
        print(f"  {label}: {threads}; phase means (ms per batch) {ph}; {r['bottleneck'] or '(no bottleneck reported)'}")
    for t in wd["tuning"][-4:]:
        print(f"  tuner: {t}")
    shared = max(load_before, load_after) > SHARED_LOAD
    print(f"images written in {gen_s:.1f} s; load average {load_before:.2f} before, {load_after:.2f} after; "
          f"{time.perf_counter() - t0:.0f} s"
          + (f" (shared machine: load average above {SHARED_LOAD})" if shared else ""))
    write_json(args.json, "images", {"count": n, "sizes": list(SIZES), "batch_size": BATCH, "cores": cores,
                                     "generate_s": gen_s, "megabytes": mb, "warpdeck": wd, "warpdeck_pinned": pinned,
                                     "warpdeck_processes": procs, "warpdeck_processes_pinned": procs_pinned,
                                     "dataloader": {str(w): r for w, r in dls.items()}, "dataloader_best": best,
                                     "load_average": [load_before, load_after]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
