"""Worker rows for the snapshot: the engine's own worker merged with what the monitor heard.

The local worker's lanes, progress and task counts come from the engine itself (exact, no
broker needed); its state, heartbeat age and phi come from the monitor once its heartbeats are
heard, so the control room shows the same liveness for every worker, local or remote.

The merge runs on the engine's loop for every snapshot (10 Hz), while the monitor's rows change
at 2 Hz and a worker's heartbeat twice a second: a remote worker's row is built again only when
what it is built from changed (its monitor row, by identity; its state; its heartbeat's lanes and
device), and the others are the previous call's rows. At 1 000 workers a merge took 3.4 ms.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from warpdeck.engine.control.monitor_types import WorkerStatus
from warpdeck.engine.control.wire import DeviceStats, Heartbeat
from warpdeck.engine.state.part_views import WorkerState
from warpdeck.engine.state.snapshot import WorkerView

__all__ = ["local_worker_id", "merge_workers"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")
_Built = tuple[WorkerStatus, WorkerState, int | None, DeviceStats | None, WorkerView]
"""A remote worker's row and what it was built from: (monitor row, state, lanes busy, device, row)."""
_rows: dict[str, _Built] = {}
"""The last merge's remote rows by worker id, and its rows of ``heard`` in id order (with that ``heard``). Entries are
checked by identity before use, so a stale one is never used: the engine's loop is the only caller in a run, and callers
in other threads at worst rebuild rows."""
_order: tuple[Collection[WorkerStatus], list[WorkerStatus]] | None = None


def local_worker_id(host: str, device: str) -> str:
    """``host.device`` made safe as an MQTT topic level (``gpu-node-3.cuda0``)."""
    raw = f"{host}.{device}".strip(".")
    slug = _UNSAFE.sub("-", raw).strip("-") or "worker"
    if not slug[0].isalnum():
        slug = f"w{slug}"
    return slug[:128]


def _int(info: Mapping[str, object], key: str) -> int:
    v = info.get(key)
    return int(v) if isinstance(v, int | float) else 0


def _str(info: Mapping[str, object], key: str) -> str:
    v = info.get(key)
    return v if isinstance(v, str) else ""


def merge_workers(
    locals_: Sequence[WorkerView],
    heard: Collection[WorkerStatus],
    quarantined: Collection[str],
    heartbeats: Mapping[str, Heartbeat] | None = None,
) -> tuple[WorkerView, ...]:
    """The local workers first, then every other worker the monitor knows, by id. ``heartbeats``
    (each worker's newest) adds lanes busy and device load where the worker reports them."""
    global _rows, _order  # noqa: PLW0603 - the previous merge's rows (see the module's docstring)
    hbs = heartbeats or {}
    rows = list(locals_)
    at = {w.id: i for i, w in enumerate(rows)}
    order = _order
    if order is None or order[0] is not heard or not isinstance(heard, tuple):  # a list may have changed
        order = (heard, sorted(heard, key=lambda s: s.worker_id))
        _order = order
    before, built = _rows, {}
    for st in order[1]:
        wid = st.worker_id
        state = WorkerState.QUARANTINED if wid in quarantined else st.state
        hb = hbs.get(wid)
        dev = hb.device if hb is not None else None
        if wid in at:
            local = rows[at[wid]]
            rows[at[wid]] = replace(
                local, state=WorkerState.QUARANTINED if local.state == WorkerState.QUARANTINED else state,
                epoch=st.epoch,
                heartbeat_age_s=st.heartbeat_age_s, phi=st.phi,
                util_pct=dev.util_pct if dev else local.util_pct,
                mem_used_mb=dev.mem_used_mb if dev else local.mem_used_mb,
                mem_total_mb=dev.mem_total_mb if dev else local.mem_total_mb,
                temp_c=dev.temp_c if dev else local.temp_c, power_w=dev.power_w if dev else local.power_w)
            continue
        busy = hb.lanes_busy if hb is not None else None
        prev = before.get(wid)
        if prev is not None and prev[0] is st and prev[1] == state and prev[2] == busy and prev[3] == dev:
            built[wid] = prev
            rows.append(prev[4])
            continue
        info = st.info
        row = WorkerView(
            id=wid, state=state, host=_str(info, "host"), pid=_int(info, "pid"), device=_str(info, "device"),
            epoch=st.epoch, lanes=_int(info, "lanes"), lanes_busy=hb.lanes_busy if hb else int(st.busy),
            progress=st.progress or 0, tasks_done=0, tasks_failed=0, heartbeat_age_s=st.heartbeat_age_s, phi=st.phi,
            util_pct=dev.util_pct if dev else None, mem_used_mb=dev.mem_used_mb if dev else None,
            mem_total_mb=dev.mem_total_mb if dev else None, temp_c=dev.temp_c if dev else None,
            power_w=dev.power_w if dev else None)
        built[wid] = (st, state, busy, dev, row)
        rows.append(row)
    _rows = built
    return tuple(rows)
