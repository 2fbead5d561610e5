"""Which board column a task stands in: the one rule the control room and telemetry share.

The decision this module protects: each task stands in exactly one column, whatever else it is:
a stalled task (queued or running) in *stalled*; a running task in its phase's column (one not
yet in a phase, in *queued*); a finished one in *failed*, *cancelled* or *done*. The rule is a
lookup table indexed by ``stalled << 6 | state << 3 | phase``, so a million tasks are placed with
one vectorised take, and the board (tui/board_model.py) and the columns telemetry samples for an
attached control room (engine/control/telemetry.py) cannot drift apart.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from warpdeck.engine.state.task_states import Phase, State

__all__ = ["CANCELLED", "COLUMN_CODES", "DONE", "FAILED", "NOWHERE", "QUEUED", "STALLED", "column_codes"]

QUEUED = 0
"""Column codes: 0 queued, 1..5 the running phase (fill, h2d, compute, d2h, sink), then these."""
STALLED = 6
FAILED, CANCELLED, DONE = 7, 8, 9
"""Finished tasks by rank: failed first (they want attention), then cancelled, then done."""
NOWHERE = 255


def _code_table() -> npt.NDArray[np.uint8]:
    table = np.full(128, NOWHERE, np.uint8)
    for stalled in (0, 1):
        for state in range(8):
            for phase in range(8):
                if stalled and state in (State.QUEUED, State.RUNNING):
                    code = STALLED
                elif state == State.QUEUED or (state == State.RUNNING and phase == Phase.NONE):
                    code = QUEUED
                elif state == State.RUNNING:
                    code = phase if phase <= Phase.SINK else NOWHERE
                elif state == State.FAILED:
                    code = FAILED
                elif state == State.CANCELLED:
                    code = CANCELLED
                else:
                    code = DONE
                table[stalled << 6 | state << 3 | phase] = code
    return table


COLUMN_CODES = _code_table()
"""Column code by ``stalled << 6 | state << 3 | phase`` (``stalled`` is 0 or 1)."""
_BITS = 8  # state and phase each take three bits of the index
assert int(Phase.SINK) == STALLED - 1 and max(State) < _BITS and max(Phase) < _BITS  # the layout relies on these


def column_codes(state: npt.NDArray[np.int8], phase: npt.NDArray[np.int8],
                 stall: npt.NDArray[np.int8]) -> npt.NDArray[np.uint8]:
    """Each task's column code (a new array; the board keeps its own scratch for speed)."""
    index = (stall != 0).astype(np.uint8) << 6 | state.astype(np.uint8) << 3 | phase.astype(np.uint8)
    codes: npt.NDArray[np.uint8] = COLUMN_CODES[index]
    return codes
