"""A run as a Trace Event Format file for Perfetto and chrome://tracing (``--trace FILE``).

The decisions this module protects:
- The file is the format's JSON Array Format, written while the run goes: ``[``, then one event per
  line, every line after the first opening with a comma, written out at least every second. The
  format lets the closing ``]`` be missing, so a run killed with SIGKILL leaves a trace that loads
  up to its last write (drop a cut-off last line, add ``]``).
- Perfetto draws no overlapping slices on one thread, and fill and sink run on thread pools: a lane's
  phase gets another thread ("lane 0 · fill #2") whenever a slice would overlap the ones before.
- A trace of any run stays loadable: the first ``WHOLE_BATCHES`` batches are written whole, then one
  in 2, one in 4... (``SAMPLED_BATCHES`` more each time), picked by a hash of the batch id so a
  batch's stalls go with it and no lane is favoured; counters halve their rate every ``COUNTER_STAGE``
  samples; past ``MAX_BYTES`` nothing more is written. The file says so itself: the bound in the
  first event's args, an instant where sampling starts or doubles, a "batches skipped" counter.
- An exporter never stops a run: a write that fails (a full disk) is logged once and the writer goes
  quiet; nothing it does raises into the engine's loop. It is quick there: an event becomes a line
  of text in a buffer, and the file is written once a second (or per ``FLUSH_LINES``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import IO

from warpdeck.engine.state.run_events import (
    BatchFinished,
    CommandEvent,
    RunEvent,
    StallEvent,
    WorkerConvicted,
    WorkerGone,
    WorkerReborn,
    WorkerWaiting,
)
from warpdeck.engine.state.snapshot import EngineSnapshot, WorkerView
from warpdeck.engine.state.task_states import RUN_PHASES

__all__ = ["COUNTER_STAGE", "MAX_BYTES", "SAMPLED_BATCHES", "WHOLE_BATCHES", "TraceWriter", "lane_owners"]

log = logging.getLogger(__name__)

WHOLE_BATCHES = 16_384
"""Batches written whole before sampling starts (a million tasks in batches of 64 fit)."""
SAMPLED_BATCHES = 8_192
"""Batches written at each stride after that, before the stride doubles."""
COUNTER_STAGE = 16_384
"""Counter samples (at most 4 a second) at each rate before the rate halves."""
MAX_BYTES = 128 * 2**20
"""Past this many bytes the trace takes nothing more (Perfetto's UI loads a few hundred MB)."""
FLUSH_S = 1.0
FLUSH_LINES = 5000
"""Lines buffered before a write, whatever the time (about 1 MB)."""
_COUNTER_S = 0.25
_MAX_TRACKS = 32
"""Threads one lane's phase may get for overlapping slices (the host pools' threads)."""
_PHASES = tuple(p.label for p in RUN_PHASES)
_STALLS = len(RUN_PHASES) + 1  # the row after the phases: a lane's stalls
_ENGINE = 0  # pid and tid of the engine's own track: counters, commands, queue-wide instants
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_MASK64 = 2**64 - 1


def _tid(lane: int, row: int, track: int) -> int:
    """Threads sort as lane, then phase in pipeline order (fill ... sink, stalls), then track."""
    return (lane + 1) * 1000 + row * 100 + track


def _us(seconds: float) -> str:
    """Microseconds as the format counts them, to the nanosecond (never before the run's start)."""
    return f"{max(seconds, 0.0) * 1e6:.3f}"


def _ts(seconds: float) -> float:
    return round(max(seconds, 0.0) * 1e6, 3)


def _picked(batch: int, stride: int) -> bool:
    """One batch in ``stride`` (a power of two), by a multiplicative hash of its id."""
    return (((batch * 0x9E3779B97F4A7C15) & _MASK64) >> 32) & (stride - 1) == 0


def lane_owners(snap: EngineSnapshot) -> dict[int, WorkerView]:
    """Which worker holds each lane, where the snapshot tells it: lanes are handed to workers in
    blocks, in the workers' order (engine/engine.py); {} where the counts do not add up."""
    workers = [w for w in snap.workers if w.lanes > 0]
    lanes = sorted(ln.id for ln in snap.lanes)
    if sum(w.lanes for w in workers) != len(lanes):
        return {}
    owners = [w for w in workers for _ in range(w.lanes)]
    return dict(zip(lanes, owners, strict=True))


class _Layout:
    """Processes and threads: pid 0 the engine, one per worker; a thread per lane, phase and track.
    Names are written the first time a process or thread is used."""

    def __init__(self, lines: list[str]) -> None:
        self._lines = lines
        self._pids: dict[str, int] = {}
        self.lane_pid: dict[int, int] = {}
        self._named: set[tuple[int, int]] = set()
        self._tracks: dict[tuple[int, int, int], list[float]] = {}

    def meta(self, name: str, pid: int, tid: int, args: dict[str, object]) -> None:
        self._lines.append(_JSON.encode({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}))

    def worker(self, worker: str) -> int:
        pid = self._pids.get(worker)
        if pid is None:
            pid = self._pids[worker] = len(self._pids) + 1
            self.meta("process_name", pid, 0, {"name": f"worker {worker}"})
            self.meta("process_sort_index", pid, 0, {"sort_index": pid})
        return pid

    def pid_of(self, lane: int) -> int:
        return self.lane_pid.get(lane, _ENGINE) if lane >= 0 else _ENGINE

    def thread(self, pid: int, lane: int, row: int) -> int:
        """``lane``'s first thread of ``row`` (a phase, or its stalls); the first use of a lane in a
        process names all its threads, so a lane shows every phase in order."""
        if (pid, lane) not in self._named:
            self._named.add((pid, lane))
            rows = range(1, _STALLS + 1) if lane >= 0 else (_STALLS,)
            for r in rows:
                self._name(pid, lane, r, 0)
        return _tid(lane, row, 0)

    def track(self, pid: int, lane: int, row: int, start: float, end: float) -> int:
        """The thread for a slice of ``lane``'s ``row`` that overlaps no slice already there, opened
        if need be (slices of one thread come in start order: batch order, per lane)."""
        self.thread(pid, lane, row)
        ends = self._tracks.setdefault((pid, lane, row), [0.0])
        i = next((i for i, e in enumerate(ends) if e <= start), -1)
        if i < 0 and len(ends) < _MAX_TRACKS:
            i = len(ends)
            ends.append(0.0)
            self._name(pid, lane, row, i)
        elif i < 0:  # more than a pool's threads at once: overlap the track that frees first
            i = min(range(len(ends)), key=ends.__getitem__)
        ends[i] = max(ends[i], end)
        return _tid(lane, row, i)

    def _name(self, pid: int, lane: int, row: int, track: int) -> None:
        what = _PHASES[row - 1] if row < _STALLS else "stalls"
        name = f"{'queue' if lane < 0 else f'lane {lane}'} · {what}" + (f" #{track + 1}" if track else "")
        tid = _tid(lane, row, track)
        self.meta("thread_name", pid, tid, {"name": name})
        self.meta("thread_sort_index", pid, tid, {"sort_index": tid})


class TraceWriter:
    """Writes one run's trace to ``path`` as it goes. ``on_event`` and ``on_snapshot`` are called on
    the engine's loop; ``close`` after them, from any thread (a lock keeps it from cutting into a
    callback still under way). Opening raises ``OSError`` (a usage error: nothing ran yet); after
    that nothing raises."""

    def __init__(self, path: Path, pipeline: str) -> None:
        self.path = path
        self.events = 0
        self.batches_seen = 0
        self.batches_written = 0
        self.stride = 1
        self.nbytes = 0
        self._in_stride = 0
        self._origin: float | None = None
        self._made = time.perf_counter()
        self._buf: list[str] = []
        self._layout = _Layout(self._buf)
        self._counters: dict[str, tuple[float, ...]] = {}
        self._queue_stalls: dict[str, float] = {}
        self._samples = 0
        self._next_sample = 0.0
        self._flushed = time.monotonic()
        self._quiet = False
        self._full = False
        self._closed = False
        self._lock = threading.Lock()
        self._file: IO[str] | None = path.open("w", encoding="utf-8")
        bound = {"whole_batches": WHOLE_BATCHES, "then": "1 batch in 2, 4, 8 ... (a hash of its id), "
                 f"{SAMPLED_BATCHES} batches at each rate", "counters": f"at most 4 Hz, halved every "
                 f"{COUNTER_STAGE} samples", "max_bytes": MAX_BYTES, "clock": "µs from the run's start"}
        self._layout.meta("process_name", _ENGINE, _ENGINE, {"name": f"warpdeck · {pipeline}", "trace": bound})
        self._layout.meta("process_sort_index", _ENGINE, _ENGINE, {"sort_index": 0})
        self._layout.meta("thread_name", _ENGINE, _ENGINE, {"name": "engine"})
        try:  # the only place a failed write raises: the run has not started
            self._file.write("[\n" + self._buf.pop(0) + "\n")
            self.events = 1
            self._flush()
        except BaseException:
            with contextlib.suppress(OSError):
                self._file.close()
            raise

    # -- the engine's loop -------------------------------------------------------------------------
    def on_event(self, event: RunEvent) -> None:
        """One event of the run as trace events."""
        if self._quiet or self._full:
            return
        with self._lock:
            try:
                self._event(event)
                self._maybe_flush()
            except Exception as exc:  # noqa: BLE001 - nothing may reach the engine (a full disk included)
                self._give_up(exc)

    def on_snapshot(self, snap: EngineSnapshot) -> None:
        """The counters, at most 4 Hz of the run's time (fewer as the run grows)."""
        if self._quiet or self._full:
            return
        with self._lock:
            try:
                if self._origin is None:
                    self._origin = snap.t0
                if snap.t >= self._next_sample:
                    self._counters_of(snap)
                self._maybe_flush()
            except Exception as exc:  # noqa: BLE001 - the publisher calls us bare: nothing may raise into the run
                self._give_up(exc)

    def close(self, last: EngineSnapshot | None) -> None:
        """Write the last counters and what the trace holds, close the array and the file."""
        if last is not None and not self._closed:
            self._next_sample = 0.0
            self.on_snapshot(last)
        with self._lock:  # a front end may close from its own thread while a callback is under way
            self._close(last)

    def _close(self, last: EngineSnapshot | None) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._quiet:
            try:
                self._instant("trace end", _ENGINE, _ENGINE, "g", self._end_time(last), {
                    "batches_seen": self.batches_seen, "batches_written": self.batches_written,
                    "stride": self.stride, "bytes": self.nbytes + sum(len(line) + 2 for line in self._buf),
                    "full": self._full}, force=True)
                self._buf.append("]")
                self._flush()
            except Exception as exc:  # noqa: BLE001 - close runs as the run ends: log, never raise
                self._give_up(exc)
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                log.warning("trace %s: closing it failed", self.path, exc_info=True)
            self._file = None

    # -- events -----------------------------------------------------------------------------------
    def _event(self, event: RunEvent) -> None:
        match event:
            case BatchFinished():
                self._batch(event)
            case StallEvent():
                self._stall(event)
            case CommandEvent():
                self._instant(event.verb, _ENGINE, _ENGINE, "g", event.t, {
                    "applied": event.applied, "tasks": event.tasks, "message": event.message}, cat="command")
            case WorkerConvicted():
                self._instant(f"worker {event.worker} convicted", _ENGINE, _ENGINE, "g", event.t, {
                    "worker": event.worker, "epoch": event.epoch, "cause": event.cause, "batches": event.batches,
                    "tasks": event.tasks}, cat="worker")
            case WorkerReborn() | WorkerWaiting() | WorkerGone():  # back, waiting for room, gone
                what = {WorkerReborn: "back", WorkerWaiting: "waiting", WorkerGone: "gone"}[type(event)]
                self._instant(f"worker {event.worker} {what}", _ENGINE, _ENGINE, "g", event.t,
                              {k: getattr(event, k) for k in event.__slots__ if k != "t"}, cat="worker")

    def _batch(self, ev: BatchFinished) -> None:
        rec = ev.record
        self.batches_seen += 1
        if not _picked(rec.batch, self.stride):
            return
        origin = self._origin_for(rec.start)
        layout = self._layout
        pid = layout.lane_pid[rec.lane] = layout.worker(ev.worker)
        args = _JSON.encode({"batch": rec.batch, "tasks": rec.tasks, "bytes": rec.nbytes, "key": rec.key,
                             "ok": rec.ok, "slot": rec.slot, "epoch": ev.epoch})  # the process names the worker
        for row, (name, (t0, t1)) in enumerate(zip(_PHASES, rec.phases, strict=True), start=1):
            if not t0:
                continue  # a phase the batch never reached
            tid = layout.track(pid, rec.lane, row, t0, t1)
            self._buf.append(f'{{"ph":"X","name":"{name}","cat":"batch","pid":{pid},"tid":{tid},'
                             f'"ts":{_us(t0 - origin)},"dur":{_us(t1 - t0)},"args":{args}}}')
        self.batches_written += 1
        self._in_stride += 1
        if self._in_stride >= (WHOLE_BATCHES if self.stride == 1 else SAMPLED_BATCHES):
            self._in_stride = 0
            self.stride *= 2
            self._instant(f"trace sampled: 1 batch in {self.stride}", _ENGINE, _ENGINE, "g", rec.end, {
                "after_batch": rec.batch, "batches_seen": self.batches_seen,
                "batches_written": self.batches_written}, cat="trace")

    def _stall(self, ev: StallEvent) -> None:
        if ev.batch >= 0 and not _picked(ev.batch, self.stride):
            return
        pid = self._layout.pid_of(ev.lane)
        args: dict[str, object] = {"tasks": ev.tasks}
        if ev.note:
            args["note"] = ev.note
        if ev.batch >= 0:
            args["batch"] = ev.batch
        if ev.began:  # an instant: on the lane's stalls thread, or the engine's for the queue
            scope, tid = ("t", self._layout.thread(pid, ev.lane, _STALLS)) if ev.lane >= 0 else ("p", _ENGINE)
            self._instant(ev.reason, pid, tid, scope, ev.t, args, cat="stall")
            if ev.lane < 0:
                self._queue_stalls[ev.reason] = ev.t
            return
        # A batch's stall says how long it lasted; a queue-wide one (a pause) ends when it is lifted.
        lasted = ev.lasted_s or ev.t - self._queue_stalls.pop(ev.reason, ev.t) if ev.lane < 0 else ev.lasted_s
        start = ev.t - lasted
        tid = self._layout.track(pid, ev.lane, _STALLS, start, ev.t)
        args["lasted_s"] = lasted
        self._buf.append(_JSON.encode({"ph": "X", "name": ev.reason, "cat": "stall", "pid": pid, "tid": tid,
                                       "ts": _ts(start - self._origin_for(start)), "dur": _ts(lasted),
                                       "args": args}))

    def _instant(self, name: str, pid: int, tid: int, scope: str, t: float, args: dict[str, object], *,
                 cat: str = "run", force: bool = False) -> None:
        if self._full and not force:
            return
        self._buf.append(_JSON.encode({"ph": "i", "name": name, "cat": cat, "s": scope, "pid": pid, "tid": tid,
                                       "ts": _ts(t - self._origin_for(t)), "args": args}))

    def _counters_of(self, snap: EngineSnapshot) -> None:
        self._samples += 1
        every = _COUNTER_S * 2 ** (self._samples // COUNTER_STAGE)
        self._next_sample = snap.t + every
        ts = _ts(snap.t0 + snap.t - self._origin_for(snap.t0 + snap.t))
        series: dict[str, dict[str, float]] = {
            "queued": {"tasks": snap.counts.queued},
            "ready": {"tasks": snap.feeder.ready},
            "device busy": {"percent": round(100 * snap.figures.device_busy, 2)},
        }
        for lane in snap.lanes:
            series[f"slot depth · lane {lane.id}"] = {"slots": lane.depth}
        if self.stride > 1:
            series["batches skipped"] = {"batches": self.batches_seen - self.batches_written}
        for name, values in series.items():
            key = tuple(values.values())
            if self._counters.get(name) != key:
                self._counters[name] = key
                self._buf.append(_JSON.encode({"ph": "C", "name": name, "pid": _ENGINE, "tid": _ENGINE, "ts": ts,
                                               "args": values}))
        for lane_id, worker in lane_owners(snap).items():
            self._layout.lane_pid.setdefault(lane_id, self._layout.worker(worker.id))

    # -- time and the file -------------------------------------------------------------------------
    def _origin_for(self, t: float) -> float:
        """The run's start on ``perf_counter``'s clock: the first snapshot's, or, heard before any,
        the earliest of the writer's making and the first time heard."""
        if self._origin is None:
            self._origin = min(self._made, t)
        return self._origin

    def _end_time(self, last: EngineSnapshot | None) -> float:
        if last is not None:
            return last.t0 + last.t
        return max(time.perf_counter(), self._origin_for(self._made))

    def _maybe_flush(self) -> None:
        if self._buf and (time.monotonic() - self._flushed >= FLUSH_S or len(self._buf) >= FLUSH_LINES):
            self._flush()

    def _flush(self) -> None:
        """Write what is buffered, one event a line, each after a comma (the array's last ``]`` is
        written alone)."""
        lines, self._buf[:] = list(self._buf), []
        self._flushed = time.monotonic()
        if not lines or self._file is None:
            return
        close = lines[-1] == "]"
        body = lines[:-1] if close else lines
        text = "".join(f",{line}\n" for line in body) + ("]\n" if close else "")
        self.events += len(body)
        self.nbytes += len(text)
        self._file.write(text)
        self._file.flush()
        if self.nbytes >= MAX_BYTES and not self._full:
            self._full = True
            self._instant("trace full: nothing more is written", _ENGINE, _ENGINE, "g", time.perf_counter(),
                          {"bytes": self.nbytes, "max_bytes": MAX_BYTES}, force=True)
            self._flush()

    def _give_up(self, exc: Exception) -> None:
        """Go quiet for good: said once, in the log; what the file holds stays readable up to its
        last whole line."""
        self._quiet = True
        self._buf.clear()
        if isinstance(exc, OSError):
            log.error("trace %s: %s; nothing more is written to it (the run goes on)", self.path, exc)
        else:
            log.error("trace %s: the writer failed; nothing more is written to it (the run goes on)", self.path,
                      exc_info=exc)
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


