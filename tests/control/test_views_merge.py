"""The snapshot's worker rows (engine/control/views.py): a merge that reuses the previous call's rows
gives exactly the rows a fresh merge gives, whatever changed in between."""

from __future__ import annotations

from dataclasses import replace

from warpdeck.engine.control.monitor import WorkerMonitor
from warpdeck.engine.control.monitor_types import WorkerStatus
from warpdeck.engine.control.views import merge_workers
from warpdeck.engine.control.wire import DeviceStats, Heartbeat
from warpdeck.engine.state.snapshot import WorkerView

IDS = [f"w-{i:03d}" for i in range(40)]
LOCAL = WorkerView(id="w-007", state="online", host="here", pid=1, device="cpu", epoch=0, lanes=2, lanes_busy=1,
                   progress=3, tasks_done=5, tasks_failed=0)


def _statuses(monitor: WorkerMonitor, now: float) -> tuple[WorkerStatus, ...]:
    return tuple(monitor.views(now))


def _fresh(heard: tuple[WorkerStatus, ...], quarantined: set[str],
           hbs: dict[str, Heartbeat]) -> tuple[WorkerView, ...]:
    """The merge with copies of every row: nothing of an earlier call can be reused."""
    return merge_workers([LOCAL], [replace(s) for s in reversed(heard)], quarantined, dict(hbs))


def test_a_merge_reusing_rows_equals_a_fresh_one() -> None:
    monitor = WorkerMonitor()
    for k, wid in enumerate(reversed(IDS)):
        monitor.on_birth(wid, 1, 0.0, info={"host": f"h{k}", "pid": k, "device": "gpu", "lanes": 2})
        monitor.on_heartbeat(wid, 1, 0, k, 0.1, busy=True)
    hbs = {wid: Heartbeat(worker=wid, epoch=1, seq=0, progress=0, lanes_busy=1) for wid in IDS}
    quarantined: set[str] = set()
    heard = _statuses(monitor, 0.2)
    steps = [
        lambda: None,  # nothing changed
        lambda: hbs.update({IDS[3]: Heartbeat(worker=IDS[3], epoch=1, seq=1, progress=1, lanes_busy=0)}),
        lambda: hbs.update({IDS[4]: Heartbeat(worker=IDS[4], epoch=1, seq=1, progress=1, lanes_busy=1,
                                              device=DeviceStats(util_pct=50, mem_used_mb=1, mem_total_mb=2))}),
        lambda: quarantined.add(IDS[5]),
        lambda: hbs.pop(IDS[6]),
        lambda: quarantined.discard(IDS[5]),
    ]
    for step in steps:
        merge_workers([LOCAL], heard, quarantined, dict(hbs))  # the rows the next merge may reuse
        step()
        assert merge_workers([LOCAL], heard, quarantined, dict(hbs)) == _fresh(heard, quarantined, hbs)
    merge_workers([LOCAL], heard, quarantined, dict(hbs))
    monitor.on_heartbeat(IDS[8], 1, 1, 99, 0.6, busy=False)
    monitor.on_death(IDS[9], 1, 0.7, graceful=True)
    heard = _statuses(monitor, 0.8)
    got = merge_workers([LOCAL], heard, quarantined, dict(hbs))
    assert got == _fresh(heard, quarantined, hbs)
    assert [r.id for r in got] == ["w-007", *(w for w in IDS if w != "w-007")]
    assert {r.id: r for r in got}[IDS[9]].state == "dead"


def test_a_list_changed_in_place_is_sorted_again() -> None:
    monitor = WorkerMonitor()
    for wid in IDS[:3]:
        monitor.on_birth(wid, 1, 0.0)
    heard: list[WorkerStatus] = monitor.views(0.1)
    first = merge_workers([], heard, set(), {})
    heard.reverse()
    heard.pop()
    assert [r.id for r in merge_workers([], heard, set(), {})] == [r.id for r in first[1:]]


def test_a_heartbeats_device_figures_reach_the_workers_rows() -> None:
    monitor = WorkerMonitor()
    for wid in ("w-007", "w-100"):  # the local worker (the engine's own lanes) and a remote one
        monitor.on_birth(wid, 1, 0.0, info={"device": "gpu"})
    stats = DeviceStats(util_pct=99, mem_used_mb=4497, mem_total_mb=143_771, temp_c=45, power_w=275.7)
    hbs = {wid: Heartbeat(worker=wid, epoch=1, seq=0, progress=0, device=stats) for wid in ("w-007", "w-100")}
    rows = {r.id: r for r in merge_workers([LOCAL], monitor.views(0.1), set(), hbs)}
    for wid in ("w-007", "w-100"):
        r = rows[wid]
        assert (r.util_pct, r.mem_used_mb, r.mem_total_mb, r.temp_c, r.power_w) == (99, 4497, 143_771, 45, 275.7)
