"""A real multi-node Ray (``ray.cluster_utils.Cluster``: a head without CPUs, two worker nodes of 2
CPUs and 1 fake GPU each), real Mosquitto (issue 19):

- ``placement = "spread"`` puts the two actors on different nodes;
- a worker node lost outright mid-run: nothing lost, nothing written twice, outputs equal to what
  the stage computes; the actor restarts on the survivor (room there) and takes work again;
- a worker node drained gracefully mid-run with no room left on the survivor: its batches are
  requeued and the run finishes on the other actor, while the lost actor's row (and the report)
  says ``restarting: waiting for 1 GPU``;
- the headless display's lines for each (from the engine's real run events);
- a stage module shipped only by ``runtime_env.py_modules`` runs on the actors; without it the start
  fails naming the module.

The figures measured (node loss to conviction, to its requeued batches done) are printed (-s)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from wd_broker import Mosquitto
from wd_build import spec as build_spec
from wd_cli import warpdeck
from wd_control import EngineThread, wait_for
from wd_stages import RecordingSink, assert_doubled_once

from warpdeck.cli.worker_lines import WorkerLines
from warpdeck.engine.api import ControlSettings, Engine, Pause, PipelineSpec, Resume
from warpdeck.engine.scaleout.executor import StageModuleMissing

COUNT = 640
BATCH = 8


@pytest.fixture(autouse=True)
def _every_node_back(ray_nodes: Any) -> Iterator[None]:
    """Two worker nodes again after each test, however it ended: one that failed with a node removed
    left the next test a node short, and it failed too."""
    yield
    ray_nodes.restore()


def _spec(name: str, **executor: Any) -> PipelineSpec:
    # 40 ms per batch of 8 (the stage sleeps): 80 batches, about 1.6 s over two actors, 3.2 s on one
    # (a node's loss is seen in about a second, its actor back in two or three).
    return build_spec(["wd_stages:slow_double_40ms"], name=name, batch_size=BATCH,
                      executor={"kind": "ray", "workers": 2, "placement": "spread", **executor},
                      source={"kind": "synthetic", "count": COUNT, "shape": [4], "dtype": "float32", "seed": 3})


@dataclass(frozen=True)
class _Loss:
    eng: Any
    victim: Any  # ray-1's RemoteWorker
    nodes: dict[str, str]  # actor -> node id, before the loss
    old_epoch: int  # ray-1's epoch before the loss
    lost_at: float  # time.monotonic() as the node's removal began


def _lose_ray1(et: EngineThread, ray_nodes: Any, said: list[str], graceful: bool) -> _Loss:
    """With the headless lines going to ``said``: both actors up on different nodes and ray-1
    working with batches in hand; then ray-1's node removed, and its batches taken back."""
    eng = et.engine
    assert eng is not None and eng.executor is not None
    eng.events.subscribe(WorkerLines(said.append).listen)
    workers = eng.executor.workers
    wait_for(lambda: all(w.hello is not None for w in workers), 60, "both actors up")
    nodes = {w.id: ray_nodes.node_of(w.handle) for w in workers}
    assert nodes["ray-0"] != nodes["ray-1"], f"placement = 'spread': one node per actor, got {nodes}"
    victim = workers[1]
    wait_for(lambda: victim.batches_done >= 1 and len(eng.leases.leased_to(victim.id)) >= 1, 60,
             "ray-1 working, batches in hand")
    node = next(n for n in ray_nodes.workers if n.node_id == nodes["ray-1"])
    loss = _Loss(eng, victim, nodes, victim.epoch, time.monotonic())
    ray_nodes.remove(node, graceful=graceful)
    wait_for(lambda: eng.leases.reclaimed >= 1, 15, "ray-1 convicted, its batches taken back")
    return loss


def _figures(eng: Any, lost_at: float, what: str) -> None:
    """Print node loss → conviction, → first and last requeued task done (the table's clock)."""
    conviction = eng.executor.convictions[0]
    attempts = eng.table.attempt[: len(eng.table)]
    again = eng.table.t_end[: len(eng.table)][attempts == 2]
    print(f"\n{what}: node loss -> conviction ({conviction.why.split(':')[0]}) {conviction.at - lost_at:.3f} s; "
          f"-> first requeued task done {again.min() - lost_at:.3f} s, all {again.max() - lost_at:.3f} s "
          f"({len(again)} tasks)")


def test_a_node_lost_outright_loses_nothing_and_its_actor_works_again_on_the_survivor(
        ray_nodes: Any, mosquitto: Mosquitto) -> None:
    sink = RecordingSink()
    said: list[str] = []
    # gpus_per_worker = 0: each actor takes 1 of a node's 2 CPUs, so the survivor has room for a second.
    with EngineThread(_spec("mn-hard", gpus_per_worker=0), mosquitto.address, sink=sink) as et:
        loss = _lose_ray1(et, ray_nodes, said, graceful=False)
        eng, victim, nodes, old_epoch, lost_at = loss.eng, loss.victim, loss.nodes, loss.old_epoch, loss.lost_at
        # Hold new batches until ray-1 is back, so that work is left for it whatever the timing.
        assert et.command(Pause()).ok
        wait_for(lambda: victim.epoch > old_epoch, 60, "ray-1 restarted by Ray on the surviving node")
        back_at = time.monotonic()
        assert ray_nodes.node_of(victim.handle) == nodes["ray-0"], "restarted where there was room"
        done_before = victim.batches_done
        assert et.command(Resume()).ok
        wait_for(et.finished, 60, "run finished")
        report = et.report
        assert report.counts.done == COUNT and report.counts.failed == 0
        assert victim.batches_done > done_before, "the restarted actor took work again"
    assert_doubled_once(sink, COUNT)
    attempts = eng.table.attempt[: len(eng.table)]
    assert int((attempts == 2).sum()) == BATCH * eng.leases.reclaimed, "each taken-back task ran a second attempt"
    assert "ray-1" in report.control.workers_lost and not report.control.workers_waiting
    convicted = [ln for ln in said if " worker ray-1 convicted (" in ln]
    assert len(convicted) == 1 and f"{eng.leases.reclaimed} batch" in convicted[0], said
    assert any(f"worker ray-1 back under epoch {victim.epoch} (pid {victim.hello.pid})" in ln for ln in said), said
    print(f"\nhard loss: node loss -> actor back on the survivor {back_at - lost_at:.2f} s")
    _figures(eng, lost_at, "hard loss (run paused until the actor was back)")


def test_a_node_drained_with_no_room_left_says_so_and_the_run_finishes_on_the_other_actor(
        ray_nodes: Any, mosquitto: Mosquitto) -> None:
    sink = RecordingSink()
    said: list[str] = []
    # Each actor takes its node's one GPU: the survivor has none left for the lost actor.
    with EngineThread(_spec("mn-full", gpus_per_worker=1), mosquitto.address, sink=sink) as et:
        loss = _lose_ray1(et, ray_nodes, said, graceful=True)
        eng, lost_at = loss.eng, loss.lost_at

        def row_note() -> str:
            row = et.worker("ray-1")
            return row.note if row is not None else ""

        wait_for(lambda: "waiting for 1 GPU" in row_note(), 20, "ray-1's row says what it waits for")
        assert row_note() == "restarting: waiting for 1 GPU"
        wait_for(et.finished, 60, "run finished on ray-0 alone")
        report = et.report
        assert report.counts.done == COUNT and report.counts.failed == 0
    assert_doubled_once(sink, COUNT)
    attempts = eng.table.attempt[: len(eng.table)]
    assert int((attempts == 2).sum()) == BATCH * eng.leases.reclaimed
    assert report.control.workers_waiting == {"ray-1": "restarting: waiting for 1 GPU"}
    assert sum(" worker ray-1 convicted (" in ln for ln in said) == 1, said
    assert any(ln.endswith("worker ray-1 restarting: waiting for 1 GPU") for ln in said), said
    _figures(eng, lost_at, "graceful drain, no room (run not paused)")


_SHIPPED = '''
def triple(xp, inp, out):
    xp.multiply(inp, 3, out=out)
'''


async def _run(spec: PipelineSpec, run_dir: Path, control: ControlSettings) -> int:
    async with Engine(spec, run_dir, control=control) as eng:
        report = await eng.wait()
    return report.counts.done


async def test_a_stage_module_shipped_by_runtime_env_runs_on_the_actors(
        ray_nodes: Any, mosquitto: Mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "shipped" / "wdshipped"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(_SHIPPED)
    # The engine's node has the module (as where the spec is written); the actors' nodes do not.
    monkeypatch.syspath_prepend(str(tmp_path / "shipped"))
    control = ControlSettings(broker=mosquitto.address)
    source = {"kind": "synthetic", "count": 48, "shape": [4], "dtype": "float32"}

    def spec(**executor: Any) -> PipelineSpec:
        return build_spec(["wdshipped:triple"], name="mn-shipped", source=source,
                          executor={"kind": "ray", "gpus_per_worker": 0, "workers": 2, **executor})

    with pytest.raises(StageModuleMissing) as err:
        await _run(spec(), tmp_path / "without", control)
    assert "'wdshipped'" in str(err.value) and "runtime_env" in str(err.value) and "py_modules" in str(err.value)
    done = await _run(spec(workers=1, runtime_env={"py_modules": [str(package)]}), tmp_path / "with", control)
    assert done == 48


class _Idle:
    def ping(self) -> int:
        return 1


def test_an_actor_no_node_has_room_for_says_what_it_waits_for(ray_nodes: Any) -> None:
    """Ray's actor table, read as the engine reads it: resources no live node has free are named
    (each node here has 1 GPU and no ``nvme``; 1 CPU is free on both, so it is not named)."""
    from warpdeck.engine.scaleout import raylink

    [handle] = raylink.spawn(_Idle, 1, lambda k: (), gpus=2, cpus=1, resources={"nvme": 1}, max_restarts=0)
    try:
        said: list[str | None] = []
        wait_for(lambda: said.append(raylink.actor_waiting(handle)) or said[-1], 10, "a reason to wait", step=0.1)
        assert said[-1] == "starting: waiting for 2 GPU, 1 nvme"
        [fits] = raylink.spawn(_Idle, 1, lambda k: (), gpus=0, cpus=1, max_restarts=0)
        assert ray_nodes.ray.get(fits.ping.remote(), timeout=30) == 1
        assert raylink.actor_waiting(fits) is None, "alive: nothing to say"
        raylink.kill(fits)
    finally:
        raylink.kill(handle)


class _Env:
    def get(self, name: str) -> str | None:
        return os.environ.get(name)


def test_actors_check_their_raylet_every_100_ms_unless_told_otherwise(ray_nodes: Any) -> None:
    """A lost raylet's actors exit at their next check of it, and only then does the broker send
    their Will: every actor is started checking every ``RAYLET_CHECK_MS`` (Ray's default is 1 s),
    and a value the spec's ``runtime_env.env_vars`` gives wins, its other variables kept."""
    from warpdeck.engine.scaleout import raylink

    name = "RAY_raylet_death_check_interval_milliseconds"
    [plain] = raylink.spawn(_Env, 1, lambda k: (), gpus=0, cpus=1, max_restarts=0)
    [told] = raylink.spawn(_Env, 1, lambda k: (), gpus=0, cpus=1, max_restarts=0,
                           runtime_env={"env_vars": {name: "250", "WD_OTHER": "kept"}})
    try:
        get = ray_nodes.ray.get
        assert get(plain.get.remote(name), timeout=30) == str(raylink.RAYLET_CHECK_MS) == "100"
        assert get([told.get.remote(name), told.get.remote("WD_OTHER")], timeout=30) == ["250", "kept"]
    finally:
        raylink.kill(plain)
        raylink.kill(told)


def test_the_cli_exits_2_naming_a_stage_module_the_actors_cannot_import(ray_nodes: Any, tmp_path: Path) -> None:
    """``warpdeck run`` against the cluster: the engine finds the module beside the spec, the actors
    (on nodes without it) cannot; exit 2, the module and the fix named, nothing run."""
    here = tmp_path / "specs"
    here.mkdir()
    (here / "wdbeside.py").write_text(_SHIPPED)
    (here / "spec.toml").write_text(f"""
name = "mn-cli"
backend = "numpy"
batch_size = 8
[source]
kind = "synthetic"
count = 16
shape = [4]
[sink]
kind = "null"
[[stages]]
fn = "wdbeside:triple"
[executor]
kind = "ray"
address = "{ray_nodes.cluster.address}"
workers = 1
gpus_per_worker = 0
""")
    r = warpdeck("run", str(here / "spec.toml"), "--headless", "--broker", "none", "--run-dir", str(tmp_path / "rd"),
                 cwd=tmp_path, columns=200, support=False)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "cannot import module 'wdbeside'" in r.stderr and "py_modules" in r.stderr, r.stderr
