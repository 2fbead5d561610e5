"""The pipeline spec: one pydantic tree, read from TOML, checked completely before any work starts.

The decision this module protects: a bad spec fails before the first task, with the file, the
field's path and what was expected, and so does a ``module:function`` that cannot be imported.
Nothing downstream re-validates; the engine trusts a ``PipelineSpec`` it is handed.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    model_validator,
)

from warpdeck.engine.edges.config_tables import ParquetSink, ParquetSource
from warpdeck.engine.edges.executor_spec import ExecutorSpec, RuntimeEnvSpec, why_not_shared
from warpdeck.engine.edges.spec_types import DTYPES, Dtype, Shape, SpecModel, Target
from warpdeck.engine.edges.step_spec import StageSpec, StepSpec, graph_issues
from warpdeck.engine.state.slot_depth import DEPTH_MAX, DEPTH_MIN

__all__ = [
    "PROCESS_SINKS",
    "PROCESS_SOURCES",
    "CallableSink",
    "CallableSource",
    "Dtype",
    "ExecutorSpec",
    "FaultsSpec",
    "FeederSpec",
    "HostSpec",
    "ImageSource",
    "ItemsSource",
    "NpyDirSink",
    "NpyDirSource",
    "NullSink",
    "ParquetSink",
    "ParquetSource",
    "PipelineSpec",
    "RetrySpec",
    "RuntimeEnvSpec",
    "SpecError",
    "SpecIssue",
    "SyntheticSource",
    "load_spec",
    "parse_spec",
    "resolve_target",
]

_DTYPES = DTYPES
PROCESS_SOURCES = ("items", "images", "npy_dir")
"""Sources whose loads can run in a fill worker process (``host.fill_pool``)."""
PROCESS_SINKS = ("npy_dir", "callable", "null")
"""Sinks whose writes can run in a sink worker process (``host.sink_pool``)."""


class _Model(SpecModel):
    """A section defined here (``SpecModel``'s rules)."""


class SyntheticSource(_Model):
    """Seeded random inputs: reproducible, no files needed."""

    kind: Literal["synthetic"]
    count: int = Field(ge=1, le=1_000_000_000)
    """How many tasks to generate."""
    shape: Shape
    """Shape of one task's input."""
    dtype: Dtype = "float32"
    """Element type of the inputs."""
    seed: int = 0
    """Task i's input is drawn from a generator seeded with (seed, i)."""


class NpyDirSource(_Model):
    """A directory of ``.npy`` files, one task per file, keyed by the file's stem."""

    kind: Literal["npy_dir"]
    path: Path
    """Directory to read; relative paths resolve against the spec file's directory."""
    glob: str = "*.npy"
    """Which files in it are inputs."""
    shape: Shape | None = None
    """Expected shape of every input; when absent each file's own shape is used (files of one shape batch together)."""
    dtype: Dtype | None = None
    """Expected dtype of every input; when absent each file's own dtype is used (one a spec could name)."""


class ImageSource(_Model):
    """A directory of PNG, JPEG and WebP images, one task per file, decoded with Pillow on the fill
    threads into one fixed mode, size, dtype and layout (``pip install 'warpdeck[images]'``)."""

    kind: Literal["images"]
    path: Path
    """Directory to read; relative paths resolve against the spec file's directory."""
    glob: str = "*"
    """Which files in it are inputs (``**/*`` reaches subdirectories); of those, only names
    ending .png, .jpg, .jpeg or .webp (any case) are tasks."""
    size: tuple[Annotated[int, Field(ge=1, le=65_536)], Annotated[int, Field(ge=1, le=65_536)]]
    """``[H, W]`` of every task's image."""
    mode: Literal["RGB", "L", "RGBA"] = "RGB"
    """Pillow mode every image is converted to (3, 1 or 4 channels)."""
    dtype: Literal["uint8", "float32"] = "uint8"
    """``uint8`` keeps 0..255; ``float32`` scales to [0, 1]."""
    layout: Literal["HWC", "CHW"] = "HWC"
    """Axis order of a task's array; the channel axis is kept for ``L`` too."""
    resize: Literal["fit", "crop", "pad"] = "fit"
    """``fit`` stretches to H x W; ``crop`` scales to cover, then crops the centre; ``pad`` scales to
    fit inside, then pads around the centred image with ``pad_value``."""
    pad_value: int = Field(default=0, ge=0, le=255)
    """Value of every channel (alpha too) in the padding, on the 0..255 scale (``/ 255`` as float32)."""
    max_pixels: int = Field(default=89_478_485, ge=1)
    """An image whose header declares more pixels fails, before it is decoded (Pillow's own default
    ``Image.MAX_IMAGE_PIXELS``; a decompression-bomb guard)."""


class CallableSource(_Model):
    """Python code that yields the inputs: ``target()`` returns an iterable of arrays or
    ``(key, array)`` pairs."""

    kind: Literal["callable"]
    target: Target
    """``module:function`` returning the iterable."""


class ItemsSource(_Model):
    """Your own per-item loading, the part of a ``Dataset.__getitem__`` you write yourself:
    ``items()`` lists the items cheaply, ``load(handle, row)`` writes one item into its row of the
    slot in place, or ``load_batch(handles, out)`` a whole batch into its rows where one call is
    cheaper (vectorised decoding, one read or one request per batch). With ``host.fill_pool =
    "processes"`` the loads run in worker processes, so pure-Python work (decoding, tokenising) uses
    every core."""

    kind: Literal["items"]
    items: Target
    """``module:function`` returning an iterable of ``(key, handle)`` pairs (or of handles alone:
    keys ``item-00000000`` on). A handle is what ``load`` needs to find the item: a path, a row id,
    an offset; small, and picklable when loads run in processes."""
    load: Target | None = None
    """``module:function`` called as ``load(handle, row)``: write the item's input into ``row`` (a
    writable array of ``shape`` and ``dtype``) in place; what it raises fails that item alone, with
    its traceback (an ``InputError`` is not retried). Absent: ``load_batch`` loads every item."""
    load_batch: Target | None = None
    """``module:function`` called as ``load_batch(handles, out)``: write item j's input into
    ``out[j]`` (``out``: n rows of ``shape``, of ``dtype``) in place; return None when every item
    loaded, or n entries, each None or the exception that item failed with. What it raises sends the
    batch to ``load`` item by item, so a bad item fails alone; without ``load`` every item of the
    batch fails with it."""
    shape: Shape
    """Shape of one item's input."""
    dtype: Dtype = "float32"
    """Element type of the inputs."""
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Keyword arguments for ``items`` (a file to list, a limit): ``items(**options)``."""

    @model_validator(mode="after")
    def _loads_somehow(self) -> ItemsSource:
        if self.load is None and self.load_batch is None:
            raise ValueError("an items source needs load (one item at a time) or load_batch (a batch at a time), "
                             "or both")
        return self


class NpyDirSink(_Model):
    """Write each output to ``<path>/<key>.npy`` through a temp file and an atomic rename."""

    kind: Literal["npy_dir"]
    path: Path = Path("outputs")
    """Output directory; a relative path resolves inside the run directory."""


class CallableSink(_Model):
    """Hand each output to ``target(key, array)``, or each batch's outputs to ``write_batch(keys,
    outputs)`` where one call is cheaper (one syscall, one request per batch); the arrays are only
    valid during the call."""

    kind: Literal["callable"]
    target: Target | None = None
    """``module:function`` to call once per task as ``target(key, array)``. Absent: ``write_batch``
    writes every output (a lone one as a batch of one)."""
    write_batch: Target | None = None
    """``module:function`` to call once per batch as ``write_batch(keys, outputs)`` (``outputs[j]`` is
    ``keys[j]``'s): every output durable when it returns, or none: what it raises fails every task of
    the batch (tried again as ``[retry]`` says)."""

    @model_validator(mode="after")
    def _writes_somehow(self) -> CallableSink:
        if self.target is None and self.write_batch is None:
            raise ValueError("a callable sink needs target (one output at a time) or write_batch (a batch at a "
                             "time), or both")
        return self


class NullSink(_Model):
    """Discard outputs (benchmarks, dry runs)."""

    kind: Literal["null"]


class RetrySpec(_Model):
    """What happens when a task's attempt fails."""

    max_attempts: int = Field(default=3, ge=1, le=100)
    """Attempts per task before it is failed for good (1 = no retry)."""
    isolate: bool = True
    """Retry the tasks of a failed batch one by one, so one bad input fails alone."""


class FeederSpec(_Model):
    """How the ready queue is kept full."""

    low_watermark: int | None = Field(default=None, ge=1)
    """Refill the ready queue when it falls to this many tasks (default: 2 batches)."""
    high_watermark: int | None = Field(default=None, ge=2)
    """Stop pulling from the source at this many ready tasks (default: 8 batches)."""
    auto_depth: bool = True
    """Deepen lanes' slot rings while their bottleneck waits for input (tf.data AUTOTUNE style)."""
    max_depth: int = Field(default=16, ge=DEPTH_MIN, le=DEPTH_MAX)
    """Deepest slot ring the auto-tuner may reach."""
    memory_budget_mb: float = Field(default=1024.0, gt=0)
    """Host and device memory all slot buffers together may use."""

    @model_validator(mode="after")
    def _ordered(self) -> FeederSpec:
        if self.low_watermark and self.high_watermark and self.low_watermark >= self.high_watermark:
            raise ValueError("low_watermark must be below high_watermark")
        return self


class HostSpec(_Model):
    """The host phases, fill (loading inputs) and sink (writing outputs): how many threads each
    lane gives them. Absent counts are tuned while the run goes (``engine/run/autotune.py``):
    raised while the device waits for that phase, within ``max_workers`` and the CPU budget."""

    fill_workers: int | None = Field(default=None, ge=1, le=64)
    """Threads loading inputs, per lane; absent: tuned, starting at one per core of the CPU budget
    (shared by the lanes, within ``max_workers``, a slot each that ``feeder.memory_budget_mb``
    holds, and a ``slot_depth`` set with ``auto_depth`` off)."""
    sink_workers: int | None = Field(default=None, ge=1, le=64)
    """Threads writing outputs, per lane; absent: tuned, starting at 1."""
    max_workers: int = Field(default=8, ge=1, le=64)
    """Most threads the tuner gives one host phase of one lane."""
    cpu_cores: float | None = Field(default=None, gt=0, le=4096, allow_inf_nan=False)
    """Cores the run may keep busy (the CPU budget the tuner and the bound count); absent: the
    cores this process may run on."""
    fill_pool: Literal["auto", "threads", "processes"] = "auto"
    """Where inputs are loaded: ``threads`` of the engine's process (I/O, and decoders that release
    the GIL), or ``processes``: one warm worker process per fill thread, each writing its batch
    straight into the slot's shared memory (work that holds the GIL: Python decoding, tokenising,
    your own ``load``). ``auto``: threads, and where more threads stop speeding the fill up or share
    a GIL, the tuner tries processes once and keeps them if the fill is faster. Processes need a source that
    can load in another process (``items``, ``images``, ``npy_dir``); for any other, and on Ray
    actors, ``auto`` means threads."""
    sink_pool: Literal["threads", "processes"] = "threads"
    """Where outputs are written: ``threads`` of the engine's process, or ``processes``: one warm
    worker process per sink thread, each opening the sink once and writing its batch straight from
    the slot's shared memory (writes that hold the GIL: encoding in Python, your own ``target`` or
    ``write_batch``). Needs an ``npy_dir``, ``callable`` or ``null`` sink (Parquet numbers its part
    files in the engine's process) and local lanes. Never chosen by the tuner: what a ``target`` keeps
    in its own module (a list, a connection) would live in the workers."""
    process_deadline_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    """A fill or sink worker process busy on one batch longer than this is killed and replaced; the
    batch's tasks are tried again."""

    @model_validator(mode="after")
    def _pins_in_range(self) -> HostSpec:
        for name in ("fill_workers", "sink_workers"):
            pinned = getattr(self, name)
            if pinned is not None and pinned > self.max_workers:
                raise ValueError(f"{name} ({pinned}) is above max_workers ({self.max_workers})")
        return self


class FaultsSpec(_Model):
    """What the engine does when the machine, not a task, fails (docs/reliability.md)."""

    outage_timeout_s: float = Field(default=600.0, ge=0, allow_inf_nan=False)
    """How long an outage (the outputs' or the journal's disk full, read-only or failing) may last
    before the run stops with nothing marked failed; 0 stops at once."""


def _executor_shorthand(v: Any) -> Any:
    return {"kind": v} if isinstance(v, str) else v


class PipelineSpec(_Model):
    """A whole pipeline: where tasks come from, what runs on them, where results go."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    """Pipeline name: used in topics, the run directory and the report."""
    source: Annotated[SyntheticSource | NpyDirSource | ImageSource | ParquetSource | CallableSource | ItemsSource,
                      Field(discriminator="kind")]
    """Where tasks come from."""
    sink: Annotated[NpyDirSink | ParquetSink | CallableSink | NullSink,
                    Field(discriminator="kind")] = NpyDirSink(kind="npy_dir")
    """Where outputs go."""
    stages: list[StageSpec] = Field(default_factory=list)
    """Stage functions, run in order inside the compute phase (a spec without ``steps``)."""
    steps: list[StepSpec] = Field(default_factory=list)
    """A pipeline of several steps (maps, reduces, gates), each with its own stages, in place of
    ``stages`` (``engine/edges/step_spec.py``, docs/spec.md)."""
    batch_size: int = Field(default=64, ge=1, le=1 << 20)
    """Tasks per batch."""
    slot_depth: int = Field(default=2, ge=DEPTH_MIN, le=DEPTH_MAX)
    """Slots per lane ring (k); 2 is double buffering."""
    lanes: int = Field(default=1, ge=1, le=64)
    """Independent lanes per device."""
    backend: Literal["auto", "numpy", "cupy"] = "auto"
    """Array backend; auto picks cupy when a device answers and says why when it does not."""
    retry: RetrySpec = RetrySpec()
    """Retry policy."""
    feeder: FeederSpec = FeederSpec()
    """Ready-queue watermarks and automatic slot depth."""
    host: HostSpec = HostSpec()
    """Threads for loading and writing (fill and sink), per lane: pinned or tuned."""
    batch_timeout_s: float = Field(default=0.05, ge=0)
    """A partial batch is sent after waiting this long for more tasks of its key."""
    executor: Annotated[ExecutorSpec, BeforeValidator(_executor_shorthand)] = ExecutorSpec()
    """Where batches run (``local`` or ``ray``); a string is taken as the kind."""
    faults: FaultsSpec = FaultsSpec()
    """How outages are ridden out."""
    nonfinite: Literal["flag", "fail", "allow"] = "flag"
    """What a NaN or infinity in a task's final output does: ``flag`` writes it and finishes the
    task marked as suspect (task detail and report say how many values); ``fail`` fails the task
    without writing anything (not retried: the same input gives the same values); ``allow``
    does not look (integer outputs are never checked)."""

    @model_validator(mode="after")
    def _stages_or_steps(self) -> PipelineSpec:
        if self.steps and self.stages:
            raise ValueError("stages: with [[steps]], each step names its own stages")
        if not self.steps and not self.stages:
            raise ValueError("stages: a spec needs [[stages]] (or [[steps]])")
        if self.steps:
            if issues := graph_issues(self.steps):
                raise ValueError("\n".join(f"{i.loc}: {i.message}" for i in issues))
            if self.executor.kind != "local":
                raise ValueError("executor: a spec with steps runs on local lanes for now")
        return self

    @model_validator(mode="after")
    def _depth_in_range(self) -> PipelineSpec:
        if self.feeder.auto_depth and self.feeder.max_depth < self.slot_depth:
            raise ValueError("feeder.max_depth must be at least slot_depth")
        return self

    @model_validator(mode="after")
    def _processes_possible(self) -> PipelineSpec:
        if self.host.fill_pool == "processes":
            if self.source.kind not in PROCESS_SOURCES:
                raise ValueError(f"host.fill_pool = 'processes': a {self.source.kind} source loads in the engine's "
                                 f"process; use an items source (your own load function), images or npy_dir")
            if self.executor.kind != "local":
                raise ValueError("host.fill_pool = 'processes' is for local lanes; Ray actors load in their own "
                                 "processes already")
        if self.host.sink_pool == "processes":
            if self.sink.kind not in PROCESS_SINKS:
                raise ValueError(f"host.sink_pool = 'processes': a {self.sink.kind} sink writes from the engine's "
                                 "process (it numbers its part files there); use threads, or an npy_dir or callable "
                                 "sink")
            if self.executor.kind != "local":
                raise ValueError("host.sink_pool = 'processes' is for local lanes; Ray actors write in their own "
                                 "processes already")
        return self

    @model_validator(mode="after")
    def _shared_data_possible(self) -> PipelineSpec:
        why = why_not_shared(self.source.kind, self.sink.kind)
        if self.executor.data == "shared" and why:
            raise ValueError(f"executor.data = 'shared': {why}; use 'auto' (ships it) or 'ship'")
        return self


@dataclass(frozen=True)
class SpecIssue:
    """One thing wrong with a spec: where (dotted path) and what was expected."""

    loc: str
    message: str
    got: str = ""

    def __str__(self) -> str:
        got = f" (got {self.got})" if self.got else ""
        return f"{self.loc}: {self.message}{got}"


class SpecError(ValueError):
    """A spec that cannot run; ``issues`` lists every problem found, each with its field path."""

    def __init__(self, file: str, issues: list[SpecIssue]) -> None:
        self.file = file
        self.issues = issues
        lines = "\n".join(f"  {i}" for i in issues)
        super().__init__(f"{file}: invalid pipeline spec\n{lines}")


def _issues(err: ValidationError) -> list[SpecIssue]:
    out = []
    for e in err.errors(include_url=False):
        parts = e["loc"]
        # pydantic puts the discriminator's value after "source"/"sink" in union errors.
        loc = ".".join(str(p) for i, p in enumerate(parts)
                       if not (i > 0 and parts[i - 1] in ("source", "sink") and p in _UNION_TAGS))
        got = e.get("input")
        shown = "" if isinstance(got, dict) else repr(got)[:60]
        if e["type"] == "value_error":
            out += _placed(loc, str(e["ctx"]["error"]), shown)
            continue
        out.append(SpecIssue(loc or "(top level)", e["msg"], shown))
    return out


_PLACED = re.compile(r"^([a-z_][\w.]*): (.+)$")


def _placed(loc: str, message: str, shown: str) -> list[SpecIssue]:
    """A check's message as issues: a line that starts with a field (``steps.2.after.0: ...``,
    ``combine: ...``) is about that field, under ``loc``; any other line is about ``loc`` itself."""
    issues = []
    for line in message.splitlines():
        if m := _PLACED.match(line):
            issues.append(SpecIssue(f"{loc}.{m[1]}" if loc else m[1], m[2]))
        else:
            issues.append(SpecIssue(loc or "(top level)", line, shown))
    return issues


# pydantic puts the discriminator's value into the location of union errors; it adds nothing.
_UNION_TAGS = {"synthetic", "npy_dir", "images", "parquet", "callable", "items", "null"}


def resolve_target(target: str, search: Path | None = None) -> Callable[..., Any]:
    """Import ``module:function`` and return it; ``search`` is tried first for local modules."""
    module_name, _, attr = target.partition(":")
    if search is not None and str(search) not in sys.path:
        sys.path.insert(0, str(search))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise LookupError(f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise LookupError(f"module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise LookupError(f"{target} is not callable")
    return fn  # type: ignore[no-any-return]


def _has_torch() -> bool:
    try:
        importlib.import_module("torch")  # by name: torch is optional (warpdeck[torch])
    except ImportError:
        return False
    return True


def _check_targets(spec: PipelineSpec, base: Path | None, file: str) -> None:
    stage_lists = [("stages", spec.stages)] + [(f"steps.{j}.stages", st.stages) for j, st in enumerate(spec.steps)]
    places: list[tuple[str, str]] = [(f"{at}.{i}.fn", s.fn) for at, stages in stage_lists for i, s in enumerate(stages)]
    places += [(f"{at}.{i}.factory", s.factory) for at, stages in stage_lists for i, s in enumerate(stages)
               if s.factory is not None]
    places += [(f"steps.{j}.reduce.{name}", target) for j, st in enumerate(spec.steps) if st.reduce is not None
               for name, target in (("combine", st.reduce.combine), ("merge", st.reduce.merge),
                                    ("finish", st.reduce.finish)) if target is not None]
    if isinstance(spec.source, CallableSource):
        places.append(("source.target", spec.source.target))
    if isinstance(spec.source, ItemsSource):
        places += [(f"source.{name}", target) for name, target in (
            ("items", spec.source.items), ("load", spec.source.load), ("load_batch", spec.source.load_batch))
            if target is not None]
    if isinstance(spec.sink, CallableSink):
        places += [(f"sink.{name}", target) for name, target in (
            ("target", spec.sink.target), ("write_batch", spec.sink.write_batch)) if target is not None]
    issues = [SpecIssue(f"{at}.{i}.framework", "needs PyTorch: pip install 'warpdeck[torch]'")
              for at, stages in stage_lists for i, s in enumerate(stages)
              if s.framework == "torch" and not _has_torch()]
    for loc, target in places:
        try:
            resolve_target(target, base)
        except LookupError as exc:
            issues.append(SpecIssue(loc, str(exc), repr(target)))
    if issues:
        raise SpecError(file, issues)


def parse_spec(data: dict[str, Any], file: str = "<spec>", base: Path | None = None) -> PipelineSpec:
    """Validate a spec mapping, resolve relative source paths against ``base`` and check that
    every ``module:function`` imports. Raises ``SpecError`` listing every problem."""
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(file, _issues(err)) from None
    if isinstance(spec.source, ImageSource) and importlib.util.find_spec("PIL") is None:
        raise SpecError(file, [SpecIssue("source.kind", "needs Pillow: pip install 'warpdeck[images]'", "'images'")])
    for part, kind in (("source", spec.source.kind), ("sink", spec.sink.kind)):
        if kind == "parquet" and importlib.util.find_spec("pyarrow") is None:
            raise SpecError(file, [SpecIssue(f"{part}.kind", "needs pyarrow: pip install 'warpdeck[parquet]'",
                                             "'parquet'")])
    if (base is not None and isinstance(spec.source, NpyDirSource | ImageSource | ParquetSource)
            and not spec.source.path.is_absolute()):
        spec = spec.model_copy(update={"source": spec.source.model_copy(update={"path": base / spec.source.path})})
    _check_targets(spec, base, file)
    return spec


def load_spec(path: str | Path) -> PipelineSpec:
    """Read and validate a TOML spec file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(str(p), [SpecIssue("(file)", f"cannot read: {exc.strerror or exc}")]) from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise SpecError(str(p), [SpecIssue("(file)", f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line "
                                                     f"{line}); a spec is TOML, which is UTF-8")]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(str(p), [SpecIssue("(toml)", str(exc))]) from None
    return parse_spec(data, str(p), p.resolve().parent)


DTYPE_NAMES: tuple[str, ...] = _DTYPES
