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
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from warpdeck.engine.backends.base import BackendError

__all__ = ["RayUnavailable", "WorkerCallFailed", "WorkerDied", "call", "cluster_gpus", "connect", "kill", "spawn"]


class RayUnavailable(BackendError):
    """Ray is not installed, the cluster cannot be joined, or it cannot hold the actors."""

    def __init__(self, reason: str) -> None:
        super().__init__("ray", reason)


class WorkerDied(RuntimeError):
    """Ray reports the actor dead or unreachable (killed, crashed, its node lost, restarting):
    whatever the call was doing is lost."""

    def __init__(self, worker_id: str, detail: str, permanent: bool = False) -> None:
        self.worker_id = worker_id
        self.detail = detail
        #: Ray will not restart it (its restarts are spent, or it was killed for good).
        self.permanent = permanent
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


def connect(address: str | None) -> None:
    """Join the Ray cluster at ``address``; without one, a Ray already initialised in this
    process, else a new local one (no dashboard)."""
    ray = _ray()
    if ray.is_initialized():
        return
    try:
        if address is None:
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayUnavailable(f"cannot join the Ray cluster at {address or 'a new local instance'}: {exc}") from exc


def cluster_gpus() -> int:
    """GPUs the joined cluster has (fake ones included: ``ray.init(num_gpus=N)``)."""
    return int(_ray().cluster_resources().get("GPU", 0))


def spawn(cls: type, count: int, args: Callable[[int], Sequence[Any]], *, gpus: float, max_restarts: int) -> list[Any]:
    """Start ``count`` actors of ``cls`` (actor k built with ``args(k)``); returns their handles
    at once (each starts in the background; its first call waits for it)."""
    ray = _ray()
    remote = ray.remote(cls)
    return [
        remote.options(num_gpus=gpus, max_restarts=max_restarts, max_task_retries=0, max_concurrency=1000).remote(
            *args(k)
        )
        for k in range(count)
    ]


async def call(handle: Any, worker_id: str, method: str, *args: Any) -> Any:
    """``await handle.method.remote(*args)`` with Ray's errors mapped to ``WorkerDied`` or
    ``WorkerCallFailed``."""
    ray = _ray()
    try:
        return await getattr(handle, method).remote(*args)
    except ray.exceptions.RayActorError as exc:
        # ActorUnavailableError: died and restarting (or unreachable); ActorDiedError: gone for good.
        raise WorkerDied(worker_id, _first_line(exc), isinstance(exc, ray.exceptions.ActorDiedError)) from exc
    except ray.exceptions.RayError as exc:
        raise WorkerCallFailed(worker_id, _first_line(exc)) from exc


def kill(handle: Any) -> None:
    """End an actor for good (no restart)."""
    ray = _ray()
    with contextlib.suppress(ValueError):  # already gone
        ray.kill(handle, no_restart=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:500]
