"""A lane's wait on a stream job gives way to a cancellation however the two interleave.

Python 3.11's ``asyncio.wait_for`` returned the job's result when the cancellation landed as the
job completed; the cancelled lane went on to wait for an output slot nobody would free, and
stopping the engine hung (seen about once in five stops of the demo).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf

import pytest

from warpdeck.engine.backends.base import Marker
from warpdeck.engine.state.task_states import Phase


@pytest.mark.parametrize("turns", range(4))
@pytest.mark.parametrize("deadline", [None, 5.0])
async def test_a_cancel_as_the_job_ends_is_not_lost(turns: int, deadline: float | None) -> None:
    job: cf.Future[None] = cf.Future()
    marker = Marker(Phase.COMPUTE, job)
    waiting = asyncio.create_task(marker.wait(deadline))
    await asyncio.sleep(0)  # the wait is under way
    job.set_result(None)  # as the stream's thread would
    for _ in range(turns):  # the result reaches the loop over a few turns
        await asyncio.sleep(0)
    if not waiting.cancel():  # it had already returned: nothing to lose
        assert waiting.done() and waiting.exception() is None
        return
    with pytest.raises(asyncio.CancelledError):  # a pending wait that was cancelled ends cancelled
        await waiting
