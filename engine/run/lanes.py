"""Lanes: a ring of slots and the flow of one batch through fill, h2d, compute, d2h and sink.

The decisions this module protects:
- A slot holds four buffers (pinned input, device input, device output, pinned output), each
  allocated once and each released on its own: a phase may write a buffer only when the phase
  that last read it (for the previous batch on that slot) is done. With k = 2 every phase
  overlaps every other, and a slot is never overwritten before it was read.
- After fill, a batch's device work (h2d, compute, d2h) is submitted at once with its
  dependencies; the device streams order it, so the host never waits between phases. Each
  marker wakes the lane's pump on the loop when it ends (ends that come together share one
  wake-up), and the pump moves each stage's oldest batch on in order: no waiter, future or task
  per phase on the loop, whose cost per batch is what a batch of one task pays.
- The lane never touches the task table: it reports to its ``LaneHost`` (the dispatcher, engine/run/dispatcher.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from warpdeck.engine.backends.base import (
    HOST_PHASES,
    Backend,
    Marker,
    NonfiniteCounter,
    StreamSet,
    chain_release,
    free,
    pending_marker,
)
from warpdeck.engine.edges.sinks import Sink
from warpdeck.engine.edges.sources import Source
from warpdeck.engine.run.lane_fill import LaneFill
from warpdeck.engine.run.lane_io import load_rows, write_outputs
from warpdeck.engine.run.lane_protocols import LaneHost
from warpdeck.engine.run.phase_times import phase_cpu, phase_spans
from warpdeck.engine.run.process_fill import ProcessFill
from warpdeck.engine.run.process_sink import ProcessSink
from warpdeck.engine.run.slots import Buffer, Slot, SlotRing, counted_outputs, output_bytes
from warpdeck.engine.state.batches import Batch, BatchKey
from warpdeck.engine.state.records import BatchRecord, StagePlan, root_failure
from warpdeck.engine.state.snapshot import LaneStatus, LaneView
from warpdeck.engine.state.task_states import Phase, StallReason

__all__ = ["Lane"]


@dataclass(slots=True)
class _InFlight:
    batch: Batch
    slot: Slot
    plan: StagePlan
    fill: Marker
    h2d: Marker
    compute: Marker
    d2h: Marker
    sink_release: Marker
    out_wait: Marker
    """Release of the pinned output by the previous batch on this slot (its sink)."""
    host_out: Any
    host_counts: Any = None
    """Each row's count of NaN and infinite outputs, made on the device (None: the sink scans)."""
    sink: Marker | None = None
    error: tuple[Phase, BaseException] | None = None
    moved: bool = False
    """Its tasks were moved to the next phase; it waits for room before leaving this one."""
    blocked: bool = False
    """Told stalled by backpressure (its d2h waits for the sink to free the pinned output)."""
    hung: asyncio.TimerHandle | None = None
    """The compute deadline's timer, while the compute runs."""
    hung_said: bool = False


@dataclass(slots=True)
class _Filling:
    batch: Batch
    slot: Slot
    plan: StagePlan
    fill: Marker
    release: Marker
    """Release of the pinned input: chained to this batch's h2d, or freed if it never runs."""
    in_bytes: int
    out_bytes: int
    h2d: Marker | None = None
    heard: bool = False
    """Its fill's end was heard (failures reported); it may still wait for a buffer to grow."""
    prev: Marker | None = None
    """The compute running when it became the oldest fill: if that ends first, the device waits on it."""
    watched: bool = False
    """Whether it memory-stalled is decided."""


class Lane:
    """One pipeline instance on a device: a ring of ``slot_depth`` slots and five ordered streams."""

    def __init__(self, lane_id: int, backend: Backend, depth: int, host: LaneHost, source: Source,
                 sink: Sink, plan_for: Callable[[BatchKey], StagePlan], batch_size: int,
                 fill_workers: int = 1, sink_workers: int = 1, fill_processes: ProcessFill | None = None,
                 make_fill_processes: Callable[[], ProcessFill | None] | None = None,
                 sink_processes: ProcessSink | None = None,
                 fit_fill: Callable[[int], int] | None = None) -> None:
        self.id = lane_id
        self.batch_size = batch_size
        self.backend = backend
        self.host = host
        self.source = source
        self.sink = sink
        self.plan_for = plan_for
        self.fill = LaneFill(backend, source, fill_processes, make_fill_processes)
        """Where fills run: on the fill threads, or in worker processes (``host.fill_pool``)."""
        self.streams: StreamSet = backend.streams(lane_id)
        self.streams.resize(Phase.FILL, fill_workers)
        self.streams.resize(Phase.SINK, sink_workers)
        self.fill.resize(fill_workers)
        self.sink_processes = sink_processes
        """The worker processes that write this lane's outputs (``host.sink_pool``; None: the sink threads do)."""
        if sink_processes is not None:
            sink_processes.resize(sink_workers)
        self._base_depth = depth
        self._fit_fill = fit_fill
        """The fill threads a slot of the given bytes leaves room for, asked once, at the first batch
        (None: the spec pins them): the fill starts on one thread per core, each with its own slot."""
        self.ring = SlotRing(backend, self._depth_for(fill_workers, sink_workers), sink_processes)
        """The slots, and where their buffers live."""
        self._last_compute: Marker | None = None
        self.status: LaneStatus = "starting"
        self.output_blocked = False
        self.batches_done = 0
        self._inflight: dict[int, _InFlight] = {}
        self._fills: deque[_Filling] = deque()
        """Fills submitted, oldest first: the pump takes their results in batch order."""
        self._at: tuple[deque[_InFlight], ...] = (deque(), deque(), deque(), deque())
        """Batches past fill, oldest first, by the phase they wait on: h2d, compute, d2h, sink."""
        self._front_done = False
        self._poked = False
        """A pump is due on the loop (``_poke``)."""
        self._over = False
        self._loop: asyncio.AbstractEventLoop
        self._finished: asyncio.Future[None]
        """Done when the lane has run dry (``run`` set both), or with the error that ended it."""

    # -- ring -------------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return self.ring.depth

    def set_depth(self, depth: int) -> None:
        """Grow or shrink the ring; new slots are used next, removed ones finish their batches."""
        self.ring.set_depth(depth)

    def workers(self, phase: Phase) -> int:
        """Threads the host phase ``phase`` (fill or sink) runs on."""
        return self.streams.workers(phase)

    def set_workers(self, phase: Phase, workers: int) -> None:
        """Run the host phase ``phase`` on ``workers`` threads from the next job on. Several fills
        (sinks) then run at once; the lane still takes their results in batch order."""
        if phase not in HOST_PHASES:
            raise ValueError(f"{phase.name.lower()} is a device phase: it runs in order on one stream")
        workers = self.streams.resize(phase, workers)
        if phase is Phase.FILL:
            self.fill.resize(workers)  # one worker process per fill thread, where they run
        elif self.sink_processes is not None:
            self.sink_processes.resize(workers)

    @property
    def fill_in_processes(self) -> bool:
        """Fills run in worker processes now."""
        return self.fill.in_processes

    def set_fill_processes(self, on: bool) -> None:
        """Move the fill to worker processes (one per fill thread), or back to the threads for good."""
        self.fill.switch(on, self.workers(Phase.FILL))

    def warming(self, since: float) -> bool:
        """Whether a fill or sink worker process was starting at some time after ``since``."""
        procs = self.sink_processes
        return self.fill.warming(since) or (procs is not None and procs.warming(since))

    def inflight_ids(self) -> tuple[int, ...]:
        """Ids of the batches this lane holds between h2d and sink (readable from another thread:
        it may raise ``RuntimeError`` if the lane changed it meanwhile; the caller retries later)."""
        return tuple(self._inflight)

    @property
    def nbytes(self) -> int:
        """Bytes held by this lane's slot buffers."""
        return self.ring.nbytes

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's buffers (the first slot's: all grow alike)."""
        return self.ring.slot_bytes

    def view(self) -> LaneView:
        """The lane as the control room shows it: depth, status, and what holds each slot."""
        return LaneView(self.id, self.depth, self.status, self.output_blocked, self.batches_done, self.nbytes,
                        self.ring.views(), self.workers(Phase.FILL), self.workers(Phase.SINK), self.fill.views(),
                        self.sink_processes.views() if self.sink_processes is not None else ())

    # -- run --------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Process batches until the host has none; then wait for every batch in flight."""
        self.fill.start()
        if self.sink_processes is not None:
            self.sink_processes.start()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._finished = loop.create_future()
        front = loop.create_task(self._front(), name=f"lane{self.id}-front")
        front.add_done_callback(self._front_ended)
        try:
            try:
                await self._finished
            finally:
                self._over = True
                if not front.done():
                    front.cancel()
                    with contextlib.suppress(BaseException):
                        await front
                for stage in self._at:
                    for item in stage:
                        if item.hung is not None:
                            item.hung.cancel()
        finally:
            self.status = "stopped"
            self.output_blocked = False
            # First no job may start its work any more: the releases freed below would otherwise
            # let a d2h copy into a pinned output that a sink thread is still writing out (a SIGTERM
            # landed another batch's values in a Parquet part that way). Jobs already running end
            # as they would have; the rest give up.
            self.streams.abandon()
            try:
                # A fill waiting on a worker would hold the close below for up to its deadline. A sink
                # writing in a worker finishes, as on a thread.
                await self.fill.stop()
                # Whatever ended the lane, no stream job may wait forever on a release.
                for item in self._inflight.values():
                    free(item.sink_release)
                for f in self._fills:
                    if f.h2d is None:
                        free(f.release)
                for slot in self.ring:
                    for b in slot.buffers():
                        free(b.release)
                await asyncio.to_thread(self.streams.close)
            finally:
                # No stream uses a shared buffer any more (or the lane was cancelled while
                # closing): the workers stop and the shared memory goes, whatever happened.
                self.fill.close()
                if self.sink_processes is not None:
                    self.sink_processes.close()

    async def _front(self) -> None:
        """Take a free slot, then a batch, and submit its fill: the fill stream always has the
        next batch waiting behind the running one, as the device streams do."""
        while True:
            slot = self.ring.next()
            self.status = "waiting for slot"
            await slot.host_in.release.wait()
            self.status = "waiting for input"
            batch = await self.host.next_batch(self)
            if batch is None:
                return
            filling = self._begin_fill(batch, slot)
            if filling is not None:
                self._fills.append(filling)
                if len(self._fills) == 1:
                    self._watch_memory(filling)

    def _front_ended(self, front: asyncio.Task[None]) -> None:
        if front.cancelled() or self._finished.done():
            return
        exc = front.exception()
        if exc is not None:
            self._finished.set_exception(exc)
            return
        self._front_done = True
        self._pump()

    # -- the pump: every phase's end moves the batches on ---------------------------------------
    def _poke(self) -> None:
        """A marker of this lane is done (called from whichever thread ended it): run the pump on
        the loop. Ends that come while a pump is already due share it: one wake-up for several."""
        if self._poked or self._over:
            return
        self._poked = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
            self._loop.call_soon_threadsafe(self._pump)

    def _pump(self) -> None:
        """Move every stage's oldest batch on while its phase is done, in batch order per stage.
        An error here is the lane's: ``run`` raises it."""
        self._poked = False
        self._guarded(self._advance)

    def _advance(self) -> None:
        fills, (at_h2d, at_compute, at_d2h, at_sink) = self._fills, self._at
        while fills and self._fill_step(fills[0]):
            f = fills.popleft()
            if f.h2d is None:  # it never reached h2d: the pinned input is free again
                free(f.release)
            if fills:
                self._watch_memory(fills[0])
        while at_h2d and self._device_step(at_h2d[0], Phase.H2D, Phase.COMPUTE):
            at_compute.append(at_h2d.popleft())
        while at_compute and self._device_step(at_compute[0], Phase.COMPUTE, Phase.D2H):
            at_d2h.append(at_compute.popleft())
        while at_d2h and self._device_step(at_d2h[0], Phase.D2H, Phase.SINK):
            at_sink.append(at_d2h.popleft())
        while at_sink and self._sink_step(at_sink[0]):
            at_sink.popleft()
        if self._front_done and not fills and not (at_h2d or at_compute or at_d2h or at_sink):
            self._finished.set_result(None)

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` (the pump, a timer) on the loop while the lane runs: an error in it is the lane's."""
        if self._over or self._finished.done():
            return
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it
            self._finished.set_exception(exc)

    def _begin_fill(self, batch: Batch, slot: Slot) -> _Filling | None:
        batch.lane, batch.slot = self.id, slot.index
        self.host.on_started(batch)
        try:
            plan = self.plan_for(batch.key)
        except Exception as exc:  # noqa: BLE001 - a stage's out_spec refusing this key fails the batch
            self.host.on_failed(batch, Phase.FILL, exc)
            return None
        in_shape = (len(batch), *batch.key.shape)
        in_dtype = np.dtype(batch.key.dtype)
        in_bytes, out_bytes = self.batch_bytes(batch.key, plan)
        if self._fit_fill is not None:
            self._fit_first_fill(in_bytes, out_bytes)
        if self.fill.input_buffer(slot.host_in, in_bytes):
            self.ring.reallocations += 1
        load = self.fill.loader(slot.host_in)
        host_in = self.backend.view(slot.host_in.buf, in_shape, in_dtype)
        slot.newest, slot.newest_phase = batch.id, Phase.FILL
        slot.host_in.holder = batch.id
        # The pinned input is this batch's until its h2d is done (chained when h2d is submitted).
        release = pending_marker(Phase.H2D)
        slot.host_in.release = release
        items = batch.items
        fill_m = self.streams.submit(Phase.FILL, lambda: load_rows(load, items, host_in))
        release.held_by = (fill_m,)
        fill_m.when_done(self._poke)
        return _Filling(batch, slot, plan, fill_m, release, in_bytes, out_bytes)

    def _fit_first_fill(self, in_bytes: int, out_bytes: int) -> None:
        """At the first batch, once a slot's size is known: as many fill threads as the memory
        budget leaves a slot for (a slot holds the input and output, pinned and on the device), the
        ring no deeper than they need. A slot the ring drops now finishes its batch first."""
        fit, self._fit_fill = self._fit_fill, None
        assert fit is not None
        n = fit(2 * (in_bytes + out_bytes))
        if n >= self.workers(Phase.FILL):
            return
        self.set_workers(Phase.FILL, n)
        self.set_depth(self._depth_for(n, self.workers(Phase.SINK)))

    def _depth_for(self, fill: int, sink: int) -> int:
        """The spec's depth, or deeper where threads need it: a slot each, and the device one more."""
        return max([self._base_depth] + [w + 2 for w in (fill, sink) if w > 1])

    def _watch_memory(self, f: _Filling) -> None:
        """``f`` is the oldest fill: if the device runs dry before it is done (the compute in front
        of it ends first), its tasks are memory-stalled. Called when it becomes the oldest, then by
        the pump until that is decided."""
        if f.watched:
            return
        if f.prev is None:
            prev = self._last_compute
            if prev is None or prev.done() or f.fill.done():
                f.watched = True
            else:
                f.prev = prev  # a compute marker wakes the pump when it ends
            return
        if not f.fill.done() and f.prev.done():
            f.watched = True
            self.host.on_stall(f.batch, StallReason.MEMORY, "device idle, waiting for this batch's fill")

    def _fill_step(self, f: _Filling) -> bool:
        """Move the oldest fill on once it is done: its failures heard, the device work submitted.
        False: it must wait (for its fill, or for a slot buffer to grow)."""
        if not f.heard:
            if not f.fill.done():
                self.status = "filling"
                self._watch_memory(f)
                return False
            f.heard = True
            exc = f.fill.error()
            if exc is not None:
                self._fail_early(f.batch, f.slot, f.fill, Phase.FILL, exc)
                return True
            errors: list[BaseException | None] = f.fill.future.result()
            if errors.count(None) != len(errors):  # counted in C: a Python pass per task cost the loop
                f.batch = self.host.on_filled(f.batch, errors)
                if len(f.batch) == 0:
                    return True
        slot = f.slot
        # A buffer grows only while free; waiting here is rare (a larger key than before).
        for b, need in ((slot.dev_in, f.in_bytes), (slot.dev_out, f.out_bytes), (slot.host_out, f.out_bytes)):
            if b.cap < need and not b.release.done():
                b.release.when_done(self._poke)
                return False
        batch = f.batch
        in_shape = (len(batch), *batch.key.shape)
        in_dtype = np.dtype(batch.key.dtype)
        host_in = self.backend.view(slot.host_in.buf, in_shape, in_dtype)
        self.host.on_phase(batch, Phase.H2D)
        f.h2d = self._submit_device(f, host_in, in_shape, in_dtype)
        return True

    def batch_bytes(self, key: BatchKey, plan: StagePlan) -> tuple[int, int]:
        """Bytes of a full batch's input and output buffers for ``key`` (the output's with room for
        the rows' non-finite counts where the device makes them)."""
        return self.batch_size * key.nbytes, output_bytes(self.batch_size, plan.out_nbytes, self._counter(plan))

    def _counter(self, plan: StagePlan) -> NonfiniteCounter | None:
        """The device's non-finite count for ``plan``'s outputs, when the policy looks at them and
        the backend counts on the device (``Backend.nonfinite_counter``)."""
        return None if plan.nonfinite == "allow" else self.backend.nonfinite_counter(plan.dtypes[-1])

    def _submit_device(self, f: _Filling, host_in: Any, in_shape: tuple[int, ...], in_dtype: np.dtype[Any]) -> Marker:
        be = self.backend
        batch, slot, plan, fill_m, host_release = f.batch, f.slot, f.plan, f.fill, f.release
        n = in_shape[0]
        in_bytes, out_bytes = f.in_bytes, f.out_bytes
        self.ring.ensure(slot.dev_in, in_bytes, True)
        self.ring.ensure(slot.dev_out, out_bytes, True)
        self.ring.ensure_output(slot.host_out, out_bytes)
        while len(slot.mids) < len(plan.fns) - 1:
            slot.mids.append(Buffer(Phase.COMPUTE))
        for i, m in enumerate(slot.mids[: len(plan.fns) - 1]):
            self.ring.ensure(m, self.batch_size * plan.mid_nbytes(i), True)
        dev_in = be.view(slot.dev_in.buf, in_shape, in_dtype)
        out_shape = (n, *plan.shapes[-1])
        dev_out = be.view(slot.dev_out.buf, out_shape, plan.dtypes[-1])
        host_out = be.view(slot.host_out.buf, out_shape, plan.dtypes[-1])
        views = [dev_in]
        for i in range(len(plan.fns) - 1):
            views.append(be.view(slot.mids[i].buf, (n, *plan.shapes[i + 1]), plan.dtypes[i + 1]))
        views.append(dev_out)
        xp = be.xp
        fns = plan.fns
        # Where the device counts the rows' non-finite outputs, the sink reads those counts (they come
        # back in the same d2h) instead of scanning every output byte on the host.
        counter = self._counter(plan)
        d2h_dst, d2h_src, dev_counts, host_counts = host_out, dev_out, None, None
        if counter is not None:
            d2h_dst, d2h_src, dev_counts, host_counts = counted_outputs(be, slot, n, plan.out_nbytes)

        def compute() -> None:
            for i, fn in enumerate(fns):
                fn(xp, views[i], views[i + 1])
            if counter is not None:
                counter(dev_out, dev_counts)

        h2d_m = be.h2d(self.streams, dev_in, host_in, [slot.dev_in.release])
        chain_release(h2d_m, host_release)
        comp_m = be.compute(self.streams, compute, [h2d_m, slot.dev_out.release])
        slot.dev_in.release = comp_m.released()
        slot.dev_in.holder = batch.id
        sink_release = pending_marker(Phase.SINK)
        out_wait = slot.host_out.release
        d2h_m = be.d2h(self.streams, d2h_dst, d2h_src, [comp_m, out_wait])
        # The pinned output is handed on: held by the previous batch's sink until it lets go, then
        # by this d2h, then by this batch's sink (chained when it is submitted).
        sink_release.held_by = (out_wait, d2h_m)
        slot.dev_out.release = d2h_m.released()
        slot.dev_out.holder = batch.id
        slot.host_out.release = sink_release
        slot.host_out.holder = batch.id
        slot.newest_phase = Phase.H2D
        self._last_compute = comp_m
        item = _InFlight(batch, slot, plan, fill_m, h2d_m, comp_m, d2h_m, sink_release, out_wait, host_out,
                         host_counts)
        self._inflight[batch.id] = item
        for job in (h2d_m, comp_m, d2h_m):
            job.when_done(self._poke)
        self._at[0].append(item)
        return h2d_m

    def _fail_early(self, batch: Batch, slot: Slot, fill_m: Marker, phase: Phase, exc: BaseException) -> None:
        self.host.on_failed(batch, phase, exc)
        self.host.on_record(self._record(batch, slot, [fill_m], ok=False))

    def _device_step(self, item: _InFlight, phase: Phase, next_phase: Phase) -> bool:
        """Move ``item`` past the device phase ``phase`` once it is done (tasks to ``next_phase``,
        after compute only once the pinned output is free, after d2h with the sink submitted).
        A failed phase marks the item; its later phases are only waited for."""
        marker = item.h2d if phase is Phase.H2D else item.compute if phase is Phase.COMPUTE else item.d2h
        if not marker.done():
            if phase is Phase.COMPUTE and item.hung is None and item.error is None and item.plan.deadline_s:
                item.hung = self._loop.call_later(item.plan.deadline_s, self._guarded, self._hung, item)
            return False
        if not item.moved:
            if item.hung is not None:
                item.hung.cancel()
                item.hung = None
                if item.hung_said:
                    item.hung_said = False
                    self.host.on_stall(item.batch, StallReason.NONE)
            if item.error is None and (exc := marker.error()) is not None:
                item.error = (phase, root_failure(exc))
            if item.error is None:
                item.moved = True
                slot = item.slot
                if slot.newest == item.batch.id:
                    slot.newest_phase = next_phase
                self.host.on_phase(item.batch, next_phase)
        if item.error is None:
            if phase is Phase.COMPUTE and not self._output_room(item):
                return False
            # A batch taken back from a convicted worker writes nothing: its tasks run elsewhere.
            if phase is Phase.D2H and not self.host.fenced(item.batch):
                self._submit_sink(item)
        item.moved = False
        return True

    def _hung(self, item: _InFlight) -> None:
        """The compute deadline passed with the compute still running: the stage may be hung."""
        if item.compute.done():
            return
        item.hung_said = True
        self.host.on_stall(item.batch, StallReason.HUNG, f"compute past its {item.plan.deadline_s:g}s deadline")

    def _output_room(self, item: _InFlight) -> bool:
        """Compute is done; if d2h cannot start because the sink still reads the pinned output,
        the batch is blocked by its downstream (backpressure) until the sink lets go."""
        if item.out_wait.done():
            if item.blocked:
                item.blocked = self.output_blocked = False
                self.host.on_stall(item.batch, StallReason.NONE)
            return True
        if not item.blocked:
            item.blocked = self.output_blocked = True
            self.host.on_stall(item.batch, StallReason.BACKPRESSURE, "waiting for the sink to free an output slot")
            item.out_wait.when_done(self._poke)
        return False

    def _submit_sink(self, item: _InFlight) -> None:
        host_out = item.host_out
        sink = self.sink
        keys = [t.key for t in item.batch.items]
        policy = item.plan.nonfinite
        counts = item.host_counts
        item.sink = self.streams.submit(Phase.SINK, lambda: write_outputs(sink, keys, host_out, policy, counts))
        chain_release(item.sink, item.sink_release)
        item.sink.when_done(self._poke)

    def _sink_step(self, item: _InFlight) -> bool:
        """Hear the oldest batch's sink once it is done: its tasks done, or failed with the phase
        that failed them; its record to the host."""
        sink = item.sink
        if item.error is None and sink is not None and not sink.done():
            return False
        self._inflight.pop(item.batch.id, None)
        markers = [item.fill, item.h2d, item.compute, item.d2h]
        if item.error is not None or sink is None:
            free(item.sink_release)
            phase, exc = item.error or (Phase.SINK, RuntimeError("sink not run"))
            self.host.on_failed(item.batch, phase, exc)
            self.host.on_record(self._record(item.batch, item.slot, markers, ok=False))
            return True
        markers.append(sink)
        failed = sink.error()
        if failed is not None:
            self.host.on_failed(item.batch, Phase.SINK, root_failure(failed))
            self.host.on_record(self._record(item.batch, item.slot, markers, ok=False))
            return True
        errors: list[BaseException | None] = sink.future.result()
        if item.slot.newest == item.batch.id:
            item.slot.newest_phase = Phase.NONE
        self.batches_done += 1
        self.host.on_sunk(item.batch, errors)
        self.host.on_record(self._record(item.batch, item.slot, markers, ok=True))
        return True

    def _record(self, batch: Batch, slot: Slot, markers: Sequence[Marker], ok: bool) -> BatchRecord:
        return BatchRecord(batch.id, self.id, slot.index, len(batch), str(batch.key), batch.formed_at,
                           tuple(phase_spans(markers)), ok, len(batch) * batch.key.nbytes, phase_cpu(markers),
                           len(batch) * self.plan_for(batch.key).out_nbytes)
