"""Device phases on CuPy are timed by CUDA events; host phases, and every phase on NumPy, by the host.

The tests marked ``gpu`` run only where CuPy sees a CUDA device and skip with the reason elsewhere;
the others run everywhere (the CuPy ones with stand-in events, no CUDA).
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import pytest

from warpdeck.engine.backends.cupy_backend import (
    DEVICE_CLOCK,
    PHASE_CLOCKS,
    CupyBackend,
    _EventSpan,
    cupy_unavailable_reason,
)
from warpdeck.engine.backends.numpy_backend import HOST_CLOCK, NumpyBackend
from warpdeck.engine.state.task_states import RUN_PHASES

_NO_DEVICE = cupy_unavailable_reason()
needs_device = pytest.mark.skipif(_NO_DEVICE is not None, reason=f"no GPU: {_NO_DEVICE}")

_REFERENCE_SLACK_S = 1e-3
"""How late a device time may map onto the host clock: the lane's reference event is read just after a synchronisation,
which takes microseconds."""


def test_numpy_times_every_phase_on_the_host() -> None:
    assert NumpyBackend().phase_clocks == {p.label: HOST_CLOCK for p in RUN_PHASES}


def test_cupy_times_device_phases_by_cuda_events_and_host_phases_on_the_host() -> None:
    assert dict(PHASE_CLOCKS) == {"fill": HOST_CLOCK, "h2d": DEVICE_CLOCK, "compute": DEVICE_CLOCK,
                                  "d2h": DEVICE_CLOCK, "sink": HOST_CLOCK}


class _StandInEvent:
    """A CUDA event that completed ``at_ms`` on the device's timer."""

    def __init__(self, at_ms: float, done: bool = True) -> None:
        self.at_ms = at_ms
        self.done = done


def _span(ref_ms: float, ref_host_t: float, start_ms: float, end: _StandInEvent) -> _EventSpan:
    cuda = SimpleNamespace(get_elapsed_time=lambda a, b: b.at_ms - a.at_ms)
    span = _EventSpan(SimpleNamespace(cuda=cuda), contextlib.nullcontext())
    span.ref = (_StandInEvent(ref_ms), ref_host_t)
    span.start, span.end = _StandInEvent(start_ms), end
    span.host_t0 = ref_host_t
    return span


def test_an_event_span_places_device_times_on_the_reference_host_time() -> None:
    span = _span(ref_ms=5_000.0, ref_host_t=100.0, start_ms=5_250.0, end=_StandInEvent(5_300.0))
    assert span() == pytest.approx((100.25, 100.30))


def test_an_event_span_read_before_the_device_is_done_ends_now() -> None:
    span = _span(ref_ms=0.0, ref_host_t=time.perf_counter(), start_ms=1.0, end=_StandInEvent(2.0, done=False))
    t0, t1 = span()
    assert t0 == span.host_t0
    assert t1 <= time.perf_counter()


@pytest.fixture
def device_work():
    """A lane's streams, a 256 MiB pinned input with its device buffer, and a 4096² float32 matrix."""
    backend = CupyBackend()
    cp = backend.xp
    streams = backend.streams(0)
    nbytes = 256 << 20
    src = backend.host_buffer(nbytes)
    src[:] = 1
    dst = backend.device_buffer(nbytes)
    a = cp.ones((4096, 4096), cp.float32)
    cp.cuda.Device().synchronize()  # `a` was filled on the null stream, which the lane's do not wait for
    try:
        yield backend, streams, src, dst, a
    finally:
        streams.close()
        backend.close()


async def _h2d_then_compute(device_work):
    backend, streams, src, dst, a = device_work
    product = backend.xp.empty_like(a)

    def matmuls() -> None:  # 10 of 0.14 TFLOP each: milliseconds on any card
        for _ in range(10):
            backend.xp.matmul(a, a, out=product)

    begun = time.perf_counter()
    h2d = backend.h2d(streams, dst, src, ())
    compute = backend.compute(streams, matmuls, [h2d])
    await compute.wait(timeout=60)
    await h2d.wait(timeout=60)
    return begun, h2d, compute, time.perf_counter()


@pytest.mark.gpu
@needs_device
async def test_compute_starts_after_its_h2d_ends_on_the_device_clock(device_work) -> None:
    _, h2d, compute, _ = await _h2d_then_compute(device_work)
    (_, h2d_end), (compute_start, _) = h2d.clock(), compute.clock()
    assert compute.t0 < h2d_end  # the host queued compute while the copy still ran...
    assert compute_start >= h2d_end - 1e-6  # ...the device started it only once the copy ended


@pytest.mark.gpu
@needs_device
async def test_device_intervals_lie_within_the_jobs_host_window(device_work) -> None:
    begun, h2d, compute, seen_done = await _h2d_then_compute(device_work)
    for m in (h2d, compute):
        start, end = m.clock()
        assert begun <= m.t0 <= start <= end <= seen_done + _REFERENCE_SLACK_S
