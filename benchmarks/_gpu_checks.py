"""The GPU benchmark's checks: CuPy computes what NumPy computes, device figures that agree with
``nvidia-smi``, and the product's own commands (a traced run, ``advise``, the GPU tests) on the card.

The decision this module protects: a wrong answer must not hide. Every slot buffer the engine
allocates on the card is poisoned (every byte 0xFF: a NaN in float32) before the run, so an output
element no stage wrote comes back NaN, and each example draws fresh random inputs, so a kernel that
happens to be right on one seed is not taken for right.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from warpdeck.engine.api import Engine, load_spec, select_backend
from warpdeck.engine.backends.cupy_backend import CupyBackend

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SYNTHETIC = ("dense", "conv2d", "spectrogram")
"""The synthetic examples every backend must agree on."""


class PoisonedCupy(CupyBackend):
    """CupyBackend whose every new host and device slot buffer starts as 0xFF bytes (NaN floats)."""

    def host_buffer(self, nbytes: int) -> Any:
        buf = super().host_buffer(nbytes)
        buf.fill(0xFF)
        return buf

    def device_buffer(self, nbytes: int) -> Any:
        buf = super().device_buffer(nbytes)
        buf.fill(0xFF)
        # The fill ran on this thread's current stream, which the lanes' non-blocking streams do not
        # wait for: finish it before a lane can use the buffer.
        self._cp.cuda.get_current_stream().synchronize()
        return buf


class _Collect:
    """A sink that keeps a copy of every output."""

    def __init__(self) -> None:
        self.out: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def write(self, key: str, out: np.ndarray) -> None:
        row = np.array(out, copy=True)
        with self._lock:
            self.out[key] = row


def _run(spec: Any, backend: Any) -> tuple[_Collect, Any]:
    sink = _Collect()

    async def go() -> Any:
        async with Engine(spec, sink=sink, backend=backend, journal=False) as eng:
            return await eng.wait()

    return sink, asyncio.run(go())


def compare(gpu: _Collect, cpu: _Collect) -> dict[str, Any]:
    """||gpu - cpu|| / ||cpu|| over every output (float64), the largest difference, and every element
    the GPU run left unwritten or non-finite."""
    keys = sorted(cpu.out)
    same_keys = sorted(gpu.out) == keys
    if not keys or not same_keys:
        return {"same_keys": same_keys, "outputs": len(keys), "gpu_outputs": len(gpu.out)}
    g = np.concatenate([np.asarray(gpu.out[k], np.float64).ravel() for k in keys])
    c = np.concatenate([np.asarray(cpu.out[k], np.float64).ravel() for k in keys])
    finite = np.isfinite(g)
    diff = np.where(finite, g - c, 0.0)
    return {"same_keys": True, "outputs": len(keys), "elements": int(g.size),
            "nonfinite": int(g.size - np.count_nonzero(finite)),
            "rel_err": float(np.linalg.norm(diff) / max(np.linalg.norm(c), 1e-300)),
            "max_abs_err": float(np.max(np.abs(diff)))}


def check_synthetic(name: str, count: int, seed: int) -> dict[str, Any]:
    """One synthetic example on poisoned CuPy and on NumPy, over the same fresh inputs."""
    spec = load_spec(EXAMPLES / f"{name}-synthetic.toml")
    spec = spec.model_copy(update={"source": spec.source.model_copy(update={"count": count, "seed": seed})})
    gpu, g_rep = _run(spec.model_copy(update={"backend": "cupy"}), PoisonedCupy())
    cpu, c_rep = _run(spec.model_copy(update={"backend": "numpy"}), select_backend("numpy"))
    return {"seed": seed, "done_gpu": g_rep.counts.done, "done_cpu": c_rep.counts.done, "total": g_rep.counts.total,
            "flagged_gpu": g_rep.counts.flagged, **compare(gpu, cpu)}


def check_classify(count: int, seed: int, tf32: bool) -> dict[str, Any]:
    """The torch classifier over a fresh image folder, on poisoned CuPy (torch on the card) and on
    NumPy (torch on the CPU); ``tf32`` leaves torch's default TF32 convolutions on."""
    import torch  # noqa: PLC0415 - the device machine has it; only this check needs it

    from warpdeck.examples.classify import make_images  # noqa: PLC0415 - needs Pillow

    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    with tempfile.TemporaryDirectory() as tmp:
        make_images(tmp, count, seed=seed)
        spec = load_spec(EXAMPLES / "classify-images.toml")
        spec = spec.model_copy(update={"source": spec.source.model_copy(update={"path": Path(tmp)}),
                                       "sink": spec.sink.model_copy()})
        gpu, g_rep = _run(spec.model_copy(update={"backend": "cupy"}), PoisonedCupy())
        cpu, c_rep = _run(spec.model_copy(update={"backend": "numpy"}), select_backend("numpy"))
    torch.backends.cudnn.allow_tf32 = True
    return {"seed": seed, "tf32": tf32, "done_gpu": g_rep.counts.done, "done_cpu": c_rep.counts.done,
            "total": g_rep.counts.total, "flagged_gpu": g_rep.counts.flagged, **compare(gpu, cpu)}


# -- device figures ---------------------------------------------------------------------------------
def smi(fields: str) -> list[str]:
    """One ``nvidia-smi --query-gpu`` line, split."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return [v.strip() for v in out.splitlines()[0].split(",")]


def check_nvml(cp: Any, seconds: float = 4.0) -> dict[str, Any]:
    """The heartbeat's sampler (``NvmlSampler``) beside ``nvidia-smi``, read at the same moment
    while a kernel keeps the card busy on another thread."""
    from _gpu_work import fma_kernel  # noqa: PLC0415 - benchmarks/ is on sys.path

    from warpdeck.engine.control.heartbeat import NvmlSampler  # noqa: PLC0415

    stop = threading.Event()

    def load() -> None:
        with cp.cuda.Stream(non_blocking=True) as s:
            x = cp.ones(1 << 24, cp.float32)
            y = cp.empty_like(x)
            k = fma_kernel(cp)
            while not stop.is_set():
                k(x, np.float32(1), np.float32(0), np.int32(2000), y)
                s.synchronize()

    busy = threading.Thread(target=load, daemon=True)
    busy.start()
    sampler = NvmlSampler(0)
    pairs = []
    try:
        time.sleep(1.5)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            ours = sampler()
            theirs = smi("utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw")
            pairs.append({"sampler": ours.model_dump() if ours is not None else None, "nvidia_smi": theirs,
                          "sampler_s": time.perf_counter() - t})
            time.sleep(0.5)
    finally:
        stop.set()
        busy.join(10)
    cost = []
    for _ in range(20):
        t = time.perf_counter()
        sampler()
        cost.append(time.perf_counter() - t)
    return {"available": sampler.available, "pairs": pairs, "sample_ms_median": float(np.median(cost)) * 1e3}


def check_heartbeat_stats(name: str, batches: int, batch: int) -> dict[str, Any]:
    """A run with the control plane on (the embedded broker): the device figures the engine's
    own heartbeats carry, as the snapshot's worker row shows them while the card is busy."""
    from _gpu_runners import warpdeck_spec  # noqa: PLC0415
    from _gpu_work import StampSink, StampSource  # noqa: PLC0415

    from warpdeck.engine.api import ControlSettings  # noqa: PLC0415

    spec = warpdeck_spec(name, batches, batch, 2)
    seen: list[dict[str, Any]] = []

    async def go() -> Any:
        eng = Engine(spec, source=StampSource(batches * batch), sink=StampSink(), backend=select_backend("cupy"),
                     journal=False, control=ControlSettings())
        async with eng:
            waiter = asyncio.ensure_future(eng.wait())
            while not waiter.done():
                snap = eng.snapshot()
                for w in snap.workers:
                    if w.util_pct is not None:
                        seen.append({"t": time.perf_counter(), "util_pct": w.util_pct, "mem_used_mb": w.mem_used_mb,
                                     "temp_c": getattr(w, "temp_c", None), "power_w": getattr(w, "power_w", None)})
                await asyncio.wait({waiter}, timeout=0.25)
            return waiter.result()

    report = asyncio.run(go())
    return {"status": report.status, "done": report.counts.done, "samples": seen[-8:], "count": len(seen),
            "max_util_pct": max((s["util_pct"] for s in seen), default=None)}


# -- the product's commands on the card -------------------------------------------------------------
def command(args: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m warpdeck.cli.main ARGS`` (or ``args`` as given when it starts with '-m pytest');
    its exit status, time and the tail of its output."""
    argv = [sys.executable, *args]
    t = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                           env={**os.environ, **(env or {})}, check=False)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = -1, f"timed out after {timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    return {"argv": shlex.join(args), "rc": rc, "s": time.perf_counter() - t, "tail": out[-3000:]}


def traced_run(out: Path, spec: str = "examples/dense-synthetic.toml") -> dict[str, Any]:
    """``warpdeck run SPEC --headless --backend cupy --trace`` as a user types it; the report's
    figures and a look at the trace (events per phase)."""
    run_dir = Path(tempfile.mkdtemp(prefix="wd-gpu-"))
    trace, report = out / "trace-dense-cupy.json", out / "report-dense-cupy.json"
    res = command(["-m", "warpdeck.cli.main", "run", spec, "--headless", "--backend", "cupy",
                   "--run-dir", str(run_dir), "--trace", str(trace), "--json", str(report)], timeout=120)
    if report.exists():
        rep = json.loads(report.read_text())
        res["report"] = {k: rep.get(k) for k in ("status", "backend", "device", "device_busy", "bottleneck",
                                                  "throughput_tasks_s", "overlap_efficiency", "phase_clocks",
                                                  "mean_phase_s", "first_batch_s")}
    if trace.exists():
        doc = json.loads(trace.read_text())
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        names: dict[str, int] = {}
        for e in events:
            if e.get("ph") == "X":
                names[e.get("name", "")] = names.get(e.get("name", ""), 0) + 1
        res["trace"] = {"bytes": trace.stat().st_size, "events": len(events), "spans_by_name": names}
    return res
