"""What runs on the tasks: a spec's stages, and its steps (``[[steps]]``) when it has more than one.

The decisions this module protects:
- A spec without steps is one step, as it always was: its ``stages`` run on every task from the
  source to the sink. A spec with steps names each step's stages, what it comes ``after``, and
  whether it is a reduce (``[steps.reduce]``) or waits for an operator (``gate``).
- A step's input is the outputs of the map step its ``after`` names (at most one), else the
  source's tasks; a reduce step named in ``after`` hands its result on as the stages' ``params``,
  and is a barrier: the step waits for the whole reduce.
- The graph is checked whole before any work starts, and every problem names its field
  (``steps.2.after.0: no step is called 'stat'``): an unknown step, a name used twice, a cycle, two
  map inputs, a reduce with neither a built-in nor ``combine`` and ``finish``, two steps that would
  both write the sink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from warpdeck.engine.edges.spec_types import Dtype, Shape, SpecModel, Target

__all__ = ["REDUCE_BUILTINS", "GraphIssue", "ReduceSpec", "StageSpec", "StepSpec", "graph_issues"]

REDUCE_BUILTINS = ("sum", "mean_var", "min_max", "histogram")
"""The reducers a step can name instead of writing its own (``engine/state/reducers.py``)."""

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


class StageSpec(SpecModel):
    """One stage function ``fn(xp, inp, out)``, run on the compute stream (a torch stage: ``framework``).
    In a step that comes after a reduce, a function with a fourth parameter (no default) is called
    ``fn(xp, inp, out, params)``: ``params[step]`` is that reduce's result, a mapping of names to arrays."""

    fn: Target
    """``module:function``; the same code runs with xp = numpy or cupy."""
    deadline_s: float = Field(default=60.0, gt=0)
    """A batch in this stage longer than this is reported hung."""
    out_shape: Shape | None = None
    """Per-task output shape; default: the function's ``out_spec`` or else the input shape."""
    out_dtype: Dtype | None = None
    """Per-task output dtype; default: the function's ``out_spec`` or else the input dtype."""
    framework: Literal["array", "torch"] = "array"
    """``array``: ``fn(xp, inp, out)`` on NumPy/CuPy arrays; ``torch``: ``fn(inp, out)`` (with a
    factory ``fn(model, inp, out)``) on torch tensors sharing the slot buffers, under
    ``torch.inference_mode()`` (``pip install 'warpdeck[torch]'``; docs/torch.md)."""
    factory: Target | None = None
    """Torch stages only: ``module:function`` called with no arguments once per lane, on its first
    batch; what it returns (the model) is the stage's first argument."""

    @field_validator("factory")
    @classmethod
    def _factory_needs_torch(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("framework") != "torch":
            raise ValueError('a factory needs framework = "torch"')
        return v


class ReduceSpec(SpecModel):
    """How a reduce step combines every task's output (after its stages, if it has any) into one
    result: a built-in, or your own ``combine(acc, batch) -> acc`` and ``finish(acc) -> result``,
    where an accumulator and a result are mappings of names to arrays."""

    builtin: Literal["sum", "mean_var", "min_max", "histogram"] | None = None
    """A built-in reducer: ``sum``, ``mean_var`` (count, mean, var, std), ``min_max`` or ``histogram``."""
    combine: Target | None = None
    """``module:function`` called as ``combine(acc, batch)``: ``batch`` holds n tasks' outputs (n, *shape),
    ``acc`` is None for a fresh accumulator; returns the new accumulator (a dict of arrays)."""
    merge: Target | None = None
    """``module:function`` called as ``merge(a, b)``: two accumulators as one (associative), so batches
    and lanes combine as a tree; needed for more than one lane."""
    finish: Target | None = None
    """``module:function`` called as ``finish(acc)`` (acc None: no task at all): the result, a dict of
    arrays handed to later steps as ``params[step]``."""
    axes: list[Annotated[int, Field(ge=0, le=7)]] = Field(default_factory=list)
    """Built-ins but ``histogram``: axes of one task's output reduced as well (``[1, 2]`` of CHW images:
    statistics per channel); none: per element."""
    bins: int | None = Field(default=None, ge=1, le=1 << 20)
    """``histogram``: how many bins, of equal width over ``value_range``."""
    value_range: tuple[float, float] | None = None
    """``histogram``: ``[low, high]``; values outside are counted as below or above."""

    @model_validator(mode="after")
    def _reduces_somehow(self) -> ReduceSpec:
        if self.builtin is None and self.combine is None:
            raise ValueError(f"combine: a reduce needs combine (with finish), or a builtin: "
                             f"{', '.join(REDUCE_BUILTINS)}")
        if self.builtin is not None and (self.combine or self.merge or self.finish):
            raise ValueError(f"builtin: {self.builtin!r} reduces by itself: drop combine, merge and finish")
        if self.combine is not None and self.finish is None:
            raise ValueError("finish: combine needs finish, the function that turns the accumulator into the result")
        if self.builtin is None and self.axes:
            raise ValueError("axes: only the built-ins reduce over axes; your combine sees whole tasks")
        if self.builtin != "histogram" and (self.bins is not None or self.value_range is not None):
            raise ValueError(f"{'bins' if self.bins is not None else 'value_range'}: only a histogram has bins "
                             "and a value_range")
        if self.builtin == "histogram" and self.axes:
            raise ValueError("axes: a histogram counts every value of a task; axes are for sum, mean_var, min_max")
        if self.builtin == "histogram":
            if self.bins is None or self.value_range is None:
                missing = "bins" if self.bins is None else "value_range"
                raise ValueError(f"{missing}: a histogram needs bins and value_range")
            if not self.value_range[0] < self.value_range[1]:
                raise ValueError("value_range: must be [low, high] with low below high")
        return self


class StepSpec(SpecModel):
    """One step of a pipeline of several: a map (stages run on each task) or a reduce (``[steps.reduce]``)."""

    name: Annotated[str, Field(pattern=_NAME)]
    """The step's name: in ``after``, ``params``, the run directory (``steps/<name>``) and the report."""
    stages: list[StageSpec] = Field(default_factory=list)
    """Stage functions run in order on each task; a map step needs one at least, a reduce step may
    have none (it reduces its input as it is)."""
    after: list[Annotated[str, Field(pattern=_NAME)]] = Field(default_factory=list)
    """Steps that must finish first (a map's outputs it takes as input, or a reduce whose result its
    stages get); none: the step reads the source."""
    reduce: ReduceSpec | None = None
    """Present: this step is a reduce, combining every task's output into one result."""
    gate: bool = False
    """Wait for an operator's approval before the step starts (``--approve NAME``, or from the control room)."""

    @property
    def is_reduce(self) -> bool:
        """Whether the step reduces (else it maps)."""
        return self.reduce is not None

    @model_validator(mode="after")
    def _maps_something(self) -> StepSpec:
        if self.reduce is None and not self.stages:
            raise ValueError("stages: a map step needs stages (or a [steps.reduce] section to make it a reduce)")
        return self


@dataclass(frozen=True)
class GraphIssue:
    """One thing wrong with the steps' graph, at a field's dotted path."""

    loc: str
    message: str


def graph_issues(steps: Sequence[StepSpec]) -> list[GraphIssue]:
    """Every problem with how ``steps`` connect: names used twice, unknown or self references, two
    map inputs to one step, cycles, and more than one step left to write the sink."""
    issues: list[GraphIssue] = []
    index: dict[str, int] = {}
    for i, st in enumerate(steps):
        if st.name in index:
            issues.append(GraphIssue(f"steps.{i}.name", f"{st.name!r} names step {index[st.name]} too"))
        else:
            index[st.name] = i
    for i, st in enumerate(steps):
        maps = []
        for j, name in enumerate(st.after):
            if name == st.name:
                issues.append(GraphIssue(f"steps.{i}.after.{j}", "a step cannot come after itself"))
            elif name not in index:
                known = ", ".join(repr(n) for n in index) or "none"
                issues.append(GraphIssue(f"steps.{i}.after.{j}", f"no step is called {name!r} (steps: {known})"))
            elif not steps[index[name]].is_reduce:
                maps.append(name)
        if len(maps) > 1:
            issues.append(GraphIssue(f"steps.{i}.after", f"a step reads one map step's outputs, not {len(maps)} "
                                     f"({', '.join(maps)}); join them in one step"))
    if issues:
        return issues
    cycle = _cycle(steps, index)
    if cycle:
        at = index[cycle[0]]
        issues.append(GraphIssue(f"steps.{at}.after", f"a cycle: {' -> '.join([*cycle, cycle[0]])}"))
        return issues
    ends = [st.name for st in steps if not st.is_reduce and not any(
        st.name in other.after and not other.is_reduce for other in steps)]
    if len(ends) > 1:
        issues.append(GraphIssue("steps", f"{len(ends)} map steps end the pipeline ({', '.join(ends)}) and would "
                                 "all write the sink: one step's outputs go to the sink"))
    return issues


def _cycle(steps: Sequence[StepSpec], index: dict[str, int]) -> list[str]:
    """One cycle among ``after`` references, as the names along it, else empty."""
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(index, white)
    path: list[str] = []

    def visit(name: str) -> list[str]:
        colour[name] = grey
        path.append(name)
        for dep in steps[index[name]].after:
            if colour[dep] == grey:
                return path[path.index(dep):]
            if colour[dep] == white and (found := visit(dep)):
                return found
        path.pop()
        colour[name] = black
        return []

    for st in steps:
        if colour[st.name] == white and (found := visit(st.name)):
            return list(reversed(found))
    return []
