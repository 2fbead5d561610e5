"""The NumPy backend: the GPU structure on a CPU.

Host and "device" buffers are separate NumPy arrays, copies are real (``np.copyto``), and each
stream is a single-thread executor, so the lanes overlap exactly as they would on a GPU (NumPy
releases the GIL in copies and large kernels; ``time.sleep``-bound stages overlap fully).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import Marker, NonfiniteCounter, StreamSet
from warpdeck.engine.backends.shared_memory import SharedArena, SharedBuffer
from warpdeck.engine.state.task_states import RUN_PHASES, Phase

__all__ = ["HOST_CLOCK", "NumpyBackend"]

HOST_CLOCK = "host (perf_counter)"
"""How a phase timed on the host is measured (``Backend.phase_clocks``): when its job's thread started and ended it, on
``time.perf_counter``."""


class NumpyBackend:
    """Arrays in host memory; markers are the executors' futures."""

    name = "numpy"
    xp = np
    device_name = "cpu"

    def __init__(self, reason: str = "requested") -> None:
        self.reason = reason
        self.phase_clocks: dict[str, str] = dict.fromkeys((p.label for p in RUN_PHASES), HOST_CLOCK)
        """Every phase runs on a host thread, so the host times every phase."""

    def host_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        return np.empty(nbytes, np.uint8)

    def shared_host_buffer(self, arena: SharedArena, nbytes: int) -> SharedBuffer:
        return arena.allocate(nbytes)

    def device_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        return np.empty(nbytes, np.uint8)

    def view(self, buf: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        n = math.prod(shape) * dtype.itemsize  # Python ints: no overflow, and no NumPy call per view
        return buf[:n].view(dtype).reshape(shape)

    def streams(self, lane: int) -> StreamSet:
        return StreamSet(lane)

    def h2d(self, streams: StreamSet, dst: Any, src: npt.NDArray[Any], deps: Sequence[Marker]) -> Marker:
        return streams.submit(Phase.H2D, lambda: np.copyto(dst, src), deps)

    def compute(self, streams: StreamSet, fn: Callable[[], None], deps: Sequence[Marker]) -> Marker:
        return streams.submit(Phase.COMPUTE, fn, deps)

    def d2h(self, streams: StreamSet, dst: npt.NDArray[Any], src: Any, deps: Sequence[Marker]) -> Marker:
        return streams.submit(Phase.D2H, lambda: np.copyto(dst, src), deps)

    def torch_stream(self) -> AbstractContextManager[Any]:
        # On a CPU a torch stage runs on the lane's compute thread; there is no stream to name.
        return nullcontext()

    def nonfinite_counter(self, dtype: np.dtype[Any]) -> NonfiniteCounter | None:
        # The sink's scan runs on a host thread of its own, beside the compute thread: moving it into
        # compute would only make the "device" phase longer.
        return None

    def close(self) -> None:
        pass
