"""Joining Ray has a deadline; a cluster the control plane cannot reach is refused; Ray's lines go
to the run's ray.log; ``warpdeck check`` lists the session's Ray against what a spec asks for.
Real Ray, real sockets, the real command in a subprocess."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from wd_cli import warpdeck

from warpdeck.engine.control.broker import BrokerAddress, free_port
from warpdeck.engine.control.plane import ControlSettings
from warpdeck.engine.scaleout import reach

SPEC = """
name = "connect-test"
backend = "numpy"
batch_size = 8
[executor]
kind = "ray"
{executor}
[source]
kind = "synthetic"
count = 40
shape = [4]
dtype = "float64"
[sink]
kind = "null"
[[stages]]
fn = "wd_stages:double"
"""


def _warpdeck(tmp: Path, executor: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp / "spec.toml").write_text(SPEC.format(executor=executor))
    t0 = time.monotonic()
    r = warpdeck(*args, cwd=tmp, columns=80, timeout=90)
    return r, time.monotonic() - t0


def _run(tmp: Path, executor: str, *flags: str) -> tuple[subprocess.CompletedProcess[str], float]:
    return _warpdeck(tmp, executor, "run", "spec.toml", "--headless", "--run-dir", "rd", *flags)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word (not a GCS)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        yield int(srv.getsockname()[1])


@pytest.mark.parametrize(("scheme", "what"), [("", "GCS"), ("ray://", "Ray client server")])
def test_a_closed_port_ends_the_run_within_the_deadline_in_one_line(tmp_path: Path, scheme: str, what: str) -> None:
    address = f"{scheme}127.0.0.1:{free_port()}"
    r, took = _run(tmp_path, f'address = "{address}"\nconnect_timeout_s = 3', "--broker", "none")
    assert r.returncode == 2, r.stderr
    assert took < 3 + 5, f"took {took:.1f} s"
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert address in lines[0] and what in lines[0] and "3 s" in lines[0] and "connection refused" in lines[0]
    assert not (tmp_path / "rd" / "journal.sqlite").exists(), "nothing started"


def test_a_port_that_accepts_but_is_not_ray_ends_the_run_within_the_deadline(tmp_path: Path, silent_port: int) -> None:
    address = f"127.0.0.1:{silent_port}"
    r, took = _run(tmp_path, f'address = "{address}"\nconnect_timeout_s = 3', "--broker", "none")
    assert r.returncode == 2, r.stderr
    assert took < 3 + 5, f"took {took:.1f} s"
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and address in lines[0] and "did not finish joining within 3 s" in lines[0], r.stderr


def test_a_cluster_on_another_host_with_the_embedded_broker_is_refused(tmp_path: Path) -> None:
    r, took = _run(tmp_path, 'address = "10.0.0.5:6379"\nconnect_timeout_s = 3')  # --broker embedded, the default
    assert r.returncode == 2, r.stderr
    assert took < 3 + 5
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "10.0.0.5" in lines[0] and "embedded broker" in lines[0] and "--broker mqtts://" in lines[0]
    assert "--ca-file" in lines[0]


def test_the_plane_rule() -> None:
    mine = {"127.0.0.1", "192.0.2.2"}
    embedded = reach.loopback_broker(ControlSettings())
    assert embedded is not None and "embedded" in embedded
    assert reach.loopback_broker(ControlSettings(broker=BrokerAddress("127.0.0.1", 1883))) is not None
    assert reach.loopback_broker(ControlSettings(broker=BrokerAddress("head", 8883))) is None
    assert reach.loopback_broker(None) is None
    # Before joining: the address alone.
    for ok in (None, "auto", "127.0.0.1:6379", "localhost:6379", "192.0.2.2:6379", "ray://127.0.0.1:10001"):
        assert reach.plane_refusal(ok, embedded, mine) is None, ok
    for far in ("10.0.0.5:6379", "ray://head.invalid:10001"):
        why = reach.plane_refusal(far, embedded, mine)
        assert why is not None and reach.PLANE_FIX in why, far
    # After joining: the alive nodes.
    here = reach.NodeInfo("192.0.2.2", True, 2, 2)
    assert reach.plane_refusal("auto", embedded, mine, [here, reach.NodeInfo("10.1.1.1", False, 2, 0)]) is None
    why = reach.plane_refusal("auto", embedded, mine, [here, reach.NodeInfo("10.1.1.1", True, 2, 0)])
    assert why is not None and "10.1.1.1" in why


def test_how_many_actors_a_cluster_holds() -> None:
    nodes = [reach.NodeInfo("a", True, 8, 2, {"nvme": 1}), reach.NodeInfo("b", True, 8, 1),
             reach.NodeInfo("c", False, 64, 8)]
    assert reach.actors_fit(nodes, reach.per_actor(1, 1, {})) == 3
    assert reach.actors_fit(nodes, reach.per_actor(4, 0.5, {})) == 4
    assert reach.actors_fit(nodes, reach.per_actor(1, 1, {"nvme": 1})) == 1
    assert reach.actors_fit(nodes, reach.per_actor(0, 0, {})) is None


def _gcs(ray: ModuleType) -> str:
    return str(ray.get_runtime_context().gcs_address)


def test_a_run_puts_rays_lines_in_its_log_and_says_where(ray_cluster: ModuleType, tmp_path: Path) -> None:
    quiet, _ = _run(tmp_path, f'address = "{_gcs(ray_cluster)}"\nworkers = 1', "--broker", "none")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", "Ray said nothing: no pointer"
    # A stage that prints (in the actor, which Ray would echo on the driver's terminal), in a run
    # long enough (16 batches of 100 ms) for Ray's log stream to bring the lines back before it ends.
    (tmp_path / "spec.toml").write_text(SPEC.format(executor=f'address = "{_gcs(ray_cluster)}"\nworkers = 1')
                                        .replace('fn = "wd_stages:double"', 'fn = "builtins:print"\n[[stages]]\n'
                                                 'fn = "wd_stages:sleep_100ms"').replace("count = 40", "count = 128"))
    r = warpdeck("run", "spec.toml", "--headless", "--run-dir", "rd2", "--broker", "none", cwd=tmp_path, columns=80,
                 timeout=90)
    assert r.returncode in (0, 1), r.stderr  # what print leaves in the outputs does not matter here
    log = tmp_path / "rd2" / reach.LOG_NAME
    pointer = (f"warpdeck: Ray or the actors wrote warnings, errors or output during the run; see "
               f"{log.relative_to(tmp_path)}")
    assert r.stderr.splitlines()[-1] == pointer, r.stderr
    assert "(LaneWorker" in log.read_text() and "numpy" in log.read_text()
    assert "(LaneWorker" not in r.stdout + r.stderr and "<module 'numpy'" not in r.stdout, r.stderr


def test_check_lists_the_cluster_against_the_spec(ray_cluster: ModuleType, tmp_path: Path) -> None:
    address = _gcs(ray_cluster)
    r, _ = _warpdeck(tmp_path, f'address = "{address}"\nresources = {{}}', "check", "spec.toml", "--json")
    assert r.returncode == 0, r.stderr
    ex = json.loads(r.stdout)["executor"]
    assert ex["joined"] is True and ex["join_s"] < 30
    alive = [n for n in ex["nodes"] if n["alive"]]
    assert len(alive) == 1 and alive[0]["GPU"] == 2 and alive[0]["CPU"] == 2, ex["nodes"]
    assert ex["per_worker"] == {"CPU": 1.0, "GPU": 1.0}
    assert (ex["workers"], ex["asks"], ex["holds"], ex["fits"]) == (2, {"CPU": 2.0, "GPU": 2.0}, 2, True)
    assert ex["data_mode"] in ("ship", "shared")

    r, _ = _warpdeck(tmp_path, f'address = "{address}"\nworkers = 3', "check", "spec.toml")
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "holds 2 of the 3 actors" in lines[0], r.stderr
    assert "does NOT fit" in r.stdout and "GPU" in r.stdout


def test_check_says_a_local_ray_would_have_no_gpu_for_the_actors(_ray_session: ModuleType, tmp_path: Path) -> None:
    """Without an address nothing is joined, but the GPUs a local Ray would count are: a spec whose
    actors need a GPU on a machine without one is not ready (the run would fail at start)."""
    from warpdeck.engine.scaleout import raylink

    if raylink.local_gpus() > 0:
        pytest.skip("this machine has a GPU")
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "nogpu"\nbackend = "numpy"\nexecutor = "ray"\nstages = [{ fn = "numpy:negative" }]\n'
                    '[source]\nkind = "synthetic"\ncount = 10\nshape = [2]\ndtype = "float32"\n')
    r = warpdeck("check", str(spec), cwd=tmp_path, columns=None, timeout=60, support=False)
    assert r.returncode == 2, r.stdout
    assert "error: this machine has 0 GPU(s) a local Ray would see" in r.stderr and "gpus_per_worker = 0" in r.stderr
    spec.write_text(spec.read_text().replace('executor = "ray"', "executor = { kind = \"ray\", gpus_per_worker = 0 }"))
    ok = warpdeck("check", str(spec), cwd=tmp_path, columns=None, timeout=60, support=False)
    assert ok.returncode == 0, ok.stderr
