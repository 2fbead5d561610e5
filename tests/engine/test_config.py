"""Pipeline spec parsing and validation (engine/edges/config.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from warpdeck.engine.edges.config import (
    NpyDirSink,
    NpyDirSource,
    SpecError,
    SyntheticSource,
    load_spec,
    parse_spec,
)

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_SPECS = sorted(EXAMPLES_DIR.glob("*.toml"))

MINIMAL_TOML = """\
name = "mini"
{extra}

[source]
kind = "synthetic"
count = {count}
shape = [4]

[[stages]]
fn = "{fn}"
{stage_extra}

{tables}
"""


def minimal(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "mini",
        "source": {"kind": "synthetic", "count": 8, "shape": [4]},
        "stages": [{"fn": "json:dumps"}],
    }
    data.update(over)
    return data


def write_spec(directory: Path, *, count: str = "8", fn: str = "json:dumps", stage_extra: str = "",
               extra: str = "", tables: str = "", name: str = "pipeline.toml") -> Path:
    """A minimal spec file; ``extra`` are top-level keys, ``tables`` whole tables after the stage."""
    p = directory / name
    p.write_text(MINIMAL_TOML.format(count=count, fn=fn, stage_extra=stage_extra, extra=extra, tables=tables),
                 encoding="utf-8")
    return p


@pytest.fixture(autouse=True)
def _restore_import_state() -> Iterator[None]:
    """resolve_target puts the spec's folder on sys.path and imports modules: undo both."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name.startswith("wdtest_"):
            del sys.modules[name]


def issue_locs(err: SpecError) -> list[str]:
    return [i.loc for i in err.issues]


# -- valid specs ------------------------------------------------------------------------------------
def test_minimal_spec_parses_with_the_documented_defaults() -> None:
    spec = parse_spec(minimal())
    assert spec.name == "mini"
    assert spec.source == SyntheticSource(kind="synthetic", count=8, shape=(4,), dtype="float32", seed=0)
    assert spec.slot_depth == 2
    assert spec.backend == "auto"
    assert spec.retry.max_attempts == 3
    assert spec.retry.isolate is True
    assert spec.batch_size == 64
    assert spec.lanes == 1
    assert spec.sink == NpyDirSink(kind="npy_dir", path=Path("outputs"))
    assert spec.stages[0].deadline_s == 60.0


def test_load_spec_reads_a_toml_file(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, count="12", extra="batch_size = 5\nslot_depth = 3\n"))
    assert isinstance(spec.source, SyntheticSource)
    assert spec.source.count == 12
    assert (spec.batch_size, spec.slot_depth) == (5, 3)


def test_stage_module_next_to_the_spec_file_is_importable(tmp_path: Path) -> None:
    (tmp_path / "wdtest_local_stage.py").write_text("def stage(xp, inp, out):\n    out[...] = inp\n", encoding="utf-8")
    spec = load_spec(write_spec(tmp_path, fn="wdtest_local_stage:stage"))
    assert spec.stages[0].fn == "wdtest_local_stage:stage"


# -- field errors -----------------------------------------------------------------------------------
def test_unknown_top_level_key_is_reported_at_its_path() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(bogus_option=1))
    assert issue_locs(info.value) == ["bogus_option"]
    assert "Extra inputs are not permitted" in info.value.issues[0].message


def test_unknown_key_named_like_a_source_kind_is_reported_at_its_path() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(null=1))
    assert issue_locs(info.value) == ["null"]


def test_wrong_type_in_the_source_names_the_dotted_path_and_the_file(tmp_path: Path) -> None:
    path = write_spec(tmp_path, count='"x"')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert issue_locs(info.value) == ["source.count"]
    assert info.value.issues[0].got == "'x'"
    assert info.value.file == str(path)
    assert str(path) in str(info.value)
    assert "source.count" in str(info.value)


def test_negative_stage_deadline_names_its_index_in_the_path(tmp_path: Path) -> None:
    path = write_spec(tmp_path, stage_extra="deadline_s = -1")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert issue_locs(info.value)[0] == "stages.0.deadline_s"
    assert "greater than 0" in info.value.issues[0].message
    assert str(path) in str(info.value)


def test_bad_field_in_the_only_stage_is_the_only_issue() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(stages=[{"fn": "json:dumps", "deadline_s": -1}]))
    assert issue_locs(info.value) == ["stages.0.deadline_s"]


def test_every_problem_in_a_spec_is_listed_at_once(tmp_path: Path) -> None:
    path = write_spec(tmp_path, count='"x"', stage_extra="deadline_s = -1", extra="slot_depth = 1\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert {"slot_depth", "source.count", "stages.0.deadline_s"} <= set(issue_locs(info.value))


@pytest.mark.parametrize(("low", "high"), [(10, 10), (20, 10)])
def test_low_watermark_not_below_high_is_reported_under_feeder(tmp_path: Path, low: int, high: int) -> None:
    path = write_spec(tmp_path, tables=f"[feeder]\nlow_watermark = {low}\nhigh_watermark = {high}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    (issue,) = info.value.issues
    assert issue.loc == "feeder"
    assert "low_watermark must be below high_watermark" in issue.message
    assert str(path) in str(info.value)


def test_unknown_source_kind_is_reported_at_source() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(source={"kind": "s3", "count": 1, "shape": [1]}))
    assert issue_locs(info.value) == ["source"]
    assert "'s3'" in info.value.issues[0].message


def test_max_depth_below_slot_depth_is_rejected() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(slot_depth=6, feeder={"max_depth": 4}))
    assert "feeder.max_depth must be at least slot_depth" in str(info.value)


async def test_spec_with_only_a_small_high_watermark_is_rejected_by_validation_or_runs(tmp_path: Path) -> None:
    data = minimal(backend="numpy", batch_size=64, feeder={"high_watermark": 100},
                   stages=[{"fn": "warpdeck.examples.dense:stage"}], source={"kind": "synthetic", "count": 8,
                                                                         "shape": [512]})
    try:
        spec = parse_spec(data)
    except SpecError as err:  # the fix in config: a clear error at the field
        assert issue_locs(err)[0].startswith("feeder")
        return
    # the fix in the engine: a low watermark that fits under 100 (an Engine is built inside a running loop)
    from warpdeck.engine.engine import Engine

    eng = Engine(spec, tmp_path)
    assert 0 < eng.feeder.low < eng.feeder.high == 100
    eng.backend.close()


# -- stage targets ------------------------------------------------------------------------------
def test_stage_module_that_cannot_be_imported_is_reported_at_stages_0_fn() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(stages=[{"fn": "wdtest_no_such_module:stage"}]))
    (issue,) = info.value.issues
    assert issue.loc == "stages.0.fn"
    assert "cannot import module 'wdtest_no_such_module'" in issue.message
    assert "ModuleNotFoundError" in issue.message


def test_stage_module_that_raises_on_import_is_reported_with_the_error(tmp_path: Path) -> None:
    (tmp_path / "wdtest_broken.py").write_text("raise RuntimeError('half-written module')\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(tmp_path, fn="wdtest_broken:stage"))
    (issue,) = info.value.issues
    assert issue.loc == "stages.0.fn"
    assert "wdtest_broken" in issue.message
    assert "half-written module" in issue.message


def test_missing_function_in_an_importable_module_is_reported_at_stages_0_fn() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(stages=[{"fn": "json:dumps"}, {"fn": "json:no_such_function"}]))
    (issue,) = info.value.issues
    assert issue.loc == "stages.1.fn"
    assert issue.message == "module 'json' has no attribute 'no_such_function'"


def test_missing_attribute_at_the_first_stage_is_reported_at_stages_0_fn() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(stages=[{"fn": "json:no_such_function"}]))
    assert issue_locs(info.value) == ["stages.0.fn"]
    assert "'json'" in info.value.issues[0].message


def test_non_callable_target_is_reported() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(stages=[{"fn": "json:__version__"}]))
    assert issue_locs(info.value) == ["stages.0.fn"]
    assert "json:__version__ is not callable" in info.value.issues[0].message


def test_target_without_a_colon_is_a_field_error_at_stages_0_fn() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(stages=[{"fn": "nocolon"}]))
    assert issue_locs(info.value)[0] == "stages.0.fn"
    assert "should match pattern" in info.value.issues[0].message
    assert info.value.issues[0].got == "'nocolon'"


def test_callable_sink_target_is_checked_at_sink_target() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(minimal(sink={"kind": "callable", "target": "wdtest_missing_sink:write"}))
    assert issue_locs(info.value) == ["sink.target"]


# -- files ------------------------------------------------------------------------------------------
def test_toml_syntax_error_is_reported_at_toml(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('name = "x"\n[source\nkind = "synthetic"\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert issue_locs(info.value) == ["(toml)"]
    assert str(path) in str(info.value)


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert issue_locs(info.value) == ["(file)"]
    assert "cannot read" in info.value.issues[0].message
    assert info.value.file == str(path)


def test_relative_npy_dir_path_resolves_against_the_spec_files_folder(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory must not matter
    path = spec_dir / "p.toml"
    path.write_text('name = "p"\n[source]\nkind = "npy_dir"\npath = "data/in"\n[[stages]]\nfn = "json:dumps"\n',
                    encoding="utf-8")
    spec = load_spec(path)
    assert isinstance(spec.source, NpyDirSource)
    assert spec.source.path == spec_dir.resolve() / "data" / "in"


def test_absolute_npy_dir_path_is_kept(tmp_path: Path) -> None:
    target = (tmp_path / "abs").resolve()
    spec = parse_spec(minimal(source={"kind": "npy_dir", "path": str(target)}), base=tmp_path / "other")
    assert isinstance(spec.source, NpyDirSource)
    assert spec.source.path == target


@pytest.mark.parametrize(
    "example",
    [pytest.param(p, id=p.name) for p in EXAMPLE_SPECS]
    or [pytest.param(None, marks=pytest.mark.skip(reason="examples/ holds no *.toml yet"))],
)
def test_every_example_spec_loads(example: Path) -> None:
    spec = load_spec(example)
    assert spec.name == example.stem
    assert len(spec.stages) >= 1 or (bool(spec.steps) and all(step.stages or step.reduce for step in spec.steps))
