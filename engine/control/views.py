"""Worker rows for the snapshot: the engine's own worker merged with what the monitor heard.

The local worker's lanes, progress and task counts come from the engine itself (exact, no
broker needed); its state, heartbeat age and phi come from the monitor once its heartbeats are
heard, so the control room shows the same liveness for every worker, local or remote.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from warpdeck.engine.control.monitor import WorkerStatus
from warpdeck.engine.control.wire import Heartbeat
from warpdeck.engine.snapshot import WorkerView

__all__ = ["local_worker_id", "merge_workers"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]+")


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
    hbs = heartbeats or {}
    rows = list(locals_)
    at = {w.id: i for i, w in enumerate(rows)}
    for st in sorted(heard, key=lambda s: s.worker_id):
        wid = st.worker_id
        state = "quarantined" if wid in quarantined else str(st.state)
        hb = hbs.get(wid)
        dev = hb.device if hb is not None else None
        if wid in at:
            local = rows[at[wid]]
            rows[at[wid]] = replace(
                local, state="quarantined" if local.state == "quarantined" else state, epoch=st.epoch,
                heartbeat_age_s=st.heartbeat_age_s, phi=st.phi,
                util_pct=dev.util_pct if dev else local.util_pct,
                mem_used_mb=dev.mem_used_mb if dev else local.mem_used_mb,
                mem_total_mb=dev.mem_total_mb if dev else local.mem_total_mb)
            continue
        info = st.info
        rows.append(WorkerView(
            id=wid, state=state, host=_str(info, "host"), pid=_int(info, "pid"), device=_str(info, "device"),
            epoch=st.epoch, lanes=_int(info, "lanes"), lanes_busy=hb.lanes_busy if hb else int(st.busy),
            progress=st.progress or 0, tasks_done=0, tasks_failed=0, heartbeat_age_s=st.heartbeat_age_s, phi=st.phi,
            util_pct=dev.util_pct if dev else None, mem_used_mb=dev.mem_used_mb if dev else None,
            mem_total_mb=dev.mem_total_mb if dev else None))
    return tuple(rows)
