"""The NumPy backend: the GPU structure on a CPU.

Host and "device" buffers are separate NumPy arrays, copies are real (``np.copyto``), and each
stream is a single-thread executor, so the lanes overlap exactly as they would on a GPU (NumPy
releases the GIL in copies and large kernels; ``time.sleep``-bound stages overlap fully).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from warpdeck.engine.backends.base import Marker, StreamSet
from warpdeck.engine.state.tasks import Phase

__all__ = ["NumpyBackend"]


class NumpyBackend:
    """Arrays in host memory; markers are the executors' futures."""

    name = "numpy"
    xp = np
    device_name = "cpu"

    def __init__(self, reason: str = "requested") -> None:
        self.reason = reason

    def host_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        return np.empty(nbytes, np.uint8)

    def device_buffer(self, nbytes: int) -> npt.NDArray[np.uint8]:
        return np.empty(nbytes, np.uint8)

    def view(self, buf: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return buf[:n].view(dtype).reshape(shape)

    def streams(self, lane: int) -> StreamSet:
        return StreamSet(lane)

    def h2d(self, streams: StreamSet, dst: Any, src: npt.NDArray[Any], deps: Sequence[Marker]) -> Marker:
        return streams.submit(Phase.H2D, lambda: np.copyto(dst, src), deps)

    def compute(self, streams: StreamSet, fn: Callable[[], None], deps: Sequence[Marker]) -> Marker:
        return streams.submit(Phase.COMPUTE, fn, deps)

    def d2h(self, streams: StreamSet, dst: npt.NDArray[Any], src: Any, deps: Sequence[Marker]) -> Marker:
        return streams.submit(Phase.D2H, lambda: np.copyto(dst, src), deps)

    def close(self) -> None:
        pass
