"""Pipelines of several steps: the spec's checks (``engine/edges/step_spec.py``), the plan
(``engine/steps/plan.py``) and the runner with its ledger and gates (``engine/steps/runner.py``).

The runs use a module of stage and reducer functions written into the test's own folder (targets are
``module:function`` strings) and a synthetic source, whose inputs ``synthetic_values`` regenerates,
so every result is compared with NumPy on the same inputs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from warpdeck.engine.edges.config import (
    NpyDirSink,
    NpyDirSource,
    NullSink,
    PipelineSpec,
    SpecError,
    load_spec,
    parse_spec,
)
from warpdeck.engine.edges.reduce_sink import PARTIAL_GLOB, ReduceSinkImpl, read_partial
from warpdeck.engine.edges.sources import synthetic_values
from warpdeck.engine.edges.step_ledger import LEDGER_NAME, GateDecision, LedgerMismatch
from warpdeck.engine.engine import Engine
from warpdeck.engine.state.report import ExitStatus
from warpdeck.engine.steps.plan import Segment, plan_steps, segment_dir, segment_spec
from warpdeck.engine.steps.runner import GateAsk, GateDecided, RetryRefused, StepRun, make_reducer, run_steps

MOD = "wdsteps_stages"
"""The test module's name; each test writes its own copy and the fixture forgets it afterwards."""

STAGES = '''
"""Stage and reducer functions for tests/engine/test_steps.py (written by the test)."""
import threading

import numpy as np

LOCK = threading.Lock()
CALLS = {}
"""Calls per stage function."""
ROWS = {}
"""Tasks (rows) per stage function."""
FORBID = set()
"""Stage functions that raise when called."""
BLOCK_AFTER = {}
"""Stage function -> calls after which each call waits for RELEASE (a run held in place)."""
RELEASE = threading.Event()


def _called(name, inp):
    if name in FORBID:
        raise RuntimeError(f"{name} ran in a run that should not run it")
    with LOCK:
        n = CALLS.get(name, 0)
        CALLS[name] = n + 1
        ROWS[name] = ROWS.get(name, 0) + int(inp.shape[0])
    limit = BLOCK_AFTER.get(name)
    if limit is not None and n >= limit:
        RELEASE.wait(20)


def ident(xp, inp, out):
    _called("ident", inp)
    out[...] = inp


def norm(xp, inp, out, params):
    _called("norm", inp)
    s = params["stats"]
    out[...] = (inp - xp.asarray(s["mean"])) / xp.asarray(s["std"])


def scale_by_peak(xp, inp, out, params):
    _called("scale_by_peak", inp)
    out[...] = inp / float(params["peak"]["max"])


def shift_by_total(xp, inp, out, params):
    _called("shift_by_total", inp)
    out[...] = inp - xp.asarray(params["total"]["mean"])


def plain(xp, inp, out):
    _called("plain", inp)
    xp.multiply(inp, 2, out=out)


def with_default(xp, inp, out, params=None):
    _called("with_default", inp)
    out[...] = inp + (1.0 if params is None else 100.0)


def combine(acc, batch):
    b = np.asarray(batch, dtype=np.float64)
    part = {"sum": b.sum(axis=0), "sq": (b * b).sum(axis=0), "n": np.array(len(b), dtype=np.int64)}
    return part if acc is None else merge(acc, part)


def merge(a, b):
    return {"sum": a["sum"] + b["sum"], "sq": a["sq"] + b["sq"], "n": np.array(a["n"] + b["n"], dtype=np.int64)}


def finish(acc):
    if acc is None:
        return {"n": np.array(0, dtype=np.int64)}
    n = int(acc["n"])
    return {"n": np.array(n, dtype=np.int64), "sum": acc["sum"], "mean": acc["sum"] / n, "sq": acc["sq"]}
'''

N = 300
SHAPE = (4,)
SEED = 11


@pytest.fixture
def stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The test's module of functions, importable as ``wdsteps_stages``; forgotten afterwards."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / f"{MOD}.py").write_text(STAGES, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop(MOD, None)
    module = __import__(MOD)
    try:
        yield module
    finally:
        module.RELEASE.set()  # nothing of ours stays blocked
        sys.modules.pop(MOD, None)


def inputs(n: int = N) -> np.ndarray:
    """The synthetic source's inputs, as the engine draws them."""
    return synthetic_values(SEED, list(range(n)), SHAPE, np.dtype(np.float64))


def key(i: int) -> str:
    return f"syn-{i:08d}"


def outputs(directory: Path, n: int = N) -> np.ndarray:
    """Every task's output in ``directory``, in task order (and exactly one per task)."""
    assert sorted(p.name for p in directory.glob("*.npy")) == [f"{key(i)}.npy" for i in range(n)]
    return np.stack([np.load(directory / f"{key(i)}.npy") for i in range(n)])


def data(steps: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": "steps-test", "backend": "numpy", "batch_size": 32,
        "source": {"kind": "synthetic", "count": N, "shape": list(SHAPE), "dtype": "float64", "seed": SEED},
        "sink": {"kind": "npy_dir", "path": "outputs"},
        "steps": steps,
    }
    d.update(over)
    return d


def spec_of(steps: list[dict[str, Any]], **over: Any) -> PipelineSpec:
    return parse_spec(data(steps, **over))


def fn(name: str) -> dict[str, str]:
    return {"fn": f"{MOD}:{name}"}


def issues(steps: list[dict[str, Any]], **over: Any) -> list[tuple[str, str]]:
    """The (field, message) of every issue parse_spec finds."""
    with pytest.raises(SpecError) as err:
        parse_spec(data(steps, **over))
    return [(i.loc, i.message) for i in err.value.issues]


def ledger(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / LEDGER_NAME).read_text())  # type: ignore[no-any-return]


STATS_NORM = [
    {"name": "stats", "reduce": {"builtin": "mean_var"}},
    {"name": "norm", "after": ["stats"], "stages": [fn("norm")]},
]
"""A reduce over the source, then a map that normalises with its result."""

GATED = [
    {"name": "stats", "reduce": {"builtin": "mean_var"}},
    {"name": "norm", "after": ["stats"], "gate": True, "stages": [fn("norm")]},
    {"name": "peak", "after": ["norm"], "reduce": {"builtin": "min_max", "axes": [0]}},
    {"name": "final", "after": ["norm", "peak"], "stages": [fn("scale_by_peak")]},
]
"""stats -> (gate) norm -> peak -> final, where final reads norm's outputs too: four segments."""


# -- the spec's checks ------------------------------------------------------------------------------
MAP = {"stages": [{"fn": "json:dumps"}]}


def test_a_cycle_is_named_at_the_after_of_a_step_on_it() -> None:
    found = issues([
        {"name": "src", **MAP},
        {"name": "a", "after": ["c"], **MAP},
        {"name": "b", "after": ["a"], **MAP},
        {"name": "c", "after": ["b"], **MAP},
    ])
    assert len(found) == 1, found
    loc, message = found[0]
    assert loc in ("steps.1.after", "steps.2.after", "steps.3.after")  # a step on the cycle, not 'src'
    assert "cycle" in message and all(n in message for n in ("a", "b", "c")) and "src" not in message


def test_an_unknown_step_in_after_is_named_with_the_steps_there_are() -> None:
    found = issues([{"name": "stats", "reduce": {"builtin": "sum"}}, {"name": "norm", "after": ["stat"], **MAP}])
    assert [loc for loc, _ in found] == ["steps.1.after.0"]
    assert "'stat'" in found[0][1] and "'stats'" in found[0][1] and "'norm'" in found[0][1]


def test_a_step_after_itself_is_refused() -> None:
    found = issues([{"name": "a", "after": ["a"], **MAP}])
    assert [loc for loc, _ in found] == ["steps.0.after.0"]


def test_a_reduce_without_a_builtin_or_combine_names_combine() -> None:
    found = issues([{"name": "r", "reduce": {}}, {"name": "m", "after": ["r"], **MAP}])
    assert [loc for loc, _ in found] == ["steps.0.reduce.combine"]


def test_combine_without_finish_names_finish() -> None:
    found = issues([{"name": "r", "reduce": {"combine": "json:dumps"}}, {"name": "m", "after": ["r"], **MAP}])
    assert [loc for loc, _ in found] == ["steps.0.reduce.finish"]


def test_a_builtin_with_combine_is_refused() -> None:
    found = issues([{"name": "r", "reduce": {"builtin": "sum", "combine": "json:dumps"}},
                    {"name": "m", "after": ["r"], **MAP}])
    assert [loc for loc, _ in found] == ["steps.0.reduce.builtin"]


def test_a_histogram_without_bins_names_bins() -> None:
    found = issues([{"name": "h", "reduce": {"builtin": "histogram", "value_range": [0, 1]}},
                    {"name": "m", "after": ["h"], **MAP}])
    assert [loc for loc, _ in found] == ["steps.0.reduce.bins"]


def test_a_map_step_without_stages_names_its_stages() -> None:
    found = issues([{"name": "m"}])
    assert [loc for loc, _ in found] == ["steps.0.stages"]


def test_stages_and_steps_together_are_refused_at_stages() -> None:
    found = issues([{"name": "m", **MAP}], stages=[{"fn": "json:dumps"}])
    assert [loc for loc, _ in found] == ["stages"]


def test_neither_stages_nor_steps_is_refused_at_stages() -> None:
    found = issues([])
    assert [loc for loc, _ in found] == ["stages"]


def test_a_name_used_twice_is_named_at_the_second() -> None:
    found = issues([{"name": "m", **MAP}, {"name": "m", "after": ["m"], **MAP}])
    assert found[0][0] == "steps.1.name" and "step 0" in found[0][1]


def test_two_map_inputs_are_refused() -> None:
    found = issues([
        {"name": "a", **MAP},
        {"name": "b", **MAP},
        {"name": "c", "after": ["a", "b"], **MAP},
    ])
    assert [loc for loc, _ in found] == ["steps.2.after"]
    assert "a, b" in found[0][1]


def test_two_map_steps_ending_the_pipeline_are_refused() -> None:
    found = issues([
        {"name": "a", **MAP},
        {"name": "b", "after": ["a"], **MAP},
        {"name": "c", "after": ["a"], **MAP},
    ])
    assert [loc for loc, _ in found] == ["steps"]
    assert "b, c" in found[0][1] and "sink" in found[0][1]


def test_every_graph_problem_is_reported_at_once() -> None:
    found = issues([
        {"name": "a", **MAP},
        {"name": "a", **MAP},
        {"name": "b", "after": ["nope"], **MAP},
    ])
    assert sorted(loc for loc, _ in found) == ["steps.1.name", "steps.2.after.0"]


def test_steps_with_a_ray_executor_are_refused_at_executor() -> None:
    found = issues([{"name": "m", **MAP}], executor="ray")
    assert [loc for loc, _ in found] == ["executor"]


def test_an_unimportable_combine_is_named_before_any_work() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(data([{"name": "r", "reduce": {"combine": "json:nope", "finish": "json:dumps"}},
                         {"name": "m", "after": ["r"], **MAP}]))
    assert [i.loc for i in err.value.issues] == ["steps.0.reduce.combine"]
    assert "nope" in err.value.issues[0].message


def test_a_spec_file_with_a_cycle_names_the_file_and_the_field(tmp_path: Path) -> None:
    p = tmp_path / "cycle.toml"
    p.write_text('name = "c"\n[source]\nkind = "synthetic"\ncount = 4\nshape = [2]\n'
                 '[[steps]]\nname = "a"\nafter = ["b"]\n[[steps.stages]]\nfn = "json:dumps"\n'
                 '[[steps]]\nname = "b"\nafter = ["a"]\n[[steps.stages]]\nfn = "json:dumps"\n')
    with pytest.raises(SpecError) as err:
        load_spec(p)
    assert err.value.file == str(p)
    assert [i.loc for i in err.value.issues] in (["steps.0.after"], ["steps.1.after"])
    assert "cycle.toml" in str(err.value) and "after" in str(err.value)


def test_a_spec_without_steps_parses_as_before_and_plans_one_segment() -> None:
    d = data([])
    del d["steps"]
    d["stages"] = [{"fn": "json:dumps"}]
    spec = parse_spec(d)
    assert spec.steps == [] and [s.fn for s in spec.stages] == ["json:dumps"]
    (seg,) = plan_steps(spec)
    assert seg.name == "steps-test" and seg.writes_sink and seg.reads is None and seg.reduce is None
    assert segment_spec(spec, seg, Path("/nowhere")) is spec


async def test_run_steps_refuses_a_spec_without_steps(tmp_path: Path) -> None:
    d = data([])
    del d["steps"]
    d["stages"] = [{"fn": "json:dumps"}]
    with pytest.raises(ValueError, match="without steps"):
        await run_steps(parse_spec(d), tmp_path / "run")


# -- the plan ----------------------------------------------------------------------------------------
def names(plan: tuple[Segment, ...]) -> list[str]:
    return [s.name for s in plan]


def test_a_chain_of_maps_is_one_segment() -> None:
    spec = spec_of([
        {"name": "a", "stages": [{"fn": "json:dumps"}]},
        {"name": "b", "after": ["a"], "stages": [{"fn": "json:loads"}]},
        {"name": "c", "after": ["b"], "stages": [{"fn": "json:dump"}, {"fn": "json:load"}]},
    ])
    (seg,) = plan_steps(spec)
    assert seg.name == "c" and seg.steps == ("a", "b", "c")
    assert [s.fn for s in seg.stages] == ["json:dumps", "json:loads", "json:dump", "json:load"]
    assert seg.reads is None and seg.writes_sink and seg.reduce is None and seg.after == () and not seg.gate


def test_a_map_read_by_two_steps_is_its_own_segment_and_does_not_write_the_sink(tmp_path: Path) -> None:
    spec = spec_of([
        {"name": "a", **MAP},
        {"name": "r", "after": ["a"], "reduce": {"builtin": "sum"}},
        {"name": "b", "after": ["a", "r"], **MAP},
    ])
    plan = plan_steps(spec)
    assert names(plan) == ["a", "r", "b"]
    a, r, b = plan
    assert a.steps == ("a",) and not a.writes_sink
    assert r.reads == "a" and b.reads == "a" and b.writes_sink and not r.writes_sink
    assert segment_spec(spec, a, tmp_path).sink == NpyDirSink(kind="npy_dir", path=tmp_path / "steps/a/outputs")
    assert segment_spec(spec, b, tmp_path).source == NpyDirSource(kind="npy_dir", path=tmp_path / "steps/a/outputs")
    # The pipeline's own sink, resolved against the run directory (not the segment's).
    assert segment_spec(spec, b, tmp_path).sink == NpyDirSink(kind="npy_dir", path=tmp_path / "outputs")


def test_a_reduce_is_a_segment_of_its_own_with_no_sink_of_the_pipeline(tmp_path: Path) -> None:
    spec = spec_of([
        {"name": "m", **MAP},
        {"name": "r", "after": ["m"], "reduce": {"builtin": "sum"}},
    ])
    plan = plan_steps(spec)
    assert names(plan) == ["m", "r"]
    m, r = plan
    assert r.steps == ("r",) and r.reduce is not None and r.reduce.builtin == "sum" and r.after == ("m",)
    assert not m.writes_sink and not r.writes_sink
    seg = segment_spec(spec, r, tmp_path)
    assert seg.sink == NullSink(kind="null") and seg.steps == []
    assert seg.stages[0].fn == "warpdeck.engine.steps.plan:unchanged"  # a reduce with no stages of its own
    assert segment_dir(tmp_path, r) == tmp_path / "steps" / "r"


def test_a_gated_map_is_not_fused_with_the_map_before_it() -> None:
    spec = spec_of([
        {"name": "a", **MAP},
        {"name": "b", "after": ["a"], "gate": True, **MAP},
        {"name": "c", "after": ["b"], **MAP},
    ])
    plan = plan_steps(spec)
    assert [s.steps for s in plan] == [("a",), ("b", "c")]  # c streams into b; the gate splits a from b
    a, bc = plan
    assert not a.gate and bc.gate and bc.reads == "a" and bc.after == ("a",)
    assert not a.writes_sink and bc.writes_sink


def test_the_order_respects_after_not_the_spec_order() -> None:
    spec = spec_of([
        {"name": "norm", "after": ["stats"], **MAP},
        {"name": "stats", "reduce": {"builtin": "mean_var"}},
    ])
    assert names(plan_steps(spec)) == ["stats", "norm"]


def test_params_from_lists_every_reduce_before_a_segment() -> None:
    spec = spec_of([
        {"name": "s1", "reduce": {"builtin": "sum"}},
        {"name": "m1", "after": ["s1"], **MAP},
        {"name": "s2", "after": ["m1"], "reduce": {"builtin": "sum"}},
        {"name": "m2", "after": ["m1", "s2"], **MAP},
    ])
    plan = {s.name: s for s in plan_steps(spec)}
    assert names(plan_steps(spec)) == ["s1", "m1", "s2", "m2"]
    assert plan["s1"].params_from == ()
    assert plan["m1"].params_from == ("s1",)
    assert plan["s2"].params_from == ("s1",)
    assert plan["m2"].params_from == ("s1", "s2")
    assert plan["m2"].after == ("m1", "s2") and plan["m2"].reads == "m1"


def test_the_spectra_gate_example_plans_three_segments() -> None:
    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "spectra-gate.toml")
    spectra, peak, write = plan_steps(spec)
    assert (spectra.name, peak.name, write.name) == ("spectra", "peak", "write")
    assert not spectra.writes_sink and write.writes_sink and write.gate and not peak.gate
    assert write.reads == "spectra" and write.params_from == ("peak",) and peak.reads == "spectra"


# -- running steps ------------------------------------------------------------------------------------
async def test_a_reduce_then_a_map_normalises_with_the_reduces_result(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    report = await run_steps(spec_of(STATS_NORM), run)
    assert report.exit_code == ExitStatus.FINISHED
    assert [(s.name, s.kind, s.status, s.done, s.failed) for s in report.segments] == [
        ("stats", "reduce", "finished", N, 0), ("norm", "map", "finished", N, 0)]
    x = inputs()
    result = dict(np.load(run / "steps" / "stats" / "result.npz"))
    assert int(result["count"]) == N
    np.testing.assert_allclose(result["mean"], x.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result["var"], x.var(axis=0), rtol=1e-9)
    np.testing.assert_allclose(result["std"], x.std(axis=0), rtol=1e-9)
    assert report.segments[0].result["mean"] == pytest.approx(list(x.mean(axis=0)), rel=1e-9)
    out = outputs(run / "outputs")
    np.testing.assert_allclose(out, (x - x.mean(axis=0)) / x.std(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-9)
    np.testing.assert_allclose(out.std(axis=0), 1.0, rtol=1e-9)
    assert stages.ROWS["norm"] == N
    assert set(ledger(run)["finished"]) == {"stats", "norm"}
    assert ledger(run)["finished"]["stats"]["result"] == "steps/stats/result.npz"
    assert report.critical_path == ["stats", "norm"]


async def test_a_finished_run_runs_nothing_again(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    first = await run_steps(spec_of(STATS_NORM), run)
    assert first.exit_code == ExitStatus.FINISHED
    partials = sorted(p.name for p in (run / "steps" / "stats" / "partials").glob(PARTIAL_GLOB))
    stamp = {p.name: p.stat().st_mtime_ns for p in (run / "outputs").iterdir()}
    calls = stages.CALLS["norm"]
    stages.FORBID.add("norm")
    again = await run_steps(spec_of(STATS_NORM), run)
    assert again.exit_code == ExitStatus.FINISHED
    assert [(s.name, s.status, s.report, s.done) for s in again.segments] == [
        ("stats", "finished earlier", None, N), ("norm", "finished earlier", None, N)]
    assert again.segments[0].result == first.segments[0].result  # read back from result.npz
    assert stages.CALLS["norm"] == calls
    assert sorted(p.name for p in (run / "steps" / "stats" / "partials").glob(PARTIAL_GLOB)) == partials
    assert {p.name: p.stat().st_mtime_ns for p in (run / "outputs").iterdir()} == stamp


async def test_a_stage_without_params_and_one_with_a_default_are_called_as_before(
        tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    spec = spec_of([{"name": "stats", "reduce": {"builtin": "mean_var"}},
                    {"name": "m", "after": ["stats"], "stages": [fn("plain"), fn("with_default")]}])
    report = await run_steps(spec, run)
    assert report.exit_code == ExitStatus.FINISHED, report.segments[-1].report
    np.testing.assert_allclose(outputs(run / "outputs"), 2 * inputs() + 1.0, rtol=1e-12)
    assert stages.ROWS == {"plain": N, "with_default": N}


async def test_another_specs_ledger_is_refused(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    await run_steps(spec_of(STATS_NORM), run)
    before = ledger(run)
    d = data(STATS_NORM)
    d["source"]["seed"] = SEED + 1  # other inputs: other results
    with pytest.raises(LedgerMismatch, match=LEDGER_NAME):
        await run_steps(parse_spec(d), run)
    other_steps = [STATS_NORM[0], {**STATS_NORM[1], "stages": [fn("plain")]}]
    with pytest.raises(LedgerMismatch):
        await run_steps(spec_of(other_steps), run)
    assert ledger(run) == before


async def test_a_tuning_change_keeps_the_ledger(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    await run_steps(spec_of(STATS_NORM), run)
    again = await run_steps(spec_of(STATS_NORM, batch_size=16), run)
    assert again.exit_code == ExitStatus.FINISHED
    assert [s.status for s in again.segments] == ["finished earlier", "finished earlier"]


# -- gates -------------------------------------------------------------------------------------------
async def test_a_gate_without_a_decision_holds_the_run_after_the_steps_before_it(
        tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    report = await run_steps(spec_of(GATED), run)
    assert report.exit_code == ExitStatus.GATE_HELD == 7
    assert [(s.name, s.status) for s in report.segments] == [
        ("stats", "finished"), ("norm", "held at gate"), ("peak", "not started"), ("final", "not started")]
    assert report.gate is not None and report.gate.step == "norm" and report.gate.decision == "waiting"
    assert any(line.startswith("stats (reduce, finished): 300 done, 0 failed") for line in report.gate.produced)
    assert any(line.strip().startswith("mean = ") for line in report.gate.produced), report.gate.produced
    assert "norm" not in stages.CALLS
    assert not (run / "outputs").exists() and not (run / "steps" / "norm" / "outputs").exists()
    assert set(ledger(run)["finished"]) == {"stats"} and ledger(run)["gates"] == {}
    assert "held at the gate of norm" in report.ended


async def test_an_approved_gate_runs_on_and_the_ledger_keeps_the_decision(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    ok = GateDecision(decision="approved", note="stats look right", by="test")
    report = await run_steps(spec_of(GATED), run, StepRun(decisions={"norm": ok}))
    assert report.exit_code == ExitStatus.FINISHED
    assert [s.status for s in report.segments] == ["finished"] * 4
    assert report.gate is not None and report.gate.decision == "approved" and report.gate.note == "stats look right"
    gate = ledger(run)["gates"]["norm"]
    assert (gate["decision"], gate["note"], gate["by"]) == ("approved", "stats look right", "test")
    x = inputs()
    normed = (x - x.mean(axis=0)) / x.std(axis=0)
    np.testing.assert_allclose(outputs(run / "outputs"), normed / normed.max(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(outputs(run / "steps" / "norm" / "outputs"), normed, rtol=1e-9, atol=1e-12)


async def test_a_rejected_gate_ends_the_run_with_8_and_the_note(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    no = GateDecision(decision="rejected", note="mean is off", by="test")
    report = await run_steps(spec_of(GATED), run, StepRun(decisions={"norm": no}))
    assert report.exit_code == ExitStatus.GATE_REJECTED == 8
    assert [(s.name, s.status) for s in report.segments] == [
        ("stats", "finished"), ("norm", "rejected"), ("peak", "not started"), ("final", "not started")]
    assert report.gate is not None and report.gate.decision == "rejected" and report.gate.note == "mean is off"
    assert "norm" not in stages.CALLS
    assert not (run / "steps" / "norm" / "outputs").exists() and not (run / "outputs").exists()
    assert ledger(run)["gates"]["norm"]["decision"] == "rejected"
    # The rejection is kept: the same run again (no decision given) ends there again, asking no one.

    async def ask(q: GateAsk) -> GateDecision | None:
        raise AssertionError(f"asked again at {q.step}")

    again = await run_steps(spec_of(GATED), run, StepRun(decide=ask))
    assert again.exit_code == ExitStatus.GATE_REJECTED and again.gate is not None and again.gate.note == "mean is off"
    assert "norm" not in stages.CALLS


async def test_a_held_run_approved_later_runs_only_the_gated_step_and_after(
        tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    held = await run_steps(spec_of(GATED), run)
    assert held.exit_code == ExitStatus.GATE_HELD
    ok = GateDecision(decision="approved", note="later", by="test")
    report = await run_steps(spec_of(GATED), run, StepRun(decisions={"norm": ok}))
    assert report.exit_code == ExitStatus.FINISHED
    assert [(s.name, s.status, s.report is None) for s in report.segments] == [
        ("stats", "finished earlier", True), ("norm", "finished", False), ("peak", "finished", False),
        ("final", "finished", False)]
    assert stages.ROWS == {"norm": N, "scale_by_peak": N}
    assert report.gate is not None and report.gate.decision == "approved" and report.gate.note == "later"
    assert ledger(run)["gates"]["norm"]["note"] == "later"
    x = inputs()
    normed = (x - x.mean(axis=0)) / x.std(axis=0)
    np.testing.assert_allclose(outputs(run / "outputs"), normed / normed.max(), rtol=1e-9, atol=1e-12)


async def test_an_approval_in_the_ledger_is_not_asked_for_again(tmp_path: Path, stages: ModuleType) -> None:
    # Approved, then the gated step is stopped part way (a kill, a SIGTERM): the next run, given no
    # decision, takes the ledger's approval and finishes without asking.
    run = tmp_path / "run"
    stages.BLOCK_AFTER["norm"] = 1

    async def stop_norm(engine: Engine, seg: Segment) -> None:
        if seg.name != "norm":
            await engine.wait()
            return
        out = run / "steps" / "norm" / "outputs"
        limit = time.monotonic() + 10
        while not any(out.glob("*.npy")):
            assert time.monotonic() < limit, "no output of norm landed"
            await asyncio.sleep(0.002)
        asyncio.get_running_loop().call_later(0.05, stages.RELEASE.set)  # once the engine is being left

    ok = GateDecision(decision="approved", note="go", by="test")
    first = await run_steps(spec_of(GATED), run, StepRun(decisions={"norm": ok}, drive=stop_norm))
    assert first.exit_code == ExitStatus.STOPPED
    assert [s.status for s in first.segments] == ["finished", "stopped", "not started", "not started"]
    assert ledger(run)["gates"]["norm"]["decision"] == "approved" and set(ledger(run)["finished"]) == {"stats"}
    stages.BLOCK_AFTER.clear()
    asked: list[GateAsk] = []

    async def ask(q: GateAsk) -> GateDecision | None:
        asked.append(q)
        return None

    report = await run_steps(spec_of(GATED), run, StepRun(decide=ask))
    assert asked == []
    assert report.exit_code == ExitStatus.FINISHED
    assert [s.status for s in report.segments] == ["finished earlier", "finished", "finished", "finished"]
    assert report.gate is not None and report.gate.decision == "approved" and report.gate.note == "go"
    x = inputs()
    normed = (x - x.mean(axis=0)) / x.std(axis=0)
    np.testing.assert_allclose(outputs(run / "outputs"), normed / normed.max(), rtol=1e-9, atol=1e-12)


async def test_decide_is_asked_with_what_the_steps_before_produced(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    asked: list[GateAsk] = []

    async def ask(q: GateAsk) -> GateDecision | None:
        asked.append(q)
        return GateDecision(decision="approved", note="from the room", by="control room")

    report = await run_steps(spec_of(GATED), run, StepRun(decide=ask))
    assert report.exit_code == ExitStatus.FINISHED
    (q,) = asked
    assert q.step == "norm"
    assert q.produced[0] == "stats (reduce, finished): 300 done, 0 failed"
    mean = next(line for line in q.produced if line.strip().startswith("mean = "))
    assert f"{inputs().mean(axis=0)[0]:.4g}" in mean
    assert any(line.strip().startswith("count = 300") for line in q.produced)
    assert ledger(run)["gates"]["norm"]["by"] == "control room"


async def test_decide_answering_none_holds_the_gate(tmp_path: Path, stages: ModuleType) -> None:
    async def ask(q: GateAsk) -> GateDecision | None:
        return None

    report = await run_steps(spec_of(GATED), tmp_path / "run", StepRun(decide=ask))
    assert report.exit_code == ExitStatus.GATE_HELD and report.gate is not None
    assert report.gate.decision == "waiting" and ledger(tmp_path / "run")["gates"] == {}


# -- a reduce stopped part way -------------------------------------------------------------------------
CUSTOM = [
    {"name": "total", "stages": [fn("ident")],
     "reduce": {"combine": f"{MOD}:combine", "merge": f"{MOD}:merge", "finish": f"{MOD}:finish"}},
    {"name": "use", "after": ["total"], "stages": [fn("shift_by_total")]},
]
"""A reduce of the test's own (sum, sum of squares, count) over the source, then a map that uses it."""


def partial_keys(partials: Path) -> list[str]:
    return [k for p in sorted(partials.glob(PARTIAL_GLOB)) for k in read_partial(p)[0]]


async def test_a_stopped_reduce_resumes_from_its_partials_and_folds_each_task_once(
        tmp_path: Path, stages: ModuleType) -> None:
    spec = spec_of(CUSTOM, batch_size=10)
    reference = await run_steps(spec, tmp_path / "whole")
    assert reference.exit_code == ExitStatus.FINISHED
    want = dict(np.load(tmp_path / "whole" / "steps" / "total" / "result.npz"))
    x = inputs()
    assert int(want["n"]) == N
    np.testing.assert_allclose(want["sum"], x.sum(axis=0), rtol=1e-12)
    stages.CALLS.clear()
    stages.ROWS.clear()

    run = tmp_path / "run"
    partials = run / "steps" / "total" / "partials"
    stages.BLOCK_AFTER["ident"] = 6  # the 7th batch waits: the run cannot end before it is stopped

    async def stop_total(engine: Engine, seg: Segment) -> None:
        assert seg.name == "total", "nothing after a stopped segment starts"
        limit = time.monotonic() + 10
        while len(list(partials.glob(PARTIAL_GLOB))) < 3:
            assert time.monotonic() < limit, "no partial landed"
            await asyncio.sleep(0.002)
        asyncio.get_running_loop().call_later(0.05, stages.RELEASE.set)  # once the engine is being left

    first = await run_steps(spec, run, StepRun(drive=stop_total))
    assert first.exit_code == ExitStatus.STOPPED
    assert [(s.name, s.status) for s in first.segments] == [("total", "stopped"), ("use", "not started")]
    assert not (run / LEDGER_NAME).exists() or ledger(run)["finished"] == {}
    assert not (run / "steps" / "total" / "result.npz").exists()
    landed = {p.name: p.stat().st_mtime_ns for p in partials.glob(PARTIAL_GLOB)}
    keys_then = partial_keys(partials)
    assert 30 <= len(keys_then) < N and len(set(keys_then)) == len(keys_then)

    stages.BLOCK_AFTER.clear()
    stages.ROWS.clear()
    report = await run_steps(spec, run)
    assert report.exit_code == ExitStatus.FINISHED
    total = report.segments[0]
    assert total.status == "finished" and total.done == N and total.report is not None
    skipped = total.report.counts.skipped_done
    assert skipped == len(keys_then), "every task a partial held is done, not run again"
    assert stages.ROWS["ident"] == N - skipped  # the rest, and only the rest, ran
    # The partials of the stopped run are still there, untouched, and each task is in exactly one.
    assert {p.name: p.stat().st_mtime_ns for p in partials.glob(PARTIAL_GLOB) if p.name in landed} == landed
    keys = partial_keys(partials)
    assert sorted(keys) == [key(i) for i in range(N)]
    reducer = make_reducer(spec.steps[0].reduce, "total")  # type: ignore[arg-type]
    assert ReduceSinkImpl(partials, reducer).covered() == N
    got = dict(np.load(run / "steps" / "total" / "result.npz"))
    assert sorted(got) == sorted(want) and int(got["n"]) == N
    for name in ("sum", "mean", "sq"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(outputs(run / "outputs"), x - x.mean(axis=0), rtol=1e-9, atol=1e-12)


# -- more runs ----------------------------------------------------------------------------------------------
async def test_a_pipeline_of_one_histogram_reduce_counts_every_value(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    spec = spec_of([{"name": "hist", "reduce": {"builtin": "histogram", "bins": 8, "value_range": [-0.5, 0.5]}}])
    report = await run_steps(spec, run)
    assert report.exit_code == ExitStatus.FINISHED
    assert [(s.name, s.kind, s.status, s.done) for s in report.segments] == [("hist", "reduce", "finished", N)]
    got = dict(np.load(run / "steps" / "hist" / "result.npz"))
    x = inputs().ravel()
    counts, edges = np.histogram(x, bins=8, range=(-0.5, 0.5))
    np.testing.assert_array_equal(got["counts"], counts)
    np.testing.assert_allclose(got["edges"], edges)
    assert int(got["below"]) == int((x < -0.5).sum()) and int(got["above"]) == int((x > 0.5).sum())
    assert int(got["counts"].sum() + got["below"] + got["above"]) == x.size
    assert not (run / "outputs").exists()  # no map step: nothing for the sink


# -- found while writing these tests -------------------------------------------------------------------------
async def test_a_drive_that_stops_at_once_reports_the_segment_stopped(tmp_path: Path, stages: ModuleType) -> None:
    async def leave(engine: Engine, seg: Segment) -> None:
        return  # a stop asked for before the segment began (StepRun.drive may stop early)

    report = await run_steps(spec_of(STATS_NORM), tmp_path / "run", StepRun(drive=leave))
    assert report.exit_code == ExitStatus.STOPPED
    assert [s.status for s in report.segments] == ["stopped", "not started"]


FLAKY = '''
FAIL = {"on": True}


def flaky(xp, inp, out):
    if FAIL["on"] and (inp[:, 0] > 0.9).any():
        raise ValueError("flaky")
    out[...] = inp
'''


async def test_retry_failed_retries_a_finished_steps_failures_and_the_maps_after_it(tmp_path: Path,
                                                                                    stages: ModuleType) -> None:
    (Path(stages.__file__).parent / "wdsteps_flaky.py").write_text(FLAKY, encoding="utf-8")
    sys.modules.pop("wdsteps_flaky", None)
    flaky = __import__("wdsteps_flaky")
    try:
        run = tmp_path / "run"
        spec = spec_of([{"name": "a", "stages": [{"fn": "wdsteps_flaky:flaky"}]},
                        {"name": "b", "after": ["a"], "gate": True, "stages": [{"fn": "wdsteps_flaky:flaky"}]}],
                       retry={"max_attempts": 1})
        approve = {"b": GateDecision(decision="approved")}
        first = await run_steps(spec, run, StepRun(decisions=approve))
        assert first.exit_code == ExitStatus.FAILED and first.segments[0].failed > 0
        flaky.FAIL["on"] = False  # the cause fixed
        report = await run_steps(spec, run, StepRun(retry_failed=True))
        assert report.exit_code == ExitStatus.FINISHED
        assert [s.status for s in report.segments] == ["finished", "finished"]
        np.testing.assert_array_equal(outputs(run / "outputs"), inputs())
    finally:
        sys.modules.pop("wdsteps_flaky", None)


async def test_retry_failed_is_refused_where_a_finished_reduce_comes_after_the_failures(
        tmp_path: Path, stages: ModuleType) -> None:
    (Path(stages.__file__).parent / "wdsteps_flaky.py").write_text(FLAKY, encoding="utf-8")
    sys.modules.pop("wdsteps_flaky", None)
    __import__("wdsteps_flaky")
    try:
        run = tmp_path / "run"
        spec = spec_of([{"name": "a", "stages": [{"fn": "wdsteps_flaky:flaky"}]},
                        {"name": "stats", "after": ["a"], "reduce": {"builtin": "mean_var"}},
                        {"name": "norm", "after": ["a", "stats"], "stages": [fn("norm")]}],
                       retry={"max_attempts": 1})
        first = await run_steps(spec, run)
        assert first.exit_code == ExitStatus.FAILED
        with pytest.raises(RetryRefused, match="would change the result of the reduce stats"):
            await run_steps(spec, run, StepRun(retry_failed=True))
        again = await run_steps(spec, run)  # without retrying: as it was
        assert [s.status for s in again.segments] == ["finished earlier"] * 3
    finally:
        sys.modules.pop("wdsteps_flaky", None)


async def test_a_decision_against_the_one_the_ledger_holds_is_refused(tmp_path: Path, stages: ModuleType) -> None:
    run = tmp_path / "run"
    spec = spec_of([{"name": "stats", "reduce": {"builtin": "mean_var"}},
                    {"name": "norm", "after": ["stats"], "gate": True, "stages": [fn("norm")]}])
    rejected = await run_steps(spec, run, StepRun(decisions={"norm": GateDecision(decision="rejected", note="no")}))
    assert rejected.exit_code == ExitStatus.GATE_REJECTED
    with pytest.raises(GateDecided, match="was rejected"):
        await run_steps(spec, run, StepRun(decisions={"norm": GateDecision(decision="approved")}))


async def test_an_embedded_broker_is_one_for_the_whole_run(tmp_path: Path, stages: ModuleType) -> None:
    from warpdeck.engine.control.plane import ControlSettings

    report = await run_steps(spec_of(STATS_NORM), tmp_path / "run", StepRun(control=ControlSettings()))
    brokers = {s.report.control.broker for s in report.segments if s.report is not None and s.report.control}
    assert len(brokers) == 1 and next(iter(brokers)).startswith("mqtt://127.0.0.1:")
    assert all(s.report is not None and s.report.control is not None for s in report.segments)
