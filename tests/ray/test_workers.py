"""The control room's worker list (the engine snapshot's ``workers``) shows each Ray actor as a
worker of its own: online, heard over MQTT (heartbeat age, epoch of its birth), with the host,
pid and device its birth announced."""

from __future__ import annotations

from types import ModuleType

from wd_broker import Mosquitto
from wd_build import spec as build_spec
from wd_control import EngineThread, wait_for

from warpdeck.cli.worker_lines import WorkerLines
from warpdeck.engine.api import RunEvent, WorkerConvicted, WorkerGone


def test_the_worker_list_shows_both_actors(ray_cluster: ModuleType, mosquitto: Mosquitto) -> None:
    spec = build_spec(["wd_stages:sleep_100ms"], name="ray-workers", executor="ray",
                      source={"kind": "synthetic", "count": 1_000_000, "shape": [4], "dtype": "float32"})
    with EngineThread(spec, mosquitto.address) as et:
        eng = et.engine
        assert eng is not None and eng.executor is not None

        def heard_both() -> bool:
            rows = {w.id: w for w in (et.snapshot().workers if et.snapshot() else ())}
            return all(i in rows and rows[i].heartbeat_age_s is not None and rows[i].progress > 0
                       for i in ("ray-0", "ray-1"))

        wait_for(heard_both, 60, "both actors heard over MQTT, each with a batch done")
        # A busy CI machine may starve an actor past the monitor's patience: it is then born again
        # under a newer epoch, and the rows follow within a snapshot or two. Wait for agreement.
        def agree() -> bool:
            rows = {w.id: w for w in et.snapshot().workers}  # type: ignore[union-attr]
            return all(w.hello is not None and rows[w.id].state == "online"
                       and (rows[w.id].host, rows[w.id].pid, rows[w.id].device, rows[w.id].epoch)
                       == (w.hello.host, w.hello.pid, w.hello.device, w.epoch)
                       for w in eng.executor.workers)  # type: ignore[union-attr]

        wait_for(agree, 15, "each actor's row as its birth announced it, online")
        rows = {w.id: w for w in et.snapshot().workers}  # type: ignore[union-attr]
        assert set(rows) == {"ray-0", "ray-1"}, "an actor is a worker; the engine itself computes nothing"
        for row in rows.values():
            assert "ray gpu" in row.device and row.lanes == 1
        assert len({row.pid for row in rows.values()}) == 2, "one process per actor"
        # The monitor knows them from their own births (their own MQTT connections).
        heard = {s.worker_id: s for s in eng.control.workers}  # type: ignore[union-attr]
        assert {"ray-0", "ray-1"} <= set(heard)
        assert heard["ray-0"].info["pid"] == rows["ray-0"].pid


def test_the_actors_goodbyes_as_a_run_ends_tell_of_no_loss(ray_cluster: ModuleType, mosquitto: Mosquitto) -> None:
    """Asked to stop as the run ends, each actor says goodbye on the broker, which convicts its epoch:
    a goodbye the engine asked for is no loss. No worker line (a CI run once printed ``convicted
    (graceful): 0 batches`` and ``gone: Ray will not restart it`` after a clean end), no event."""
    spec = build_spec(["wd_stages:double"], name="ray-bye", executor="ray",
                      source={"kind": "synthetic", "count": 256, "shape": [4], "dtype": "float32"})
    said: list[str] = []
    events: list[RunEvent] = []
    with EngineThread(spec, mosquitto.address) as et:
        assert et.engine is not None
        et.engine.events.subscribe(WorkerLines(said.append).listen)
        et.engine.events.subscribe(events.append)
        wait_for(et.finished, 60, "run finished")
    assert et.report.counts.done == 256
    assert said == [], said
    assert not [e for e in events if isinstance(e, WorkerConvicted | WorkerGone)], events
