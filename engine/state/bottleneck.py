"""The bottleneck, named: which phase holds the device back, and what to change.

The decisions this module protects:
- The question a user asks is "is my device busy, and if not, why, and what do I change?". The
  answer names one phase, its time per batch and its threads, the device's busy share, and one
  action that fits why the phase cannot go faster: the tuner is still adding threads; the phase
  is at its thread cap, the CPU budget or does not speed up with threads (CPU- or GIL-bound);
  the count is pinned in the spec; or the device itself is the bound, said only when it is busy
  at least 90 % of the time (issue 31): a device that is the slowest phase but idles more is
  held by what the run measured it waiting for (inputs, the sink) or by the engine's own loop.
  No phase is named when even the one with the least capacity ran under half of the time: its
  threads idle, so neither more of them nor a faster phase would help (a no-op run at batch 1 was
  told "sink at its cap: add cores" with its sink busy 2 % of the time).
- How many threads a host phase could have (``HostThreads``) is the tuner's knowledge; the
  figures only read it, so this module imports nothing of the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEVICE_BOUND", "DeviceWaits", "HostThreads", "ThreadCap", "describe_bottleneck", "describe_engine_bound",
           "more_lanes_words"]

_NO_GAIN = 1.05
"""Below this speedup more lanes are not worth offering."""
_HELD_BY = {"cores": "the cores are busy", "device": "the device is busy"}

ThreadCap = Literal["tuned", "pinned", "max", "cpu", "saturated", "memory", "depth", "idle"]
"""Why a host phase has no more threads: still tuned (``tuned``), pinned by the spec, at the tuner's ``max_workers``, at
the CPU budget, shown not to speed up with threads (``saturated``), out of memory for the slot another thread needs,
held by a depth an operator set, or idle most of the time (``idle``: what hands it work is slower)."""


@dataclass(frozen=True, slots=True)
class HostThreads:
    """One host phase of one lane: its threads now, the most it may reach (never below the most
    it has had: the bound counts the work those did), and why not more."""

    now: int
    cap: int
    why: ThreadCap = "tuned"
    processes: bool = False
    """Each thread hands its work to a worker process of its own (``[host] fill_pool``, ``sink_pool``)."""


_ADVICE: dict[ThreadCap, str] = {
    "tuned": "the tuner is adding {phase} {units}",
    "pinned": "{phase} {units} pinned at {now} in the spec ([host] {phase}_workers): raise or remove it",
    "max": "{phase} at max_workers ({now}): raise [host] max_workers",
    "cpu": "{phase} parallelism at its cap ({cores:g} cores): add cores or a faster {phase}",
    "saturated": "{phase} does not speed up with more {units} (CPU- or GIL-bound): a faster {phase}, "
                 "or fewer, larger writes/reads",
    "memory": "no memory for the slot another {phase} {unit} needs: raise [feeder] memory_budget_mb",
    "depth": "the depth set by hand leaves no slot for another {phase} {unit}: raise it (+)",
    "idle": "its {units} idle most of the time, so another would too",
}


@dataclass(frozen=True, slots=True)
class DeviceWaits:
    """What the device waited for over the run: the seconds its batches were stalled for inputs
    (``memory``) and for room in the sink (``backpressure``), and the engine loop's own time per
    batch, to say what keeps a device that is the slowest phase from being busy."""

    memory_s: float
    backpressure_s: float
    loop_ms_per_batch: float


DEVICE_BOUND = 0.9
"""Below this busy share a device is not "the bound": something the run measured kept it waiting."""
_WAITED_S = 0.01
"""Stalls shorter than this over a whole run are noise, not a cause."""


def _idle_words(waits: DeviceWaits | None) -> str:
    if waits is None:
        return "not the device alone"
    if waits.memory_s >= max(waits.backpressure_s, _WAITED_S):
        return (f"it waited {waits.memory_s:.1f} s for inputs (the tuner adding fill threads or slots, "
                "or loads slower at times than compute)")
    if waits.backpressure_s >= _WAITED_S:
        return f"it waited {waits.backpressure_s:.1f} s for the sink to free an output slot"
    return _loop_words(waits)


def _loop_words(waits: DeviceWaits) -> str:
    return (f"the gaps between batches are the engine's own (its loop: {waits.loop_ms_per_batch:.2g} ms per batch): "
            "larger batches")


def describe_bottleneck(phase: str, ms_per_batch: float, threads: HostThreads | None, device_busy: float,
                        cores: float, memory_stall: bool = False, waits: DeviceWaits | None = None) -> str:
    """One line: the bottleneck, the device's busy share and what to do. ``threads`` is None for a
    device phase (h2d, compute, d2h: one ordered stream each). Compute is "the bound" only with the
    device busy at least ``DEVICE_BOUND``; below, the line says what it waited for (``waits``)."""
    busy = f"device busy {device_busy:.0%}"
    if phase == "compute":
        if device_busy >= DEVICE_BOUND:
            return (f"bottleneck: compute {ms_per_batch:.3g} ms/batch; {busy}: the device is the bound "
                    "(a faster stage or another device)")
        under = f"under {DEVICE_BOUND:.0%}"
        return f"bottleneck: compute {ms_per_batch:.3g} ms/batch; {busy}, {under}: {_idle_words(waits)}"
    if threads is None:
        return (f"bottleneck: {phase} {ms_per_batch:.3g} ms/batch; {busy}: copies are the bound "
                "(larger batches, or pinned memory on a GPU)")
    n = threads.now
    unit, units = ("process", "processes") if threads.processes else ("thread", "threads")
    head = f"bottleneck: {phase} {ms_per_batch:.3g} ms/batch on {n} {unit if n == 1 else units}; {busy}"
    advice = _ADVICE[threads.why].format(phase=phase, now=n, cores=cores, unit=unit, units=units)
    if threads.why == "saturated" and not threads.processes:
        if phase == "fill":
            advice += '; where it holds the GIL, [host] fill_pool = "processes" loads on every core'
        elif phase == "sink":
            advice += '; where it holds the GIL, [host] sink_pool = "processes" writes on every core'
    if memory_stall and threads.why == "tuned":
        advice += " (the device waits for inputs meanwhile)"
    return f"{head}; {advice}"


_FED_SLOWLY = 0.25
"""Lanes that waited for batches this share of the run were held by their inputs, not the loop."""


def describe_engine_bound(busiest: str, ran: float, device_busy: float, waits: DeviceWaits, elapsed_s: float) -> str:
    """One line for a run whose phases all idle most of the time: the busiest (``busiest``) ran only
    ``ran`` of it, so no phase holds the device; what hands them work does: the source, where the
    lanes waited for batches at least a quarter of the ``elapsed_s`` run, else the engine's loop."""
    if waits.memory_s >= _FED_SLOWLY * elapsed_s:
        why = (f"the lanes waited {waits.memory_s:.1f} s for batches: the source or the feeder "
               "(a faster source, or a higher [feeder] high_watermark)")
    else:
        why = _loop_words(waits)
    return f"bottleneck: none of the phases (the busiest, {busiest}, ran {ran:.0%} of the time); device busy " \
           f"{device_busy:.0%}: {why}"


def more_lanes_words(amdahl: Mapping[str, float], limit: str) -> str:
    """What more lanes could give (``Figures.amdahl``: lanes+1, twice the lanes, any number) in
    words, and what caps it (``Figures.lanes_limit``): ``more lanes: at most 3 → ×1.49, ∞ → ×2.10
    (the cores are busy)``, or ``more lanes: no gain (the cores are busy)`` where none is worth it."""
    if not amdahl:
        return "more lanes: — (no batch done yet)"
    held = f" ({_HELD_BY[limit]})" if limit in _HELD_BY else ""
    if max(amdahl.values()) < _NO_GAIN:
        return f"more lanes: no gain{held or ' (the serial work holds the run)'}"
    gains = ", ".join(f"{k.removeprefix('p=').replace('inf', '∞')} → ×{v:.2f}" for k, v in amdahl.items())
    return f"more lanes: at most {gains}{held}"
