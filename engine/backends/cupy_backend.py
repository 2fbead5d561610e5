"""The CuPy backend: the only module that imports CuPy, and only when it is asked for.

Per lane: three non-blocking CUDA streams (h2d, compute, d2h) each fed by its own host thread,
so a stage that launches slowly never blocks the event loop; pinned host slots and device slots
allocated once; ``Event(disable_timing=True)`` markers (timed events only when profiling);
cross-stream order through ``stream.wait_event`` so the host never waits for the device except
where it touches the data (fill writes a pinned input, sink reads a pinned output).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import BackendError, DeviceEvent, Marker, StreamSet
from warpdeck.engine.state.tasks import Phase

__all__ = ["CupyBackend", "cupy_unavailable_reason"]


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


class _Streams(StreamSet):
    def __init__(self, lane: int, cupy: ModuleType) -> None:
        super().__init__(lane)
        self.cuda: dict[Phase, Any] = {
            p: cupy.cuda.Stream(non_blocking=True) for p in (Phase.H2D, Phase.COMPUTE, Phase.D2H)
        }


class CupyBackend:
    """Buffers on one CUDA device; copies and compute on per-lane streams."""

    name = "cupy"

    def __init__(self, device: int = 0, reason: str = "requested", profile: bool = False) -> None:
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
        self._profile = profile or os.environ.get("WARPDECK_PROFILE") == "1"
        self._pinned: list[Any] = []

    def host_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        mem = self._cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        self._pinned.append(mem)  # the array does not keep the pinned block alive by itself
        return np.frombuffer(mem, np.uint8, nbytes)

    def device_buffer(self, nbytes: int) -> Any:
        with self._device:
            return self._cp.empty(nbytes, self._cp.uint8)

    def view(self, buf: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buf[:n].view(dtype).reshape(shape)

    def streams(self, lane: int) -> StreamSet:
        return _Streams(lane, self._cp)

    def _event(self) -> Any:
        return self._cp.cuda.Event(disable_timing=not self._profile)

    def _on_stream(self, streams: StreamSet, phase: Phase, work: Callable[[Any], None],
                   deps: Sequence[Marker]) -> Marker:
        assert isinstance(streams, _Streams)
        stream = streams.cuda[phase]

        def job() -> DeviceEvent:
            with self._device:
                for d in deps:
                    ev = d._event()
                    if ev is not None:
                        stream.wait_event(ev)
                ev = self._event()
                try:
                    with stream:
                        work(stream)
                except Exception as exc:
                    # Kernels enqueued before the raise still use the buffers: their release
                    # must wait for them, so the event travels on the exception.
                    ev.record(stream)
                    exc.warpdeck_event = ev  # type: ignore[attr-defined]
                    raise
                ev.record(stream)
                return ev  # type: ignore[no-any-return]

        return streams.submit(phase, job, deps, device_deps=True)

    def h2d(self, streams: StreamSet, dst: Any, src: npt.NDArray[Any], deps: Sequence[Marker]) -> Marker:
        return self._on_stream(streams, Phase.H2D, lambda s: dst.set(src, stream=s), deps)

    def compute(self, streams: StreamSet, fn: Callable[[], None], deps: Sequence[Marker]) -> Marker:
        return self._on_stream(streams, Phase.COMPUTE, lambda _s: fn(), deps)

    def d2h(self, streams: StreamSet, dst: npt.NDArray[Any], src: Any, deps: Sequence[Marker]) -> Marker:
        return self._on_stream(streams, Phase.D2H, lambda s: src.get(stream=s, out=dst, blocking=False), deps)

    def close(self) -> None:
        self._pinned.clear()
