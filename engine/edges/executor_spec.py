"""The spec's ``[executor]`` section: where batches run, and on Ray what each actor asks for.

The decision this module protects: everything a Ray cluster is asked for (how long to wait for it,
each actor's CPUs, GPUs and custom resources, its placement, its ``runtime_env``, and whether the
actors read and write their own data) is checked here, before any cluster is joined, and a wrong
value names its field. A field that applies to Ray only is refused on ``kind = "local"`` rather
than silently ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from warpdeck.engine.edges.spec_types import SpecModel

__all__ = ["DataMode", "ExecutorSpec", "RuntimeEnvSpec", "resource_amounts", "why_not_shared"]

DataMode = Literal["auto", "ship", "shared"]
"""``ship``: the engine loads inputs and writes outputs, arrays travel through Ray's object store; ``shared``: each
actor loads and writes on storage every node sees, the engine leases keys and commits; ``auto``: shared where the source
and sink allow it."""

SHARED_SOURCES = ("synthetic", "npy_dir", "images", "parquet")
"""Sources an actor can open for itself from the spec: files on a shared path, or seeded by index."""
SHARED_SINKS = ("npy_dir", "parquet", "null")
"""Sinks an actor can stage into for the engine to commit (rename)."""


def why_not_shared(source_kind: str, sink_kind: str) -> str:
    """Why actors cannot read and write their own data with these sections ("" when they can)."""
    if source_kind not in SHARED_SOURCES:
        return f"a {source_kind} source is read in the engine's process"
    if sink_kind not in SHARED_SINKS:
        return f"a {sink_kind} sink is written in the engine's process"
    return ""


_RESERVED = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker", "memory": "", "object_store_memory": ""}
"""Resource names Ray reserves for itself: asked for through their own fields."""


class RuntimeEnvSpec(SpecModel):
    """The keys of Ray's ``runtime_env`` that warpdeck passes to its actors (Ray's own names and
    meanings); any other key is refused, naming it."""

    working_dir: str | None = Field(default=None, min_length=1)
    """A local directory (or a remote URI) uploaded to every node and made the actors' working
    directory."""
    py_modules: list[str] | None = None
    """Local directories, ``.whl`` files or remote URIs put on the actors' ``sys.path``: stage
    modules that are not installed on the nodes."""
    excludes: list[str] | None = None
    """Paths or gitignore-style patterns left out of ``working_dir`` and ``py_modules``."""
    pip: list[str] | str | None = None
    """Packages (or a requirements file) installed into a virtualenv for the actors."""
    uv: list[str] | str | None = None
    """As ``pip``, installed with uv."""
    conda: str | None = None
    """An existing conda environment's name, or an environment.yml path."""
    env_vars: dict[str, str] | None = None
    """Environment variables set in the actors' processes."""
    image_uri: str | None = None
    """A container image the actors run in."""
    config: dict[str, float | bool] | None = None
    """Ray's runtime_env options (``setup_timeout_seconds``, ``eager_install``)."""

    def to_ray(self) -> dict[str, object]:
        """The dict Ray takes: only the keys that were given."""
        return self.model_dump(exclude_none=True)


class ExecutorSpec(SpecModel):
    """Where batches run: in this process, or on Ray actors (one long-lived actor per GPU, each a
    worker with its own lanes and its own heartbeat). ``executor = "ray"`` is short for
    ``[executor] kind = "ray"``."""

    kind: Literal["local", "ray"] = "local"
    """``local``: lanes in this process; ``ray``: lanes in Ray actors (``pip install 'warpdeck[ray]'``)."""
    address: str | None = Field(default=None, min_length=1, max_length=512)
    """The Ray cluster to join (``auto``, ``host:6379`` or ``ray://host:10001``); absent: a Ray
    already started in this process, else a local one started for the run."""
    connect_timeout_s: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    """How long joining the cluster may take before the run ends (exit 2) with nothing started."""
    workers: int | None = Field(default=None, ge=1, le=4096)
    """Actors to start; absent: one per GPU the cluster has (at least one)."""
    gpus_per_worker: float = Field(default=1.0, ge=0, le=64)
    """GPUs each actor reserves (Ray's ``num_gpus``); 0 runs actors on CPUs only."""
    cpus_per_worker: float = Field(default=1.0, ge=0, le=1024)
    """CPUs each actor reserves for its life (Ray's ``num_cpus``)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each actor reserves (``{ "nvme" = 1 }``), as the nodes advertise them."""
    placement: Literal["spread", "pack"] = "spread"
    """``spread``: actors on as many nodes as possible (Ray's SPREAD); ``pack``: on as few as
    possible (Ray's default, which fills a node before the next)."""
    runtime_env: RuntimeEnvSpec | None = None
    """What Ray sets up for the actors on every node (stage modules, packages, variables)."""
    data: DataMode = "auto"
    """Who loads inputs and writes outputs: the engine (``ship``) or each actor (``shared``)."""
    max_restarts: int = Field(default=-1, ge=-1)
    """How often Ray may restart a killed actor (-1: always). The engine requeues the batches it
    held either way; Ray never retries a batch itself."""

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in _RESERVED:
                own = _RESERVED[name]
                raise ValueError(f"{name!r} is Ray's own resource" + (f": set {own}" if own else ""))
            if not name or amount < 0:
                raise ValueError(f"resource {name!r}: a name and an amount of at least 0")
        return v

    @model_validator(mode="after")
    def _ray_only(self) -> ExecutorSpec:
        if self.kind == "local":
            # Only what differs from the default: a spec dumped and read back (model_dump) names every field.
            given = sorted(n for n in self.model_fields_set - {"kind"}
                           if getattr(self, n) != type(self).model_fields[n].get_default(call_default_factory=True))
            if given:
                raise ValueError(f"{', '.join(given)}: for kind = 'ray' only")
        return self


def resource_amounts(ask: dict[str, float]) -> str:
    """Resources in words, as ``check`` and its problems write them: ``1 CPU, 1 GPU`` (``nothing``)."""
    return ", ".join(f"{v:g} {k}" for k, v in ask.items()) or "nothing"
