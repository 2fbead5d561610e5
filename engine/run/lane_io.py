"""A lane's host-side work on whole batches: loading inputs into a batch's rows, writing its outputs.

The decision this module protects: both run on a lane's own host threads (fill and sink), never on
the event loop; each task's error is returned in its place, so one bad input or one
failed write never fails its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from warpdeck.engine.edges.sinks import Sink, batch_writer, rows_writer
from warpdeck.engine.state.batches import TaskInput
from warpdeck.engine.state.records import NonFiniteOutput

__all__ = ["Loader", "load_rows", "write_outputs"]


Loader = Callable[[Sequence[TaskInput], Any], list[BaseException | None]]
"""``load(items, out)``: writes item j's input into ``out[j]``; each item's error or None (``Source.load``, or a lane's
worker processes: engine/run/process_fill.py)."""


def load_rows(load: Loader, items: Sequence[TaskInput], out: Any) -> list[BaseException | None]:
    """Load ``items`` into the rows of ``out``; each task's error (or None). Runs on a fill thread.
    When some rows failed, the good ones are moved up to the front, in order, so that the batch of
    the rest (``LaneHost.on_filled``) finds its inputs in ``out[:len(rest)]``."""
    errors = load(items, out)
    good = [j for j, e in enumerate(errors) if e is None]
    if len(good) < len(errors) and good:
        out[: len(good)] = out[good]
    return errors


def write_outputs(sink: Sink, keys: Sequence[str], host_out: Any, policy: str,
                  counted: Any = None) -> list[BaseException | None]:
    """Write row j of ``host_out`` under ``keys[j]``; each task's error (or None). Under the
    ``nonfinite`` policy a row holding NaN or infinity is flagged (written) or failed (not written).
    Runs on a sink thread. The rows' counts of such values are ``counted`` where the device made
    them (``Backend.nonfinite_counter``); otherwise one vectorised pass over the batch finds them."""
    check = policy != "allow" and host_out.dtype.kind in "fc"
    errors: list[BaseException | None] = []
    if counted is not None:
        bad: list[int] | None = counted.tolist()
    else:
        bad = (~np.isfinite(host_out.reshape(len(keys), -1))).sum(axis=1).tolist() if check else None
    size = host_out[0].size if len(keys) else 0
    rows = rows_writer(sink)
    if rows is not None:
        return _write_whole(rows, True, keys, host_out, bad, size, policy)
    whole = batch_writer(sink)
    if whole is not None:
        return _write_whole(whole, False, keys, host_out, bad, size, policy)
    for j, key in enumerate(keys):
        if bad is not None and bad[j] and policy == "fail":
            errors.append(NonFiniteOutput(key, bad[j], size, written=False))
            continue
        try:
            sink.write(key, host_out[j])
            errors.append(NonFiniteOutput(key, bad[j], size, written=True) if bad is not None and bad[j] else None)
        except Exception as exc:  # noqa: BLE001 - per task
            errors.append(exc)
    return errors


def _write_whole(whole: Callable[[Sequence[str], Any], Any], per_row: bool, keys: Sequence[str], host_out: Any,
                 bad: list[int] | None, size: int, policy: str) -> list[BaseException | None]:
    """``write_outputs`` for a sink that takes a batch at once: one call. A ``write_batch``'s failure
    fails every task it held; a ``write_rows`` (``per_row``) answers for each."""
    errors: list[BaseException | None] = [None] * len(keys)
    write = list(range(len(keys)))
    if bad is not None:
        for j in write:
            if bad[j]:
                errors[j] = NonFiniteOutput(keys[j], bad[j], size, written=policy != "fail")
        if policy == "fail":
            write = [j for j in write if not bad[j]]
    if not write:
        return errors
    try:
        rows = host_out[: len(keys)] if len(write) == len(keys) else host_out[write]
        said = whole([keys[j] for j in write], rows)
    except Exception as exc:  # noqa: BLE001 - every task of the batch
        for j in write:
            errors[j] = exc
        return errors
    if per_row:
        if len(said) != len(write):
            raise RuntimeError(f"write_rows answered {len(said)} of {len(write)} outputs")
        for j, e in zip(write, said, strict=True):
            if e is not None:
                errors[j] = e
    return errors
