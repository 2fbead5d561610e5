"""Read-only mappings for what a snapshot carries (counts by name, figures by phase and lane).

The decisions this module protects:
- A snapshot is shared by every reader (the control room's widgets, telemetry, the report), so no
  reader can change a mapping in it: each is a ``MappingProxyType`` over a copy of its own, made by
  the dataclass that holds it (``__post_init__``), so every producer is covered: the snapshot
  builder, the control plane, telemetry decoded from the wire, the synthetic stream. The copies are
  of a few entries each, made a few times a second; a proxy is one small object.
- pydantic cannot write a ``MappingProxyType`` by itself: the aliases below tell it to write a JSON
  object. Decoded from the wire, the mapping is a dict again until its dataclass makes it read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, TypeVar

from pydantic import PlainSerializer

__all__ = ["LaneFigures", "NamedCounts", "NamedFigures", "read_only", "read_only_by_lane", "set_read_only"]

_K = TypeVar("_K")
_V = TypeVar("_V")


def read_only(mapping: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """``mapping`` as a read-only mapping over a copy of its own. A ``MappingProxyType`` is kept as
    it is: it is a snapshot's own, passed on (``dataclasses.replace``, a view handed to the next)."""
    return mapping if type(mapping) is MappingProxyType else MappingProxyType(dict(mapping))


def read_only_by_lane(by_lane: Mapping[int, Mapping[str, float]]) -> Mapping[int, Mapping[str, float]]:
    """``read_only`` for a mapping of mappings (figures per lane, per phase), inner ones included."""
    if type(by_lane) is MappingProxyType:
        return by_lane
    return MappingProxyType({lane: read_only(named) for lane, named in by_lane.items()})


def set_read_only(obj: object, *fields: str) -> None:
    """Make each named mapping field of the frozen dataclass ``obj`` read-only (from ``__post_init__``)."""
    for name in fields:
        object.__setattr__(obj, name, read_only(getattr(obj, name)))


def _plain_by_lane(by_lane: Mapping[int, Mapping[str, float]]) -> dict[int, dict[str, float]]:
    return {lane: dict(named) for lane, named in by_lane.items()}


NamedCounts = Annotated[Mapping[str, int], PlainSerializer(dict, return_type=dict[str, int])]
"""Counts by name (tasks by phase or stall reason, commands refused and messages dropped by reason)."""
NamedFigures = Annotated[Mapping[str, float], PlainSerializer(dict, return_type=dict[str, float])]
"""Figures by name (seconds per phase or stall reason, Amdahl ceilings per lane count)."""
LaneFigures = Annotated[Mapping[int, Mapping[str, float]],
                        PlainSerializer(_plain_by_lane, return_type=dict[int, dict[str, float]])]
"""Figures by lane, then by name (each lane's phase occupancy)."""
