"""Every number on the wire is finite: NaN, Infinity and -Infinity in any float field of any payload,
however deep (telemetry's figures, lanes, workers, batch records), are refused as ``invalid`` and
counted like any other bad payload.

The fields are found from each model's JSON schema, and a sample payload is generated from it with
every field present (optional ones too), so a float field added later is covered without a change
here. The one number that may be infinite is the Amdahl ceiling in telemetry's figures (+inf until
a serial part is measured); it is never NaN or -inf.
"""

from __future__ import annotations

import copy
import json
import math
import re
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from warpdeck.engine.control.drops import DropCounter
from warpdeck.engine.control.wire import Payload, WireError, decode

Path_ = tuple[str | int, ...]
MODELS: list[type[BaseModel]] = list(typing.get_args(typing.get_args(Payload)[0]))
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class _Sample:
    """A valid payload generated from a JSON schema, and the path of every float in it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._defs: dict[str, Any] = schema.get("$defs", {})
        self.floats: list[Path_] = []
        self.value = self._gen(schema, ())

    def _gen(self, node: dict[str, Any], path: Path_) -> Any:
        if "$ref" in node:
            return self._gen(self._defs[node["$ref"].rsplit("/", 1)[1]], path)
        if "const" in node:
            return node["const"]
        if "enum" in node:
            return node["enum"][0]
        if "anyOf" in node or "oneOf" in node:
            branch = next(b for b in node.get("anyOf", node.get("oneOf")) if b.get("type") != "null")
            return self._gen(branch, path)
        kind = node.get("type")
        if kind == "number":
            self.floats.append(path)
            return 1.5
        if kind == "integer":
            return 1
        if kind == "boolean":
            return True
        if kind == "string":  # a run of "a" fits every pattern on the wire (ids, hex nonces and signatures)
            tries = ["a" * max(node.get("minLength", 1), 1), "a" * node.get("maxLength", 1), ""]
            return next(t for t in tries if re.fullmatch(node.get("pattern", ".*"), t))
        if kind == "array":
            if "prefixItems" in node:
                return [self._gen(item, (*path, i)) for i, item in enumerate(node["prefixItems"])]
            return [self._gen(node["items"], (*path, 0))]
        if kind == "object" and "properties" in node:  # a model or dataclass: every field, optional ones too
            return {name: self._gen(sub, (*path, name)) for name, sub in node["properties"].items()}
        if kind == "object":  # a dict (its keys may be ints, as in figures.occupancy)
            return {"1": self._gen(node["additionalProperties"], (*path, "1"))}
        raise AssertionError(f"schema form this test does not know at {path}: {node}")


def _set(obj: Any, path: Path_, value: float) -> Any:
    out = copy.deepcopy(obj)
    *head, last = path
    target = out
    for p in head:
        target = target[p]
    target[last] = value
    return out


def _is_ceiling(path: Path_) -> bool:
    return path[:2] == ("figures", "amdahl")


def _cases() -> Iterator[Any]:
    for model in MODELS:
        sample = _Sample(model.model_json_schema())
        for path in sample.floats:
            for name, value in NON_FINITE.items():
                if _is_ceiling(path) and value == math.inf:
                    continue
                where = ".".join(str(p) for p in path)
                yield pytest.param(sample.value, path, value, id=f"{sample.value['kind']}.{where}={name}")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_the_generated_sample_of_every_payload_is_valid(model: type[BaseModel]) -> None:
    sample = _Sample(model.model_json_schema())
    assert type(decode(json.dumps(sample.value).encode())) is model


@pytest.mark.parametrize(("payload", "path", "value"), list(_cases()))
def test_a_non_finite_number_in_any_float_field_is_refused(payload: dict[str, Any], path: Path_,
                                                           value: float) -> None:
    raw = json.dumps(_set(payload, path, value)).encode()  # NaN, Infinity, -Infinity: as Python writes JSON
    with pytest.raises(WireError) as info:
        decode(raw, frozenset((payload["kind"],)))
    assert info.value.reason == "invalid", info.value


@pytest.mark.parametrize("literal", [b"1e999", b"-1e999"])
def test_a_number_too_large_for_a_float_is_refused(literal: bytes) -> None:
    raw = b'{"kind":"hb","v":1,"worker":"w1","epoch":1,"seq":0,"progress":0,' \
          b'"device":{"util_pct":1,"mem_used_mb":' + literal + b',"mem_total_mb":1}}'
    with pytest.raises(WireError, match="invalid"):
        decode(raw)


def test_the_amdahl_ceiling_may_be_infinite() -> None:
    telemetry = next(m for m in MODELS if m.__name__ == "Telemetry")
    sample = _Sample(telemetry.model_json_schema()).value
    sample["figures"]["amdahl"] = {"p=2": 1.9, "p=inf": math.inf}
    decoded = decode(json.dumps(sample).encode(), frozenset(("telemetry",)))
    assert decoded.figures.amdahl == {"p=2": 1.9, "p=inf": math.inf}  # type: ignore[union-attr]


def test_non_finite_payloads_are_counted_as_invalid() -> None:
    counter = DropCounter()
    hb = {"kind": "hb", "v": 1, "worker": "w1", "epoch": 1, "seq": 0, "progress": 0,
          "device": {"util_pct": 1.0, "mem_used_mb": 1.0, "mem_total_mb": 1.0, "temp_c": 40.0}}
    for value in NON_FINITE.values():
        try:
            decode(json.dumps(_set(hb, ("device", "temp_c"), value)).encode())
        except WireError as exc:
            counter.drop(exc)
    assert counter.counts() == {"invalid": 3}
