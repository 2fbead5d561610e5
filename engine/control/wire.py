"""Every payload on the control plane: one ``kind``-tagged union of pydantic models, with a schema
version, validated once at the socket.

The decision this module protects: nothing from the broker reaches the engine or the monitor
unvalidated. ``decode`` turns bytes into a model or raises ``WireError`` with a short reason
(``oversized``, ``malformed``, ``invalid``, ``unknown_kind``, ``wrong_kind``, ``version``);
``DropCounter`` (``drops.py``) counts them per reason so that the snapshot shows them and nothing
raises into the engine. Timestamps on the wire are Unix seconds (``time.time()``); nothing compares them across
machines except the command signature's expiry, which allows for clock skew.

Every number on the wire is finite: the models refuse NaN and infinities (``invalid``), in their own
fields and in every dataclass they carry, so no comparison downstream meets a NaN (``NaN > 30`` is
false: a NaN timestamp or interval would pass every check written as "refuse if too large"). The one
exception is the Amdahl ceiling in telemetry's figures, which is +inf until a serial part is measured.

Telemetry, large and frequent, must cross a 1 Mbit/s link (DESIGN.md section 9): it goes zlib-compressed
(``encode_telemetry``); ``decode`` knows it by zlib's first byte (never ``{``) and inflates at most
``MAX_BYTES["telemetry"]``, so a bomb costs no more than a plain payload (plain JSON is read too). Each
kind has its schema version (``VERSIONS``: telemetry 2, the rest 1); another is refused as ``version``.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic_core import PydanticCustomError, from_json

from warpdeck.engine.control.compact import MAX_COLUMN_KEYS, ColumnItem, PackedRecord, run_length
from warpdeck.engine.state.metrics import Figures
from warpdeck.engine.state.part_views import OutageView
from warpdeck.engine.state.snapshot import (
    ControlView,
    Counts,
    EngineStatus,
    FeederView,
    LaneView,
    StalledTask,
    TaskFailure,
    WorkerView,
)

__all__ = [
    "MAX_BYTES",
    "PAYLOAD_ADAPTER",
    "SCHEMA_VERSION",
    "TELEMETRY_VERSION",
    "VERSIONS",
    "Birth",
    "Death",
    "DeviceStats",
    "EngineState",
    "Event",
    "Heartbeat",
    "Payload",
    "SignedCommand",
    "Telemetry",
    "WireError",
    "decode",
    "encode",
    "encode_telemetry",
    "plain",
]

SCHEMA_VERSION: Final = 1
TELEMETRY_VERSION: Final = 2  # since its frames were made to fit a slow link (docs/control-plane.md)
MAX_BYTES: Final[dict[str, int]] = {
    "birth": 8 * 1024,
    "hb": 64 * 1024,
    "death": 8 * 1024,
    "engine_state": 8 * 1024,
    "event": 16 * 1024,
    "cmd": 16 * 1024,
    "telemetry": 4 * 1024 * 1024,
}
"""Largest payload accepted per kind; anything bigger is dropped before it is parsed."""
VERSIONS: Final[dict[str, int]] = {**dict.fromkeys(MAX_BYTES, SCHEMA_VERSION), "telemetry": TELEMETRY_VERSION}
"""The schema version this build speaks, per kind."""
_LARGEST = max(MAX_BYTES.values())
_Id = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")]
_Text = Annotated[str, Field(max_length=4096)]
_Sig = Annotated[str, Field(max_length=64, pattern=r"^([0-9a-f]{64})?$")]


_WIRE_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False,
                          # The Amdahl ceiling (_Figures) may be +inf: JSON's Infinity, as Python writes it.
                          ser_json_inf_nan="constants")
"""Model settings of every payload. ``allow_inf_nan=False`` reaches every float field, including those of the
dataclasses a model carries (figures, lanes, workers): a field added later is covered too."""


class _Wire(BaseModel):
    model_config = _WIRE_CONFIG

    v: Literal[1] = SCHEMA_VERSION


class DeviceStats(BaseModel):
    """One device's load, sampled by the worker (NVML) at most twice a second."""

    model_config = _WIRE_CONFIG

    util_pct: float = Field(ge=0, le=100)
    mem_used_mb: float = Field(ge=0)
    mem_total_mb: float = Field(ge=0)
    temp_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)
    """Board power draw; None where the device cannot report it."""


class Birth(_Wire):
    """A worker (re)connected. Retained, so a monitor that starts later still learns of it. The
    epoch is new on every connection and grows: it fences the worker's older selves."""

    kind: Literal["birth"] = "birth"
    worker: _Id
    epoch: int = Field(ge=0)
    host: _Text = ""
    pid: int = Field(ge=0, default=0)
    device: _Text = ""
    lanes: int = Field(ge=0, default=0)
    version: _Text = ""
    interval_s: float = Field(gt=0, le=60, default=0.5)
    """The heartbeat interval the worker promises."""
    sig: _Sig = ""
    """HMAC-SHA256 of the rest, when the worker has a secret (engine/control/worker_auth.py)."""


class Heartbeat(_Wire):
    """Sent every ``interval_s`` from a path the worker's computation cannot block."""

    kind: Literal["hb"] = "hb"
    worker: _Id
    epoch: int = Field(ge=0)
    seq: int = Field(ge=0, le=255)
    """Wraps at 256: the monitor counts gaps."""
    progress: int = Field(ge=0)
    """Batches the worker has finished; frozen progress with work leased means a stuck worker."""
    lanes_busy: int = Field(ge=0, default=0)
    leased: tuple[int, ...] = Field(default=(), max_length=4096)
    """Ids of the batches the worker holds."""
    device: DeviceStats | None = None
    t: float = 0.0
    """The sender's clock (Unix seconds): a signed heartbeat older than the last one is a replay."""
    sig: _Sig = ""


class Death(_Wire):
    """A worker's end: its Last Will (``graceful`` false) or its own goodbye."""

    kind: Literal["death"] = "death"
    worker: _Id
    epoch: int = Field(ge=0)
    graceful: bool = False
    reason: _Text = ""
    sig: _Sig = ""


class EngineState(_Wire):
    """The engine's liveness, retained; its Last Will says ``offline``."""

    kind: Literal["engine_state"] = "engine_state"
    state: Literal["online", "offline"]
    pipeline: _Id
    host: _Text = ""
    pid: int = Field(ge=0, default=0)
    started: float = 0.0


class Event(_Wire):
    """Something an operator wants to hear about at once."""

    kind: Literal["event"] = "event"
    what: Literal[
        "task_failed",
        "worker_lost",
        "worker_hung",
        "worker_recovered",
        "worker_waiting",
        "worker_gone",
        "stall_began",
        "stall_ended",
        "command_applied",
        "command_refused",
        "message_dropped",
    ]
    subject: _Text = ""
    reason: _Text = ""
    t: float = 0.0
    ref: Annotated[str, Field(max_length=64)] = ""
    """For command outcomes: the command's nonce, so its sender can match the answer."""
    affected: int = 0
    """For command outcomes: how many tasks the command touched."""
    changed: bool = True
    """For an applied command: False when it changed nothing (``already paused``), so a room keeps
    no undo for it. Sent only when False (``encode``): an older build refuses just those answers."""
    count: int = Field(ge=0, default=0)
    """For refusals and drops (told per reason, at most once a second): how many since the last; for a
    stall: how many tasks it holds (a batch's, or those waiting in the queue); 0 otherwise."""
    batch: int = Field(ge=-1, default=-1)
    """For a stall: the batch held (-1: tasks waiting in the queue, as a pause holds them)."""
    lane: int = Field(ge=-1, default=-1)
    """For a stall: the lane of its batch (-1: none)."""
    lasted_s: float = Field(ge=0, default=0.0)
    """For a stall that ended: how long it lasted."""


_CEILINGS: TypeAdapter[dict[str, float]] = TypeAdapter(dict[str, Annotated[float, Field(ge=0, allow_inf_nan=True)]])


def _open_ceiling(value: Any, handler: ValidatorFunctionWrapHandler) -> Figures:
    """Figures from the wire: every number finite, except the Amdahl ceilings, which may be +inf (no
    serial part measured yet: ``metrics.amdahl_speedup``) and are never NaN or negative."""
    if not (isinstance(value, dict) and isinstance(value.get("amdahl"), dict)):
        return handler(value)  # type: ignore[no-any-return]  # pydantic's handler is untyped
    try:
        ceilings = _CEILINGS.validate_python(value["amdahl"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise PydanticCustomError("amdahl", "amdahl.{where}: {msg}", {"where": where, "msg": first["msg"]}) from None
    figures: Figures = handler({**value, "amdahl": {}})
    return dataclasses.replace(figures, amdahl=ceilings)


_Figures = Annotated[Figures, WrapValidator(_open_ceiling)]


class Telemetry(BaseModel):
    """A snapshot summary: enough for an attached control room to draw every screen. Counts,
    figures, lanes, feeder and workers are exact; task lists are samples (``columns``: at most a
    few hundred keys per board column, as runs: ``compact.key_runs``), and what the samples of
    stalled tasks, failures and batch records left out is counted."""

    model_config = _WIRE_CONFIG

    v: Literal[2] = TELEMETRY_VERSION
    kind: Literal["telemetry"] = "telemetry"
    seq: int = Field(ge=0)
    t: float
    pipeline: _Id
    status: EngineStatus
    backend: _Text
    backend_reason: _Text = ""
    device: _Text = ""
    counts: Counts
    figures: _Figures
    lanes: tuple[LaneView, ...] = ()
    feeder: FeederView
    workers: tuple[WorkerView, ...] = ()
    stalled: tuple[StalledTask, ...] = Field(default=(), max_length=1000)
    failures: tuple[TaskFailure, ...] = Field(default=(), max_length=1000)
    timeline: tuple[PackedRecord, ...] = Field(default=(), max_length=4096)
    """Batch records finished since the previous telemetry message (``compact.pack_record``: times in
    microseconds since the engine started), the newest if there were more than a frame carries."""
    columns: Annotated[dict[Annotated[str, Field(max_length=32)],
                            Annotated[tuple[ColumnItem, ...], Field(max_length=MAX_COLUMN_KEYS)]],
                       Field(max_length=32)] = {}
    """Each board column's sample of keys (``ColumnName``; others are for a later build) as runs
    (``compact.key_runs``): the head of the queue and of each phase, the first stalled, the newest
    done, failed and cancelled."""
    column_totals: Annotated[dict[Annotated[str, Field(max_length=32)], Annotated[int, Field(ge=0)]],
                             Field(max_length=32)] = {}
    """Every sampled column's size (``ColumnName``), however few of its keys ``columns`` carries."""
    control: ControlView | None = None
    outage: OutageView | None = None
    """Set while an outage holds the run (engine/edges/outage.py)."""
    stalled_left_out: int = Field(ge=0, default=0)
    """Stalled tasks not in ``stalled`` (the counts have them all)."""
    failures_left_out: int = Field(ge=0, default=0)
    """Failed tasks not in ``failures``."""
    records_left_out: int = Field(ge=0, default=0)
    """Batch records finished since the previous message and not in ``timeline`` (more than fit)."""
    sent: float = Field(ge=0, default=0.0)
    """When the engine sent it (Unix seconds, its own clock): an attached room's lag."""
    frame: int = Field(ge=0, default=0)
    """Frames the engine's plane has sent before this one: a gap is a frame lost on the way."""

    @field_validator("columns")
    @classmethod
    def _runs(cls, columns: dict[str, tuple[str | int, ...]]) -> dict[str, tuple[str | int, ...]]:
        for name, runs in columns.items():
            if runs and not isinstance(runs[0], str):
                raise ValueError(f"{name}: a run must follow a key")
            if run_length(runs) > MAX_COLUMN_KEYS:
                raise ValueError(f"{name}: more than {MAX_COLUMN_KEYS} keys")
        return columns


class SignedCommand(_Wire):
    """An operator command. ``body`` is the command's JSON text exactly as signed: the signature
    covers ``f"{ts!r}\\n{nonce}\\n{body}"`` (HMAC-SHA256, hex), so no re-serialisation can break it."""

    kind: Literal["cmd"] = "cmd"
    ts: float
    nonce: Annotated[str, Field(min_length=16, max_length=64, pattern=r"^[0-9a-f]+$")]
    body: Annotated[str, Field(max_length=8192)]
    sig: Annotated[str, Field(min_length=64, max_length=64, pattern=r"^[0-9a-f]+$")]


Payload = Annotated[
    Birth | Heartbeat | Death | EngineState | Event | Telemetry | SignedCommand, Field(discriminator="kind")
]
PAYLOAD_ADAPTER: TypeAdapter[Payload] = TypeAdapter(Payload)
_MODELS: dict[str, type[BaseModel]] = {"birth": Birth, "hb": Heartbeat, "death": Death, "engine_state": EngineState,
                                   "event": Event, "telemetry": Telemetry, "cmd": SignedCommand}
_KINDS = frozenset(MAX_BYTES)
_JSON_SPACE = b" \t\r\n"
_ZLIB = b"\x78"
"""The first byte of a zlib stream with the default window (never the start of a JSON object)."""


class WireError(ValueError):
    """A payload that is not one of ours; ``reason`` is the counter it goes to."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def encode(msg: BaseModel) -> bytes:
    """The bytes of ``msg`` on the wire (compact JSON). An event's ``changed`` goes only when False,
    so every other event reads as it did to a build from before the field."""
    if isinstance(msg, Event) and msg.changed:
        return msg.model_dump_json(exclude={"changed"}).encode()
    return msg.model_dump_json().encode()


def encode_telemetry(tel: Telemetry, level: int = 6) -> bytes:
    """Telemetry as the plane publishes it: its JSON, zlib-compressed (``decode`` inflates it)."""
    return zlib.compress(encode(tel), level)


def plain(payload: bytes | bytearray) -> bytes:
    """``payload`` as JSON: a compressed telemetry frame inflated (at most ``MAX_BYTES["telemetry"]``),
    anything else as it is. Raises ``WireError`` (``oversized``, ``malformed``)."""
    raw = bytes(payload)
    return _inflate(raw) if raw[:1] == _ZLIB else raw


def _inflate(raw: bytes) -> bytes:
    limit = MAX_BYTES["telemetry"]
    if len(raw) > limit:
        raise WireError("oversized", f"{len(raw)} compressed bytes (at most {limit})")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(raw, limit)
    except zlib.error as exc:
        raise WireError("malformed", f"not zlib: {exc}") from None
    if inflater.unconsumed_tail:
        raise WireError("oversized", f"inflates past {limit} bytes")
    if not inflater.eof:
        raise WireError("malformed", "a truncated zlib stream")
    return out


@functools.cache
def _plan(expect: frozenset[str]) -> tuple[int, type[BaseModel] | None]:
    """For the kinds a topic may carry: the size limit, and the one model when there is one
    (worked out once per topic kind, not per message)."""
    model = _MODELS[next(iter(expect))] if len(expect) == 1 else None
    return max(MAX_BYTES[k] for k in expect), model


def decode(payload: bytes | bytearray | str, expect: frozenset[str] | None = None) -> Payload:
    """Validate ``payload`` as one of the wire models; ``expect`` names the kinds the topic may carry.

    Raises ``WireError`` with the reason to count."""
    raw = payload.encode() if isinstance(payload, str) else bytes(payload)
    limit, model = (_LARGEST, None) if expect is None else _plan(expect)
    if len(raw) > limit:
        raise WireError("oversized", f"{len(raw)} bytes (at most {limit})")
    # Every payload is an object: junk goes cheaply. Ours start with "{" (no copy of the payload for
    # them: this is every heartbeat's path), or are compressed telemetry; only one that is neither is
    # stripped of leading space.
    inflated = False
    if raw[:1] != b"{":
        if raw[:1] == _ZLIB and (expect is None or "telemetry" in expect):
            raw, inflated = _inflate(raw), True
        if not raw.lstrip(_JSON_SPACE).startswith(b"{"):
            raise WireError("malformed", "not a JSON object")
    refused: ValidationError | None = None
    if model is not None:
        # The common case (a heartbeat on its topic): one pass of pydantic's own JSON parser. Anything
        # it refuses goes the long way below, which names the reason.
        try:
            return model.model_validate_json(raw)  # type: ignore[return-value]
        except ValidationError as exc:
            refused = exc
    try:
        # pydantic's parser, not json.loads: 5 to 10 times faster on what a flood sends, and it stops
        # at 200 levels of nesting (json.loads took 30 µs to refuse 3 000).
        obj: Any = from_json(raw)
    except ValueError as exc:
        raise WireError("malformed", f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise WireError("malformed", f"a JSON {type(obj).__name__}, not an object")
    kind = obj.get("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise WireError("unknown_kind", f"kind {kind!r}")
    if expect is not None and kind not in expect:
        raise WireError("wrong_kind", f"{kind!r} on a topic for {sorted(expect)}")
    if inflated and kind != "telemetry":
        raise WireError("wrong_kind", f"{kind!r} compressed: only telemetry is")
    if len(raw) > MAX_BYTES[kind]:
        raise WireError("oversized", f"{len(raw)} bytes for {kind} (at most {MAX_BYTES[kind]})")
    version = VERSIONS[kind]
    if obj.get("v", version) != version:
        raise WireError("version", f"{kind} schema version {obj.get('v')!r}, this build speaks {version}")
    if refused is None:  # (with one model, its refusal above says why: validating again costs as much)
        try:
            return PAYLOAD_ADAPTER.validate_python(obj)
        except ValidationError as exc:
            refused = exc
    raise _invalid(kind, refused, tagged=model is None)


def _invalid(kind: str, exc: ValidationError, *, tagged: bool) -> WireError:
    """``invalid``, naming the first field refused (``tagged``: validated as the union, whose tag
    leads each error's location)."""
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    where = ".".join(str(p) for p in first["loc"][1 if tagged else 0 :])
    return WireError("invalid", f"{kind}: {where}: {first['msg']}")
