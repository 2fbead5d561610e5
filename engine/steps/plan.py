"""A spec's steps as the engine runs them: segments in an order that respects every ``after``.

The decisions this module protects:
- A map step whose only predecessor is a map with no other successor, and no gate of its own,
  streams: it joins its predecessor's segment, its stages run after the predecessor's in the same
  lanes, and nothing is written between them. Every other ``after`` is a barrier: the segment
  starts once the segments it names have finished.
- Each segment is one engine run of a spec made here (``segment_spec``): the pipeline's own fields,
  the segment's stages, its input (the source, or the outputs of the segment it reads) and its
  output (the pipeline's sink for the segment that ends the pipeline; ``steps/<name>/outputs`` as
  ``.npy`` for a map that a later step reads; the reduce's partials for a reduce). The same spec
  gives the same segment specs, so each segment's journal resumes it.
- The order is the spec's among segments ready at once: deterministic, so a resume finds the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warpdeck.engine.edges.config import NpyDirSink, NpyDirSource, NullSink, ParquetSink, PipelineSpec
from warpdeck.engine.edges.step_spec import ReduceSpec, StageSpec, StepSpec

__all__ = ["Segment", "plan_steps", "segment_dir", "segment_spec", "step_words", "unchanged"]

_UNCHANGED = "warpdeck.engine.steps.plan:unchanged"


def unchanged(xp: Any, inp: Any, out: Any) -> None:
    """The stage of a reduce step that has none: its input reduced as it is."""
    out[...] = inp


@dataclass(frozen=True)
class Segment:
    """One engine run of a plan: a reduce step, or one or more map steps streaming into each other."""

    name: str
    """The last step's name (its outputs are the segment's)."""
    steps: tuple[str, ...]
    """The steps it runs, in order."""
    stages: tuple[StageSpec, ...]
    """Their stages, in order."""
    reduce: ReduceSpec | None
    """The reduce, for a reduce step."""
    reads: str | None
    """The segment whose outputs are its input; None: the pipeline's source."""
    params_from: tuple[str, ...]
    """The reduce steps before it, whose results its stages are given (``fn(xp, inp, out, params)``)."""
    after: tuple[str, ...]
    """The segments that must finish before it starts (its barrier)."""
    gate: bool
    """Whether it waits for an operator's approval before it starts."""
    writes_sink: bool
    """Whether its outputs go to the pipeline's sink (the map that ends the pipeline)."""


def plan_steps(spec: PipelineSpec) -> tuple[Segment, ...]:
    """The segments of ``spec`` (one, of its stages, for a spec without steps) in the order they run."""
    if not spec.steps:
        return (Segment(spec.name, (spec.name,), tuple(spec.stages), None, None, (), (), False, True),)
    steps = {st.name: st for st in spec.steps}
    successors: dict[str, list[str]] = {name: [] for name in steps}
    for st in spec.steps:
        for dep in st.after:
            successors[dep].append(st.name)
    streams_into = {st.name: _map_input(st, steps) for st in spec.steps
                    if _streams(st, steps, successors)}
    joined = set(streams_into.values())
    segment_of: dict[str, str] = {}
    chains: list[list[StepSpec]] = []
    for st in spec.steps:
        if st.name in streams_into:
            continue
        chain = [st]
        while chain[-1].name in joined:
            chain.append(next(steps[n] for n, src in streams_into.items() if src == chain[-1].name))
        chains.append(chain)
        for member in chain:
            segment_of[member.name] = chain[-1].name
    read_later = {_map_input(st, steps) for st in spec.steps} - {None}
    made: dict[str, Segment] = {}
    for chain in chains:
        head, last = chain[0], chain[-1]
        source = _map_input(head, steps)
        before = _ancestors([s.name for s in chain], steps)
        made[last.name] = Segment(
            name=last.name, steps=tuple(s.name for s in chain),
            stages=tuple(stage for s in chain for stage in s.stages), reduce=last.reduce,
            reads=segment_of[source] if source is not None else None,
            params_from=tuple(n for n in steps if n in before and steps[n].is_reduce),
            after=tuple(dict.fromkeys(segment_of[d] for s in chain for d in s.after if segment_of[d] != last.name)),
            gate=head.gate, writes_sink=not last.is_reduce and last.name not in read_later)
    return _in_order(list(made.values()))


def _map_input(step: StepSpec, steps: dict[str, StepSpec]) -> str | None:
    """The map step whose outputs ``step`` reads, None for the source (``graph_issues`` allows one)."""
    return next((d for d in step.after if not steps[d].is_reduce), None)


def _streams(step: StepSpec, steps: dict[str, StepSpec], successors: dict[str, list[str]]) -> bool:
    """Whether ``step`` runs in its predecessor's lanes: a map after one map alone, the map's only successor."""
    if step.is_reduce or step.gate or len(step.after) != 1:
        return False
    (dep,) = step.after
    return not steps[dep].is_reduce and successors[dep] == [step.name]


def _ancestors(names: Sequence[str], steps: dict[str, StepSpec]) -> set[str]:
    seen: set[str] = set()
    todo = [d for n in names for d in steps[n].after]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(steps[n].after)
    return seen


def _in_order(segments: list[Segment]) -> tuple[Segment, ...]:
    """Every segment after those it waits for; among those ready at once, the spec's order."""
    done: list[Segment] = []
    left = list(segments)
    while left:
        ready = next(s for s in left if all(any(d.name == a for d in done) for a in s.after))
        done.append(ready)
        left.remove(ready)
    return tuple(done)


def step_words(plan: tuple[Segment, ...], seg: Segment) -> str:
    """A segment as it starts, in words: which of how many, what it is, and which wait for it at a barrier."""
    what = " + ".join(seg.steps) + (" (reduce)" if seg.reduce is not None else "")
    waiting = [f"{s.name}{' (gate)' if s.gate else ''}" for s in plan if seg.name in s.after]
    then = f"; waiting for it at a barrier: {', '.join(waiting)}" if waiting else ""
    return f"step {plan.index(seg) + 1} of {len(plan)}: {what}{then}"


def segment_dir(run_dir: Path, segment: Segment) -> Path:
    """Where a segment keeps its journal, its outputs for later steps and a reduce's partials and result."""
    return run_dir / "steps" / segment.name


def segment_spec(spec: PipelineSpec, segment: Segment, run_dir: Path) -> PipelineSpec:
    """The spec an engine runs ``segment`` with (for a spec without steps: ``spec`` itself)."""
    if not spec.steps:
        return spec
    update: dict[str, Any] = {
        "name": f"{spec.name}.{segment.name}"[:64],
        "steps": [],
        "stages": list(segment.stages) or [StageSpec(fn=_UNCHANGED)],
    }
    if segment.reads is not None:
        update["source"] = NpyDirSource(kind="npy_dir", path=run_dir / "steps" / segment.reads / "outputs")
    if segment.reduce is not None:
        # The reduce's partials are its sink (given to the engine); it writes them on threads.
        update["sink"] = NullSink(kind="null")
        update["host"] = spec.host.model_copy(update={"sink_pool": "threads"})
    elif segment.writes_sink:
        sink = spec.sink
        if isinstance(sink, NpyDirSink | ParquetSink) and not sink.path.is_absolute():
            sink = sink.model_copy(update={"path": run_dir / sink.path})  # the pipeline's, not the segment's
        update["sink"] = sink
    else:
        update["sink"] = NpyDirSink(kind="npy_dir", path=segment_dir(run_dir, segment) / "outputs")
    return spec.model_copy(update=update)
