"""The CuPy backend: the only module that imports CuPy, and only when it is asked for.

Per lane: three non-blocking CUDA streams (h2d, compute, d2h) each fed by its own host thread,
so a stage that launches slowly never blocks the event loop; pinned host slots and device slots
allocated once; cross-stream order through ``stream.wait_event`` so the host never waits for the
device except where it touches the data (fill writes a pinned input, sink reads a pinned output).

Device phases are timed on the device. The host queues a batch's h2d, compute and d2h together and
only hears of their end (a waiter thread per stream, ``_Waiter``), so host clocks would have compute
start before its h2d ended. Each device job is bracketed by two timed CUDA events on its stream
(the end one is also its marker); ``Marker.clock`` turns them into perf_counter time through the
lane's reference event (``_DeviceClock``), once the job is done, off the hot path. Measured on an
H200 by benchmarks/gpu.py (docs/benchmarks.md).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib
import math
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType, ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import (
    HOST_PHASES,
    BackendError,
    DeviceEvent,
    Marker,
    NonfiniteCounter,
    StreamSet,
)
from warpdeck.engine.backends.numpy_backend import HOST_CLOCK
from warpdeck.engine.backends.shared_memory import SharedArena, SharedBuffer, memory_backed
from warpdeck.engine.state.task_states import RUN_PHASES, Phase

__all__ = ["DEVICE_CLOCK", "PHASE_CLOCKS", "CupyBackend", "cupy_unavailable_reason", "torch_stream_context"]

DEVICE_CLOCK = "device (CUDA events)"
"""How a device phase's interval is measured on CuPy (``Backend.phase_clocks``)."""

PHASE_CLOCKS: Mapping[str, str] = MappingProxyType({
    p.label: HOST_CLOCK if p in HOST_PHASES else DEVICE_CLOCK for p in RUN_PHASES
})
"""``CupyBackend.phase_clocks``: fill and sink run on host threads; h2d, compute and d2h are timed by CUDA events."""

_REFERENCE_S = 30.0
"""How long one reference event places a lane's device times. CUDA gives elapsed times as float32 milliseconds (steps of
~8 µs 100 s after the reference, ~0.25 ms an hour after) and the card's timer drifts from the host's, so a lane takes a
fresh reference this often."""


def _import_cupy() -> ModuleType:
    import cupy  # noqa: PLC0415 - imported here only, lazily: the engine must load without CUDA

    module: ModuleType = cupy
    return module


def cupy_unavailable_reason() -> str | None:
    """None when CuPy can run here; otherwise why not, in words a user can act on."""
    try:
        cupy = _import_cupy()
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); install warpdeck[cuda]"
    except Exception as exc:  # noqa: BLE001 - a broken CUDA install raises anything at import
        return f"CuPy failed to import: {type(exc).__name__}: {exc}"
    try:
        if not cupy.is_available():
            return "CuPy is installed but no CUDA device is available"
    except Exception as exc:  # noqa: BLE001
        return f"CUDA runtime error: {exc}"
    return None


def torch_stream_context(stream: Any) -> AbstractContextManager[Any]:
    """PyTorch on CuPy's ``stream``: work torch enqueues inside this context is ordered with the
    lane's CuPy work on that stream, and ``torch.from_dlpack`` of a CuPy array needs no sync."""
    torch: Any = importlib.import_module("torch")  # optional (warpdeck[torch]): only a torch stage gets here
    ctx: AbstractContextManager[Any] = torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr))
    return ctx


class _DeviceClock:
    """Where one lane's CUDA events sit on ``time.perf_counter``'s time base: a timed reference
    event recorded on a stream nothing else uses (so it completes at once), synchronised, and the
    host clock read right after (late by the synchronisation's latency, microseconds)."""

    def __init__(self, cupy: ModuleType) -> None:
        self._cp = cupy
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self.reference = self._take()

    def _take(self) -> tuple[Any, float]:
        ev = self._cp.cuda.Event()
        ev.record(self._stream)
        ev.synchronize()
        return ev, time.perf_counter()

    def current(self) -> tuple[Any, float]:
        """The reference for a job starting now: the lane's, or a fresh one once it is
        ``_REFERENCE_S`` old (a job's thread may take it; two at once are harmless)."""
        ref = self.reference
        if time.perf_counter() - ref[1] > _REFERENCE_S:
            ref = self.reference = self._take()
        return ref


class _EventSpan:
    """One device job's ``Marker.clock``: its (start, end) from the timed events that bracket it.

    The start is placed through the lane's reference event; the length is taken between the two
    events themselves, so it keeps the events' resolution however old the reference is."""

    __slots__ = ("_cp", "_device", "end", "host_t0", "ref", "start")

    def __init__(self, cupy: ModuleType, device: Any) -> None:
        self._cp = cupy
        self._device = device
        self.ref: tuple[Any, float] | None = None
        self.start: Any = None
        self.end: Any = None
        self.host_t0 = 0.0
        """When the job's thread reached the work (host clock): the span of a job read too early."""

    def __call__(self) -> tuple[float, float]:
        if self.ref is None or self.end is None or not self.end.done:
            # Read before the device finished (the contract is after): as phase_spans does for a
            # running job, it ends now.
            return (self.host_t0, time.perf_counter()) if self.host_t0 else (0.0, 0.0)
        ref, ref_t = self.ref
        elapsed_ms = self._cp.cuda.get_elapsed_time
        with self._device:
            t0 = ref_t + elapsed_ms(ref, self.start) / 1e3
            return t0, t0 + elapsed_ms(self.start, self.end) / 1e3


class _Landing:
    """A device job's end (``DeviceEvent``): its CUDA event, and ``landed``, which the stream's
    ``_Waiter`` completes once the device has passed the event."""

    __slots__ = ("event", "landed")

    def __init__(self, event: Any) -> None:
        self.event = event
        self.landed: cf.Future[None] = cf.Future()

    @property
    def done(self) -> bool:
        return self.landed.done() or bool(self.event.done)


class _Waiter:
    """One stream's waiter: a thread that waits for the stream's job-end events in the order they
    were recorded (the order the stream completes them) and completes each one's ``landed``.

    Why a thread and not a poll: the host learns of a phase's end when it ends. Polled with backoff
    (20 µs doubling to 2 ms), a 1.3 ms copy could be seen a millisecond late, and the next fill, sink
    and copy wait on that news. The events are made with ``block=True``, so the wait sleeps in the
    driver instead of spinning a core, and CuPy releases the GIL while it waits. The thread starts
    with the first event, as the lanes' host pools do."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._q: queue.SimpleQueue[_Landing | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def watch(self, landing: _Landing) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._q.put(landing)

    def _run(self) -> None:
        while (landing := self._q.get()) is not None:
            try:
                landing.event.synchronize()
            except Exception as exc:  # noqa: BLE001 - the device's error goes to whoever waits on it
                landing.landed.set_exception(exc)
            else:
                landing.landed.set_result(None)

    def close(self, timeout: float = 5.0) -> None:
        """Stop once the events already watched have landed (waiting at most ``timeout``: a hung
        device must not hang the close; the thread is a daemon)."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout)
            self._thread = None


_HOST_REGISTER_PORTABLE = 1
"""``cudaHostRegisterPortable``: the memory is page-locked for every CUDA context, not only the current one (a lane's
thread may make another device current)."""


def _unpinnable(arena: SharedArena, why: str) -> str:
    return (f"cannot page-lock shared slot memory in {arena.path} ({why}): keep the shared arena on a "
            "memory file system such as /dev/shm")


class _Registration:
    """One ``cudaHostRegister`` of a shared buffer, undone once (``undo``)."""

    __slots__ = ("_cp", "address")

    def __init__(self, cupy: ModuleType, address: int) -> None:
        self._cp = cupy
        self.address = address

    def undo(self) -> None:
        if self.address:
            address, self.address = self.address, 0
            with contextlib.suppress(Exception):  # a context already torn down at exit unregisters it
                self._cp.cuda.runtime.hostUnregister(address)


class _Streams(StreamSet):
    def __init__(self, lane: int, cupy: ModuleType) -> None:
        super().__init__(lane)
        device_phases = (Phase.H2D, Phase.COMPUTE, Phase.D2H)
        self.cuda: dict[Phase, Any] = {p: cupy.cuda.Stream(non_blocking=True) for p in device_phases}
        self.waiters = {p: _Waiter(f"warpdeck-lane{lane}-{p.name.lower()}-landed") for p in device_phases}
        self.clock = _DeviceClock(cupy)

    def close(self) -> None:
        super().close()
        for w in self.waiters.values():
            w.close()


class CupyBackend:
    """Buffers on one CUDA device; copies and compute on per-lane streams."""

    name = "cupy"

    def __init__(self, device: int = 0, reason: str = "requested") -> None:
        why = cupy_unavailable_reason()
        if why is not None:
            raise BackendError("cupy", why)
        self._cp = _import_cupy()
        self.xp = self._cp
        self._device = self._cp.cuda.Device(device)
        self._device.use()
        props = self._cp.cuda.runtime.getDeviceProperties(device)
        raw = props.get("name", b"cuda")
        self.device_name = raw.decode() if isinstance(raw, bytes) else str(raw)
        self.reason = reason
        self.phase_clocks: dict[str, str] = dict(PHASE_CLOCKS)
        """How each phase's interval is measured (``PHASE_CLOCKS``)."""
        self._pinned: list[Any] = []
        self._registered: list[_Registration] = []
        self._nonfinite: Any = None  # the reduction kernel, made on first use

    def host_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        mem = self._cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        self._pinned.append(mem)  # the array does not keep the pinned block alive by itself
        return np.frombuffer(mem, np.uint8, nbytes)

    def shared_host_buffer(self, arena: SharedArena, nbytes: int) -> SharedBuffer:
        """A buffer in ``arena`` page-locked for the device (``cudaHostRegister``): h2d and d2h
        copy it by DMA, asynchronously, as they do a buffer from ``cudaHostAlloc``, while worker
        processes write it through their own mappings. The registration is undone before the
        buffer is unmapped (its ``on_close``) or when the backend closes, whichever comes first."""
        # Seen on an H200 (docs/benchmarks.md): a mapping of a file on disk is refused with
        # cudaErrorInvalidValue; one in /dev/shm (tmpfs) registers.
        if memory_backed(arena.path) is False:
            raise BackendError("cupy", _unpinnable(arena, "it is not on a memory file system"))
        buf = arena.allocate(nbytes)
        try:
            with self._device:
                self._cp.cuda.runtime.hostRegister(buf.address, max(nbytes, 1), _HOST_REGISTER_PORTABLE)
        except Exception as exc:
            arena.release(buf)
            raise BackendError("cupy", _unpinnable(arena, str(exc))) from exc
        reg = _Registration(self._cp, buf.address)
        buf.on_close.append(reg.undo)
        self._registered.append(reg)
        return buf

    def device_buffer(self, nbytes: int) -> Any:
        with self._device:
            return self._cp.empty(nbytes, self._cp.uint8)

    def view(self, buf: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        n = math.prod(shape) * dtype.itemsize  # Python ints: no overflow, and no NumPy call per view
        return buf[:n].view(dtype).reshape(shape)

    def streams(self, lane: int) -> StreamSet:
        with self._device:  # the current device is per thread: this one may not be __init__'s
            return _Streams(lane, self._cp)

    def _on_stream(self, streams: StreamSet, phase: Phase, work: Callable[[Any], None],
                   deps: Sequence[Marker]) -> Marker:
        assert isinstance(streams, _Streams)
        stream = streams.cuda[phase]
        span = _EventSpan(self._cp, self._device)

        def job() -> DeviceEvent:
            with self._device:
                for d in deps:
                    ev = d._event()
                    if ev is not None:
                        assert isinstance(ev, _Landing)
                        stream.wait_event(ev.event)
                span.ref = streams.clock.current()
                span.host_t0 = time.perf_counter()
                # Recorded after the waits: the device reaches it once the dependencies are done.
                span.start = self._cp.cuda.Event()
                span.start.record(stream)
                end = self._cp.cuda.Event(block=True)  # the waiter sleeps on it, not spins
                landing = _Landing(end)
                try:
                    with stream:
                        work(stream)
                except Exception as exc:
                    # Kernels enqueued before the raise still use the buffers: their release
                    # must wait for them, so the event travels on the exception.
                    end.record(stream)
                    span.end = end
                    streams.waiters[phase].watch(landing)
                    exc.warpdeck_event = landing  # type: ignore[attr-defined]
                    raise
                end.record(stream)
                span.end = end
                streams.waiters[phase].watch(landing)
                return landing

        marker = streams.submit(phase, job, deps, device_deps=True)
        marker.clock = span  # read only once the marker is done, by when the job has filled it
        return marker

    def h2d(self, streams: StreamSet, dst: Any, src: npt.NDArray[Any], deps: Sequence[Marker]) -> Marker:
        return self._on_stream(streams, Phase.H2D, lambda s: dst.set(src, stream=s), deps)

    def compute(self, streams: StreamSet, fn: Callable[[], None], deps: Sequence[Marker]) -> Marker:
        return self._on_stream(streams, Phase.COMPUTE, lambda _s: fn(), deps)

    def d2h(self, streams: StreamSet, dst: npt.NDArray[Any], src: Any, deps: Sequence[Marker]) -> Marker:
        return self._on_stream(streams, Phase.D2H, lambda s: src.get(stream=s, out=dst, blocking=False), deps)

    def torch_stream(self) -> AbstractContextManager[Any]:
        # Called inside a compute job, where ``_on_stream`` made the lane's compute stream current.
        return torch_stream_context(self._cp.cuda.get_current_stream())

    def nonfinite_counter(self, dtype: np.dtype[Any]) -> NonfiniteCounter | None:
        # Complex and integer outputs: the sink's scan (integers are never checked). Asked for every
        # batch on the engine's loop, so it makes nothing there: the method is the counter.
        return self._count_nonfinite if dtype.kind == "f" else None

    def _count_nonfinite(self, out: Any, counts: Any) -> None:
        """Each row's NaN and infinite values of ``out`` into ``counts``, on the current stream (the
        compute job's). The kernel is made on first use; two lanes making it at once is harmless."""
        if self._nonfinite is None:
            self._nonfinite = self._cp.ReductionKernel(
                "T x", "int32 n", "isfinite(x) ? 0 : 1", "a + b", "n = a", "0", "warpdeck_count_nonfinite")
        self._nonfinite(out.reshape(len(out), -1), axis=1, out=counts)

    def close(self) -> None:
        self._pinned.clear()
        while self._registered:
            self._registered.pop().undo()
