"""The engine's only contact with Ray: connect, start actors, call them from asyncio, kill them.

The decisions this module protects:
- Ray is imported here and nowhere else in the engine, lazily, inside these functions (an
  import-linter contract forbids ``ray`` to every other engine module). Without ``warpdeck[ray]``
  installed, a ``kind = "ray"`` spec fails with an error that says what to install.
- Actors are restartable (``max_restarts``) but Ray never retries a call (``max_task_retries=0``):
  the engine owns requeue under its lease and epoch fence, so a batch runs again only when the
  engine decides, and is committed once.
- A call is awaited on the engine's event loop (an ``ObjectRef`` is awaitable): no thread pool
  blocks on ``ray.get``. Ray's own errors are mapped to two of ours: ``WorkerDied`` (the actor
  process is gone or unreachable: its work is lost) and ``WorkerCallFailed`` (anything else).
- What each actor reserves (CPUs, GPUs, custom resources), where it goes (``spread``: Ray's SPREAD;
  ``pack``: Ray's default, which fills a node first) and its ``runtime_env`` are given to Ray as
  the spec says, and nothing else: no placement group, so a restarted actor may land on any node
  with room (a placement group's bundles die with their node). One setting is added: each actor
  checks that its node's raylet is alive every ``RAYLET_CHECK_MS`` (Ray's default: 1 s), so a lost
  raylet's actors exit, and their broker connections drop (the Will), within 0.1 s of it.
- Why an actor is not running (restarting, waiting for resources no node has free) is read from
  the GCS actor table (``actor_waiting``), not the state API: that needs the dashboard, which a
  local Ray here runs without.
- Joining has a deadline: the address is probed first (engine/scaleout/reach.py) and ``ray.init``
  then runs on a thread the engine stops waiting for at the deadline, since Ray's own GCS client
  retries for minutes. Given a run directory, Ray's lines (its loggers, the actors' output, the
  driver's C++ warnings while it joins) go to ``<run dir>/ray.log``, never the terminal.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from warpdeck.engine.backends.base import BackendError
from warpdeck.engine.scaleout import reach

if TYPE_CHECKING:
    from warpdeck.engine.control.plane import ControlSettings

__all__ = ["RayUnavailable", "WorkerCallFailed", "WorkerDied", "actor_waiting", "call", "cluster_gpus", "cluster_nodes",
           "connect", "disconnect", "kill", "local_gpus", "local_ips", "ray_running", "spawn"]


class RayUnavailable(BackendError):
    """Ray is not installed, the cluster cannot be joined, or it cannot hold the actors."""

    def __init__(self, reason: str) -> None:
        super().__init__("ray", reason)


class WorkerDied(RuntimeError):
    """Ray reports the actor dead or unreachable (killed, crashed, its node lost, restarting):
    whatever the call was doing is lost."""

    def __init__(self, worker_id: str, detail: str, permanent: bool = False, missing_module: str = "") -> None:
        self.worker_id = worker_id
        self.detail = detail
        self.permanent = permanent
        """Ray will not restart it (its restarts are spent, or it was killed for good)."""
        self.missing_module = missing_module
        """A module its constructor could not import (``No module named 'x'``), else ""."""
        super().__init__(f"worker {worker_id}: Ray actor {'gone' if permanent else 'died'}: {detail}")


class WorkerCallFailed(RuntimeError):
    """A call to a live actor failed (its method raised, or Ray could not move an argument)."""

    def __init__(self, worker_id: str, detail: str) -> None:
        self.worker_id = worker_id
        self.detail = detail
        super().__init__(f"worker {worker_id}: {detail}")


def _ray() -> ModuleType:
    try:
        import ray  # noqa: PLC0415 - the engine's only Ray import, and only for executor = "ray"
    except ImportError as exc:
        raise RayUnavailable("executor = 'ray' needs Ray: pip install 'warpdeck[ray]'") from exc
    return ray


def connect(address: str | None, timeout_s: float = 30.0, log_dir: Path | None = None, *,
            plane: ControlSettings | None = None) -> bool:
    """Join the Ray cluster at ``address`` within ``timeout_s``; without one, a Ray already
    initialised in this process, else a new local one (no dashboard). With ``log_dir`` Ray's lines
    go to its ``ray.log``. ``plane``: the engine's control plane; where its broker is on this
    machine's loopback, a cluster on other hosts is refused. ``RayUnavailable`` says why, in one line.
    True when this call joined (False: Ray was already initialised in this process)."""
    ray = _ray()
    plane_broker = reach.loopback_broker(plane)
    log = reach.RayLog(log_dir / reach.LOG_NAME) if log_dir is not None else None
    if log is not None:
        _route_logs(ray, log)
    joined = False
    if not ray.is_initialized():
        if address is not None and plane_broker is not None:
            _refuse(reach.plane_refusal(address, plane_broker, local_ips()), ray, joined)
        _join(ray, address, timeout_s, log)
        joined = True
    if log is not None:
        _route_worker_output(ray, log)
    if plane_broker is not None:
        _refuse(reach.plane_refusal(address, plane_broker, local_ips(), cluster_nodes()), ray, joined)
    return joined


def disconnect() -> None:
    """Leave the cluster this process joined (its own local Ray, if it started one, ends)."""
    _ray().shutdown()


def _refuse(why: str | None, ray: ModuleType, joined: bool) -> None:
    if why is not None:
        if joined:  # leave no half-used cluster connection behind
            ray.shutdown()
        raise RayUnavailable(why)


def _join(ray: ModuleType, address: str | None, timeout_s: float, log: reach.RayLog | None) -> None:
    """Probe the address, then ``ray.init`` on a thread waited for until the deadline (a new local
    Ray: ``ray.init`` here)."""
    deadline = time.monotonic() + timeout_s
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
    if log is not None:
        kwargs["log_to_driver"] = True  # the actors' lines, caught by _route_worker_output
    if address is None:
        # "local": always a new one; without an address Ray would join the last cluster `ray start`
        # recorded on this machine (/tmp/ray/ray_current_cluster), even one long stopped.
        kwargs.update(address="local", include_dashboard=False)
        what = "a new local Ray"
    else:
        kwargs["address"] = address
        try:
            found = None
            if address == "auto":
                found = ray._private.services.canonicalize_bootstrap_address_or_die(address)
            target = reach.parse_target(address, found)
            reach.probe(target, timeout_s)
        except (ConnectionError, ValueError) as exc:
            raise RayUnavailable(f"cannot join the Ray cluster at {address}: {_first_line(exc)}") from None
        except TimeoutError as exc:
            raise RayUnavailable(str(exc)) from None
        what = f"the {target.describe()}"
    outcome: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(**kwargs)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(exc)

    with _stderr_to(log):
        if address is None:
            # Started here, never on a thread: Ray's processes die with the thread that started
            # them (PR_SET_PDEATHSIG is per thread), and a local start needs no deadline of ours.
            init()
        else:
            # On a thread Ray leaves SIGTERM alone and says so: the engine handles its signals itself.
            logging.getLogger("ray._private.worker").addFilter(_not_main_thread)
            thread = threading.Thread(target=init, name="warpdeck-ray-init", daemon=True)
            thread.start()
            thread.join(max(0.0, deadline - time.monotonic()))
    if not outcome:
        raise RayUnavailable(f"cannot join the Ray cluster at {address or 'a new local instance'}: {what} accepted "
                             f"a connection but Ray did not finish joining within {timeout_s:g} s "
                             "([executor] connect_timeout_s)")
    failure = outcome[0]
    if failure is not None:
        raise RayUnavailable(f"cannot join the Ray cluster at {address or 'a new local instance'}: "
                             f"{_first_line(failure)}") from failure


def _not_main_thread(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("SIGTERM handler is not set")


@contextlib.contextmanager
def _stderr_to(log: reach.RayLog | None) -> Iterator[None]:
    """While Ray joins, the driver's C++ warnings (written straight to fd 2) go to the log."""
    if log is None:
        yield
        return
    try:
        log.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


class _ToRayLog(logging.Handler):
    """The ``ray`` loggers' records, into the run's ray.log."""

    def __init__(self, log: reach.RayLog) -> None:
        super().__init__(logging.WARNING)
        self.log = log
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.log.write(self.format(record))


def _route_logs(ray: ModuleType, log: reach.RayLog) -> None:
    """Ray's loggers write to ``log`` from now on (Ray's own handler wrote to stderr)."""
    logger = logging.getLogger("ray")
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.addHandler(_ToRayLog(log))
    logger.propagate = False


def _route_worker_output(ray: ModuleType, log: reach.RayLog) -> None:
    """The actors' stdout and stderr, and the cluster's error messages (``(raylet) A worker died…``),
    which Ray prints on the driver's terminal, go to ``log``."""
    dispatcher = ray._private.ray_logging.global_worker_stdstream_dispatcher
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.remove_handler("warpdeck_ray_log")
    dispatcher.add_handler("warpdeck_ray_log", functools.partial(_worker_lines, log))
    # Ray's error listener calls this module function by name for every error it hears.
    ray._private.worker.print_to_stdstream = lambda data, ignore_prefix=False: _worker_lines(log, data)


def _worker_lines(log: reach.RayLog, data: dict[str, Any]) -> None:
    pid = data.get("pid")
    who = data.get("actor_name") or data.get("task_name") or ("worker" if isinstance(pid, int) else "")
    parts = [f"{who} pid={pid}" if who else str(pid)]  # "(raylet)", "(LaneWorker pid=123, ip=…)"
    if data.get("ip"):
        parts.append(f"ip={data['ip']}")
    if data.get("is_err"):
        parts.append("stderr")
    prefix = f"({', '.join(parts)}) "
    lines = [str(line) for line in data.get("lines", ())]
    if lines:
        log.write("".join(prefix + line + "\n" for line in lines))


def ray_running() -> bool:
    """Whether Ray is initialised in this process (``RayUnavailable`` without Ray installed)."""
    return bool(_ray().is_initialized())


def local_ips() -> set[str]:
    """This machine's addresses, as Ray and the resolver know them."""
    ips = {"127.0.0.1", "::1"}
    with contextlib.suppress(Exception):
        ips.add(str(_ray().util.get_node_ip_address()))
    with contextlib.suppress(OSError):
        ips.update(socket.gethostbyname_ex(socket.gethostname())[2])
    return ips


def cluster_nodes() -> list[reach.NodeInfo]:
    """Every node of the joined cluster (alive or not), with its resources."""
    nodes = []
    for n in _ray().nodes():
        res = {str(k): float(v) for k, v in (n.get("Resources") or {}).items()}
        cpus, gpus = res.pop("CPU", 0.0), res.pop("GPU", 0.0)
        nodes.append(reach.NodeInfo(ip=str(n.get("NodeManagerAddress", "")), alive=bool(n.get("Alive")), cpus=cpus,
                                    gpus=gpus, resources=res, node_id=str(n.get("NodeID", ""))))
    return nodes


def local_gpus() -> int:
    """GPUs a local Ray started on this machine would count (Ray's own detection; nothing starts)."""
    _ray()
    from ray._private.accelerators import get_accelerator_manager_for_resource  # noqa: PLC0415

    manager = get_accelerator_manager_for_resource("GPU")
    return int(manager.get_current_node_num_accelerators() or 0) if manager is not None else 0


def cluster_gpus() -> int:
    """GPUs the joined cluster has (fake ones included: ``ray.init(num_gpus=N)``)."""
    return int(_ray().cluster_resources().get("GPU", 0))


RAYLET_CHECK_MS = 100
"""How often an actor's process checks that its node's raylet is alive (the environment variable below, read by each
actor process; Ray's default is 1000 ms). A raylet that dies takes its actors with it, but each notices only at its next
check, and only then does its broker connection drop: with the default, a node removed mid-run had its batches requeued
0.82 s after the removal began, at 100 ms 0.31-0.35 s (three runs each of benchmarks/ray_dispatch.py's node loss). The
check is a signal-0 to one pid; a user's own value in ``runtime_env.env_vars`` wins."""
_RAYLET_CHECK_ENV = "RAY_raylet_death_check_interval_milliseconds"


def spawn(cls: type, count: int, args: Callable[[int], Sequence[Any]], *, gpus: float, max_restarts: int,
          cpus: float = 1.0, resources: dict[str, float] | None = None, spread: bool = True,
          runtime_env: dict[str, object] | None = None) -> list[Any]:
    """Start ``count`` actors of ``cls`` (actor k built with ``args(k)``), each reserving ``cpus``,
    ``gpus`` and ``resources``, spread over the nodes (or packed: Ray's default), with
    ``runtime_env``; returns their handles at once (each starts in the background; its first call
    waits for it)."""
    ray = _ray()
    remote = ray.remote(cls)
    options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": max_restarts, "max_task_retries": 0,
                               "max_concurrency": 1000}
    if resources:
        options["resources"] = dict(resources)
    if spread:
        options["scheduling_strategy"] = "SPREAD"
    env = dict(runtime_env or {})
    env_vars: dict[str, str] = dict(env.get("env_vars") or {})  # type: ignore[call-overload]
    env_vars.setdefault(_RAYLET_CHECK_ENV, str(RAYLET_CHECK_MS))
    options["runtime_env"] = _uploaded({**env, "env_vars": env_vars})
    return [remote.options(**options).remote(*args(k)) for k in range(count)]


def _uploaded(runtime_env: dict[str, object]) -> dict[str, object]:
    """``runtime_env`` with its local ``py_modules`` and ``working_dir`` uploaded to the cluster and
    replaced by their URIs, as ``ray.init`` does for a job's: Ray takes local paths only there, and
    an actor's ``runtime_env`` must name URIs. Through Ray Client (``ray://``) the paths go as they
    are (the client uploads them itself)."""
    env = dict(runtime_env)
    if "py_modules" not in env and "working_dir" not in env:
        return env
    from ray._private import worker as ray_worker  # noqa: PLC0415 - the upload ray.init does for a job
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed  # noqa: PLC0415
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed  # noqa: PLC0415

    node = getattr(ray_worker.global_worker, "node", None)
    if node is None:  # Ray Client: no local node
        return env
    scratch = node.get_runtime_env_dir_path()
    env = upload_py_modules_if_needed(env, include_gitignore=True, scratch_dir=scratch)
    env = upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch)
    env.pop("excludes", None)  # applied by the upload
    return env


def actor_waiting(handle: Any) -> str | None:
    """Why the actor is not running, from the GCS actor table: ``None`` while it is alive (or
    gone, or unknown); else its state in words, with the resources it needs that no live node has
    free (``restarting: waiting for 1 CPU``). A blocking call (a GCS round trip): run it off the
    event loop."""
    _ray()
    from ray._private import state  # noqa: PLC0415 - the GCS tables (the state API needs the dashboard)
    from ray.core.generated import gcs_pb2  # noqa: PLC0415

    gcs: Any = state  # untyped, private: read with care (every failure means "nothing to say")
    table: Any = gcs_pb2.ActorTableData  # type: ignore[attr-defined]  # generated without stubs

    try:
        raw = gcs.state._connect_and_get_accessor().get_actor_info(handle._actor_id)
    except Exception:  # noqa: BLE001 - the GCS is unreachable: nothing to say
        return None
    if raw is None:
        return None
    info = table.FromString(raw)
    name = table.ActorState.Name(info.state)
    if name in ("ALIVE", "DEAD"):
        return None
    what = "restarting" if name == "RESTARTING" else "starting"
    need = {k: float(v) for k, v in info.required_resources.items() if v > 0}
    try:
        free = list(gcs.available_resources_per_node().values())
    except Exception:  # noqa: BLE001
        return what
    if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in free):
        return what  # a node has room: Ray is placing it
    short = {k: v for k, v in need.items() if not any(node.get(k, 0.0) >= v for node in free)} or need
    return f"{what}: waiting for " + ", ".join(f"{v:g} {k}" for k, v in sorted(short.items()))


async def call(handle: Any, worker_id: str, method: str, *args: Any) -> Any:
    """``await handle.method.remote(*args)`` with Ray's errors mapped to ``WorkerDied`` or
    ``WorkerCallFailed``."""
    ray = _ray()
    try:
        return await getattr(handle, method).remote(*args)
    except ray.exceptions.RayActorError as exc:
        # ActorUnavailableError: died and restarting (or unreachable); ActorDiedError: gone for good.
        missing = _NO_MODULE.search(str(exc))
        raise WorkerDied(worker_id, _first_line(exc), isinstance(exc, ray.exceptions.ActorDiedError),
                         missing.group(1) if missing else "") from exc
    except ray.exceptions.RayError as exc:
        raise WorkerCallFailed(worker_id, _first_line(exc)) from exc


def kill(handle: Any) -> None:
    """End an actor for good (no restart)."""
    ray = _ray()
    with contextlib.suppress(ValueError):  # already gone
        ray.kill(handle, no_restart=True)


_NO_MODULE = re.compile(r"No module named '([^']+)'")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:500]
