"""Operator commands as typed, tagged models (engine/state/commands.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from warpdeck.engine.state.commands import (
    COMMAND_ADAPTER,
    Cancel,
    Drain,
    Pause,
    RequeueStalled,
    Resume,
    RetryFailed,
    SetDepth,
)

EVERY_KIND = [
    Pause(),
    Resume(),
    Drain(),
    Cancel(keys=("a", "b-2")),
    Cancel(all=True),
    RetryFailed(),
    RetryFailed(keys=("only-this",)),
    RequeueStalled(),
    SetDepth(depth=4),
    SetDepth(depth=64, lane=1),
]


@pytest.mark.parametrize("cmd", EVERY_KIND, ids=lambda c: f"{c.kind}:{c.model_dump_json()}")
def test_every_command_round_trips_through_json(cmd: object) -> None:
    wire = COMMAND_ADAPTER.dump_json(cmd)  # type: ignore[arg-type]
    back = COMMAND_ADAPTER.validate_json(wire)
    assert type(back) is type(cmd)
    assert back == cmd


def test_every_kind_in_the_union_is_covered() -> None:
    assert {c.kind for c in EVERY_KIND} == {"pause", "resume", "drain", "cancel", "retry_failed",
                                            "requeue_stalled", "set_depth"}


@pytest.mark.parametrize(("text", "expected"), [
    ('{"kind": "pause"}', Pause()),
    ('{"kind": "cancel", "keys": ["x", "y"]}', Cancel(keys=("x", "y"))),
    ('{"kind": "cancel", "all": true}', Cancel(all=True)),
    ('{"kind": "retry_failed"}', RetryFailed(keys=())),
    ('{"kind": "set_depth", "depth": 3}', SetDepth(depth=3, lane=None)),
    ('{"kind": "set_depth", "depth": 2, "lane": 0}', SetDepth(depth=2, lane=0)),
])
def test_hand_written_json_validates_to_the_tagged_command(text: str, expected: object) -> None:
    assert COMMAND_ADAPTER.validate_json(text) == expected


def test_wire_form_carries_the_kind_tag() -> None:
    assert json.loads(COMMAND_ADAPTER.dump_json(SetDepth(depth=5, lane=2))) == {"kind": "set_depth", "depth": 5,
                                                                                 "lane": 2}


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        COMMAND_ADAPTER.validate_json('{"kind": "explode"}')
    assert info.value.errors()[0]["type"] == "union_tag_invalid"


def test_missing_kind_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        COMMAND_ADAPTER.validate_json('{"depth": 4}')
    assert info.value.errors()[0]["type"] == "union_tag_not_found"


@pytest.mark.parametrize("text", [
    '{"kind": "pause", "force": true}',
    '{"kind": "cancel", "keys": [], "everything": true}',
    '{"kind": "set_depth", "depth": 4, "lanes": 1}',
])
def test_extra_fields_are_rejected(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        COMMAND_ADAPTER.validate_json(text)
    assert [e["type"] for e in info.value.errors()] == ["extra_forbidden"]


@pytest.mark.parametrize("depth", [1, 0, -3, 65])
def test_set_depth_outside_2_to_64_is_rejected(depth: int) -> None:
    with pytest.raises(ValidationError) as info:
        COMMAND_ADAPTER.validate_json(json.dumps({"kind": "set_depth", "depth": depth}))
    assert info.value.errors()[0]["loc"][-1] == "depth"


def test_set_depth_without_depth_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        COMMAND_ADAPTER.validate_json('{"kind": "set_depth"}')
    assert info.value.errors()[0]["type"] == "missing"


def test_set_depth_model_rejects_depth_below_two_directly() -> None:
    with pytest.raises(ValidationError):
        SetDepth(depth=1)


def test_commands_are_frozen() -> None:
    cmd = Cancel(keys=("a",))
    with pytest.raises(ValidationError):
        cmd.all = True  # type: ignore[misc]
    assert cmd.all is False


def test_every_bound_on_the_depth_is_the_one_constant() -> None:
    # The spec's slot depth and the tuner's most, the command and the room: one pair of bounds
    # (engine/state/slot_depth.py; issue 30: 2..64 was written in six places).
    from warpdeck.engine.api import DEPTH_MAX, DEPTH_MIN, PipelineSpec, SetDepth
    from warpdeck.engine.edges.config import FeederSpec

    for model, field in ((PipelineSpec, "slot_depth"), (FeederSpec, "max_depth"), (SetDepth, "depth")):
        schema = model.model_json_schema()["properties"][field]
        assert (schema["minimum"], schema["maximum"]) == (DEPTH_MIN, DEPTH_MAX), (model, field)
