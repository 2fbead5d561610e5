"""The backend contract: streams that run work in order, markers that say when it is done.

The decision this module protects: both backends share one structure. A lane owns one
single-thread executor per stream (fill, h2d, compute, d2h, sink), so work on a stream runs in
submission order exactly as on a CUDA stream, and a job waits for its dependencies *inside* its
stream, never on the event loop. On NumPy the job is the work itself; on CuPy the job enqueues
the work on a CUDA stream and returns an event, so the marker is done when the event is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.completion import Completion, JobEnd, wait_async
from warpdeck.engine.backends.host_pool import HostPool
from warpdeck.engine.backends.shared_memory import SharedArena, SharedBuffer
from warpdeck.engine.state.task_states import Phase

__all__ = [
    "HOST_PHASES",
    "Backend",
    "BackendError",
    "BufferStillHeld",
    "DependencyFailed",
    "DeviceEvent",
    "Marker",
    "MarkerTimeout",
    "NonfiniteCounter",
    "StreamSet",
    "charge_cpu",
]


class BackendError(RuntimeError):
    """The backend cannot be used; ``reason`` says why in words a user can act on."""

    def __init__(self, backend: str, reason: str) -> None:
        self.backend = backend
        self.reason = reason
        super().__init__(f"backend {backend!r} unavailable: {reason}")


class DependencyFailed(RuntimeError):
    """A job was skipped because work it depended on failed."""


class MarkerTimeout(TimeoutError):
    """A marker was not done within its deadline (the stage may be hung)."""


class DeviceEvent(Protocol):
    """What a device backend returns from a job: work the device finishes later."""

    @property
    def done(self) -> bool:
        """Whether the device has finished the work (never blocks)."""
        ...

    @property
    def landed(self) -> cf.Future[None]:
        """Completes once the device has finished the work (or with the device's error). The
        backend completes it from a thread that waits on the device, so no one polls: a waiter
        wakes when the work ends, not at its next look."""
        ...


@dataclass(slots=True)
class Marker:
    """Completion of one job on one stream.

    ``future`` finishes when the job has run on its executor; for device work it then holds a
    ``DeviceEvent`` that finishes when the device has done the work. ``t0``/``t1`` are the
    job's start and end on ``time.perf_counter``'s clock (device work: when it was enqueued and
    when it was seen done, unless the backend times it).
    """

    phase: Phase
    future: JobEnd
    t0: float = 0.0
    t1: float = 0.0
    device: bool = False
    """The future's result is a device event to wait for (else it is the job's plain result)."""
    cpu: float = 0.0
    """CPU seconds the job's thread spent in it (``time.thread_time``): a host phase that burns CPU scales with cores,
    one that waits (I/O, sleep) with threads (engine/state/metrics.py)."""
    clock: Callable[[], tuple[float, float]] | None = None
    """Set by a backend that times the work on the device itself (CuPy: CUDA events): returns the work's (start, end) on
    ``time.perf_counter``'s time base; read once the marker is done, off the hot path (``phase_spans``). None:
    ``t0``/``t1`` are the interval (host clock)."""
    held_by: tuple[Marker, ...] = ()
    """For a release marker: what holds its buffer until the release ends by itself: the jobs that use it
    (``chain_release`` adds the last) and the release it was handed on from. Cleared when the last job ends. A job whose
    dependency was released early (``free``) while any of these still holds the buffer fails instead of running
    (``BufferStillHeld``)."""

    def _event(self) -> DeviceEvent | None:
        return self.future.result() if self.device else None

    def done(self) -> bool:
        """True once the work is finished (successfully or not); never blocks."""
        if not self.future.done():
            return False
        if self.future.exception() is not None:
            return True
        ev = self._event()
        if ev is None or ev.done:
            if ev is not None and not self.t1:
                self.t1 = time.perf_counter()
            return True
        return False

    def released(self) -> Marker:
        """A marker for "the buffer this job used is free again": done when this job is, and
        never failed (a failed job frees its buffer too), so later users of the buffer only
        wait, and do not inherit the failure."""
        proxy = Marker(self.phase, Completion(), device=self.device)
        chain_release(self, proxy)
        return proxy

    def failed(self) -> BaseException | None:
        """The job's exception, if it finished with one."""
        return self.future.exception() if self.future.done() else None

    def error(self) -> BaseException | None:
        """Once ``done``: what ``wait`` would raise (the job's exception, the device's, or
        ``StreamsClosed`` for a job its stream dropped unrun); None when the work succeeded."""
        exc = self._failure(self.future)
        if exc is not None:
            return exc
        ev = self._event()
        if ev is not None and ev.landed.done():
            return ev.landed.exception()
        return None

    def when_done(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the marker is ``done``: from the thread that ends the work, or at
        once if it has ended; for device work, once the device has done it (``landed``). This is
        how a lane hears its phases end without a waiter per phase (engine/run/lanes.py)."""

        def ran(f: JobEnd) -> None:
            ev = None if f.cancelled() or f.exception() is not None else self._event()
            if ev is None:
                fn()
            else:
                ev.landed.add_done_callback(lambda _: fn())

        self.future.add_done_callback(ran)

    async def wait(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - a deadline per marker, not a scope
        """Wait from asyncio without blocking the loop; raises the job's exception, or
        ``MarkerTimeout`` after ``timeout`` seconds."""
        fut = self.future
        if fut.done() and not fut.cancelled():
            # Already run (often: a release, or a phase that ended before its watcher came): no
            # asyncio future, no wake-up through the loop's self-pipe.
            exc = fut.exception()
            if exc is not None:
                raise exc
            await self._device_done(timeout)
            return
        await self._shielded(fut, timeout)
        await self._device_done(timeout)

    async def _device_done(self, timeout: float | None) -> None:  # noqa: ASYNC109
        """The job has run; for device work, wait until the device has done it (``landed``)."""
        ev = self._event()
        if ev is None:
            return
        if not ev.done:
            await self._shielded(ev.landed, timeout)
        if not self.t1:
            self.t1 = time.perf_counter()

    async def _shielded(self, fut: JobEnd, timeout: float | None) -> None:  # noqa: ASYNC109
        """Wait for ``fut`` from asyncio and raise its exception, or raise ``MarkerTimeout`` after
        ``timeout`` seconds. A waiter's timeout or cancellation leaves the work alone."""
        try:
            # Not ``asyncio.wait_for``: on Python 3.11 it returns the result when a cancellation
            # lands as the work completes, and the cancelled lane then waited forever at shutdown.
            async with asyncio.timeout(timeout):
                await wait_async(fut)
        except TimeoutError:
            raise MarkerTimeout(f"{self.phase.name.lower()} not done after {timeout:.3g}s") from None
        exc = self._failure(fut)
        if exc is not None:
            raise exc

    def _failure(self, fut: JobEnd) -> BaseException | None:
        """A finished ``fut``'s exception; ``StreamsClosed`` for a job its stopping stream dropped unrun."""
        if fut.cancelled():
            return StreamsClosed(f"{self.phase.name.lower()} was dropped by its stopping stream")
        return fut.exception()


def pending_marker(phase: Phase) -> Marker:
    """A release marker for a job not yet submitted; ``chain_release`` or ``free`` ends it."""
    return Marker(phase, Completion(), device=True)


def chain_release(job: Marker, release: Marker) -> None:
    """Resolve ``release`` when ``job`` finishes: with its device event, or free on failure
    (a failed device job leaves the event it recorded on the exception, if it got that far)."""
    release.held_by = (*release.held_by, job)

    def done(f: JobEnd) -> None:
        if f.cancelled():  # a stream shut down before running the job: the buffer is free
            free(release)
            return
        release.held_by = ()  # ended by its last user: nothing before it holds the buffer either
        exc = f.exception()
        if exc is not None:
            ev = getattr(exc, "warpdeck_event", None)
        else:
            ev = f.result() if job.device else None
        if not release.future.done():
            release.future.set_result(ev)

    job.future.add_done_callback(done)


def free(release: Marker) -> None:
    """Mark a release marker free without any job (the job was never submitted)."""
    if not release.future.done():
        release.future.set_result(None)


def done_marker(phase: Phase) -> Marker:
    """A marker that is already done: the release marker of a never-used buffer."""
    fut = Completion()
    fut.set_result(None)
    return Marker(phase, fut, device=True)


NonfiniteCounter = Callable[[Any, Any], None]
"""``count(out, counts)``: the number of NaN and infinite values in each row of ``out`` (n, ...), written into
``counts`` (n,) int32, queued on the current stream (``Backend.nonfinite_counter``)."""


_CHARGED = threading.local()


def charge_cpu(seconds: float) -> None:
    """Inside a job: CPU another process spent on the job's behalf (a fill worker process), counted
    in the job's ``Marker.cpu`` beside its own thread's, so the tuner sees what the phase costs."""
    _CHARGED.s = getattr(_CHARGED, "s", 0.0) + seconds


HOST_PHASES = (Phase.FILL, Phase.SINK)
"""The phases that run on host threads only, and may run on several at once (``HostPool``)."""


class StreamSet:
    """The executors of one lane. The device phases (h2d, compute, d2h) each run on one thread in
    submission order, as on a CUDA stream, and a job first waits for its dependency markers within
    its own thread. The host phases (fill, sink) run on a resizable pool (``HostPool``): they
    start in submission order, may finish out of it, and the lane takes their results in order."""

    def __init__(self, lane: int, fill_workers: int = 1, sink_workers: int = 1) -> None:
        name = f"warpdeck-lane{lane}"
        # One thread for a device phase keeps its jobs in submission order. Not a
        # ThreadPoolExecutor: its submit costs the loop three times as much, paid per batch.
        self._pools: dict[Phase, HostPool] = {
            p: HostPool(f"{name}-{p.name.lower()}", 1) for p in (Phase.H2D, Phase.COMPUTE, Phase.D2H)}
        self._host = {Phase.FILL: HostPool(f"{name}-fill", fill_workers),
                      Phase.SINK: HostPool(f"{name}-sink", sink_workers)}
        self._pools.update(self._host)
        self._closed = threading.Event()
        self._shut = False
        _track(self)

    def workers(self, phase: Phase) -> int:
        """Threads the host phase ``phase`` runs on (1 for a device phase)."""
        pool = self._host.get(phase)
        return pool.workers if pool is not None else 1

    def resize(self, phase: Phase, workers: int) -> int:
        """Run the host phase ``phase`` on ``workers`` threads from now on; the count set."""
        return self._host[phase].resize(workers)

    def submit(self, phase: Phase, job: Callable[[], Any],
               deps: Sequence[Marker] = (), device_deps: bool = False) -> Marker:
        """Run ``job`` on ``phase``'s stream after ``deps``.

        With ``device_deps`` the job only waits for the dependencies' *submission* and leaves
        the device-side ordering to the backend's ``wait_events`` (CuPy: ``stream.wait_event``).
        """
        fut = Completion()
        marker = Marker(phase, fut, device=device_deps)
        closed = self._closed

        def run() -> Any:
            for d in deps:
                exc = _wait_submitted(d, closed) if device_deps else _wait_done(d, closed)
                if exc is not None:
                    raise DependencyFailed(f"{d.phase.name.lower()} failed: {exc!r}") from exc
            if closed.is_set():
                # Abandoned (``abandon``): a stopping lane frees every buffer's release, so a
                # dependency that is done now may only have been let go; its buffer may still be
                # read by a running job (a sink writing it out). This job must not touch it.
                raise StreamsClosed(f"streams closed before {phase.name.lower()} ran")
            _check_held(phase, deps)
            _CHARGED.s = 0.0
            c0 = time.thread_time()
            marker.t0 = time.perf_counter()
            result = job()
            if not device_deps:
                marker.t1 = time.perf_counter()
            marker.cpu = time.thread_time() - c0 + _CHARGED.s
            return result

        self._pools[phase].submit_into(fut, run)
        return marker

    def abandon(self) -> None:
        """From now on no job starts its work: a job waiting for a dependency gives up
        (``StreamsClosed``), even if the dependency is then released, and so does a job not yet
        started; a running job runs to its end. A stopping lane calls this before it frees its
        buffers' releases, so that freeing them cannot let a copy into a buffer still being read."""
        self._closed.set()

    def close(self) -> None:
        """Abandon what has not started (``abandon``), then stop accepting work and wait for the
        running jobs. A job still waiting for a dependency gives up: a release that nobody will
        ever free cannot hang the process at exit, when Python joins every executor thread."""
        self._closed.set()
        if self._shut:
            return
        self._shut = True
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)


_LIVE: weakref.WeakSet[StreamSet] = weakref.WeakSet()
_exit_hook = False


def _track(streams: StreamSet) -> None:
    """Remember ``streams`` so that interpreter exit can release its waiting jobs.

    At exit Python joins every executor thread. An engine still running then (a daemon thread, a
    test that did not stop it) has jobs waiting on releases that will never come, and the join
    would hang the finished process. This hook, registered after concurrent.futures' own (so run
    before it), marks every live stream set closed, and the waiting jobs give up."""
    global _exit_hook  # noqa: PLW0603 - once per process
    _LIVE.add(streams)
    if not _exit_hook:
        _exit_hook = True
        threading._register_atexit(_close_all)  # type: ignore[attr-defined]


def _close_all() -> None:
    for s in list(_LIVE):
        s._closed.set()


class StreamsClosed(RuntimeError):
    """The lane's streams were closed while a job still waited for a dependency."""


class BufferStillHeld(RuntimeError):
    """A job's buffer was released while the job holding it still ran: whoever freed the release
    broke the slot's ownership, and the job would overwrite data still being read. The job fails
    instead of running, so such a bug shows as a failed batch naming both phases, never as an
    output holding another batch's values."""


def _finished(m: Marker) -> bool:
    if not m.future.done():
        return False
    return m.future.cancelled() or m.done()


def _holder(release: Marker) -> Marker | None:
    """What still holds the buffer ``release`` stands for: a job still running, or a release not
    ended yet that it was handed on from; None when the buffer is really free."""
    for h in release.held_by:
        if not _finished(h):
            return h
        if h.held_by and (behind := _holder(h)) is not None:
            return behind
    return None


def _check_held(phase: Phase, deps: Sequence[Marker]) -> None:
    for d in deps:
        if d.held_by and (holder := _holder(d)) is not None:
            raise BufferStillHeld(
                f"{phase.name.lower()} would use a buffer that {holder.phase.name.lower()} still holds: "
                f"its release was freed before {holder.phase.name.lower()} was done with it")


_CLOSED_POLL_S = 0.05
"""How often a job blocked on a dependency looks whether its streams were closed."""


def _block(fut: JobEnd, timeout: float) -> bool:
    """Block this thread until ``fut`` is done, at most ``timeout`` seconds; whether it is."""
    if isinstance(fut, Completion):
        return fut.wait(timeout)
    return bool(cf.wait([fut], timeout=timeout).done)


def _wait_submitted(d: Marker, closed: threading.Event) -> BaseException | None:
    # A dependency already done (the common case once a lane is busy) costs no waiter objects.
    while not d.future.done() and not _block(d.future, _CLOSED_POLL_S):
        if closed.is_set():
            raise StreamsClosed(f"streams closed while waiting for {d.phase.name.lower()}")
    if d.future.cancelled():
        return StreamsClosed(f"{d.phase.name.lower()} was cancelled")
    return d.future.exception()


def _wait_done(d: Marker, closed: threading.Event) -> BaseException | None:
    exc = _wait_submitted(d, closed)
    if exc is not None:
        return exc
    ev = d._event()
    if ev is None:
        return None
    while not ev.done and not _block(ev.landed, _CLOSED_POLL_S):
        if closed.is_set():
            raise StreamsClosed(f"streams closed while {d.phase.name.lower()} ran on the device")
    return ev.landed.exception() if ev.landed.done() else None


class Backend(Protocol):
    """Buffers and copies for one device. ``xp`` is the array module stage functions get."""

    @property
    def name(self) -> str:
        """"numpy" or "cupy"."""
        ...

    @property
    def xp(self) -> ModuleType:
        """The array module stage functions get."""
        ...

    @property
    def device_name(self) -> str:
        """The device, as the report shows it."""
        ...

    @property
    def reason(self) -> str:
        """Why this backend was chosen (``auto`` explains a fallback here)."""
        ...

    @property
    def phase_clocks(self) -> dict[str, str]:
        """How each phase's interval is measured, by phase label (``"compute"``), as the report
        says it: ``"host (perf_counter)"`` or, for a phase the device times, ``"device (CUDA
        events)"``. Every clock is on ``time.perf_counter``'s time base."""
        ...

    def host_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """A host staging buffer (pinned on a GPU), allocated once per slot."""
        ...

    def shared_host_buffer(self, arena: SharedArena, nbytes: int) -> SharedBuffer:
        """A host staging buffer in ``arena``'s shared memory, which worker processes write into
        directly (engine/backends/shared_memory.py); page-locked for the device on a GPU. It stays
        usable until the arena closes it."""
        ...

    def device_buffer(self, nbytes: int) -> Any:
        """A device buffer (``xp`` array of uint8), allocated once per slot."""
        ...

    def view(self, buf: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        """``buf`` seen as an array of ``shape``/``dtype`` (no copy)."""
        ...

    def streams(self, lane: int) -> StreamSet:
        """The executors of one lane."""
        ...

    def h2d(self, streams: StreamSet, dst: Any, src: npt.NDArray[Any], deps: Sequence[Marker]) -> Marker:
        """Copy host ``src`` into device ``dst`` on the lane's h2d stream."""
        ...

    def compute(self, streams: StreamSet, fn: Callable[[], None], deps: Sequence[Marker]) -> Marker:
        """Run ``fn`` (which calls the stage functions) on the compute stream."""
        ...

    def d2h(self, streams: StreamSet, dst: npt.NDArray[Any], src: Any, deps: Sequence[Marker]) -> Marker:
        """Copy device ``src`` into host ``dst`` on the lane's d2h stream."""
        ...

    def torch_stream(self) -> AbstractContextManager[Any]:
        """Inside a compute job: a context in which PyTorch works on the lane's compute stream
        (torch stages, engine/run/torch_stages.py)."""
        ...

    def nonfinite_counter(self, dtype: np.dtype[Any]) -> NonfiniteCounter | None:
        """Where the device checks outputs of ``dtype`` for NaN and infinity faster than the sink's
        host scan could (CuPy: one reduction on the card, microseconds for what costs the host
        milliseconds per 64 MiB): the function that does it, called inside the compute job. None:
        the sink scans the outputs on the host (NumPy, where the "device" is the host anyway)."""
        ...

    def close(self) -> None:
        """Release device resources."""
        ...
