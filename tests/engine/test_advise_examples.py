"""``advise`` on the three synthetic examples: a run with the recommended settings reaches the
throughput the advice predicted, within ``TOLERANCE`` (NumPy backend, real engine runs, no mocks).

The tolerance is a model check, not a benchmark: on this shared 2-core VM a run of the same plan
moved by 30-60 % between consecutive runs (dense: 11,460 then 7,054 tasks/s for one prediction),
so a tighter bound fails on the machine's drift, not on the model. The README's advise table gives
the figures measured in a quiet run (1-10 % off)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from warpdeck.engine.api import Engine, PipelineSpec, advise, load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: How long the run that checks a prediction lasts, at the predicted rate, and its fewest batches:
#: ``steady_tasks_s`` counts from the first batch done, when the ring already holds the next ones,
#: which a short run of large batches would pass for speed.
CHECK_S = 4.0
MIN_BATCHES = 16
#: How far a run of the plan may land from the prediction (a wrong model is off by far more).
TOLERANCE = 0.35


def _as_planned(spec: PipelineSpec, batch_size: int, fill: int, sink: int, depth: int, count: int) -> PipelineSpec:
    """``spec`` with the advice's settings pinned (no tuner to move them) and ``count`` tasks."""
    return spec.model_copy(update={
        "backend": "numpy", "batch_size": batch_size, "slot_depth": depth,
        "source": spec.source.model_copy(update={"count": count}),
        "host": spec.host.model_copy(update={"fill_workers": fill, "sink_workers": sink,
                                             "max_workers": max(spec.host.max_workers, fill, sink)}),
        "feeder": spec.feeder.model_copy(update={"auto_depth": False, "max_depth": max(spec.feeder.max_depth, depth)}),
    })


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """Where calibration and the check write their outputs: memory (/dev/shm) where there is one.
    Both write real .npy files; on a VM disk how fast files can be created drifts up to 5x within
    minutes, which would be measured as the advice's error."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="wd-advise-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def _advise_then_run(example: str, scratch: Path, attempt: int) -> tuple[float, float, str]:
    """Advice for ``example``, then a run with it: (predicted, measured tasks/s, the plan in words)."""
    spec = load_spec(EXAMPLES / f"{example}-synthetic.toml")
    advice = await advise(spec, backend="numpy", scratch=scratch)
    (result,) = advice.results
    plan = result.plan
    assert plan.tasks_s > 0
    batches = max(MIN_BATCHES, round(plan.tasks_s * CHECK_S / plan.batch_size))
    run = _as_planned(spec, plan.batch_size, plan.fill_workers, plan.sink_workers, plan.slot_depth,
                      batches * plan.batch_size)
    async with Engine(run, scratch / f"run-{attempt}", journal=False) as engine:
        report = await engine.wait()
    assert report.status == "finished"
    assert report.slot_depth == [plan.slot_depth]
    said = f"batch {plan.batch_size}, fill {plan.fill_workers}, sink {plan.sink_workers}, depth {plan.slot_depth}"
    return plan.tasks_s, report.steady_tasks_s, said


@pytest.mark.parametrize("example", ["dense", "conv2d", "spectrogram"])
async def test_a_run_with_the_advice_reaches_its_prediction(example: str, scratch: Path) -> None:
    # Three tries: on a shared 2-core VM the machine's speed can drift between the calibration and
    # the check (measured up to 5x for file creation within minutes; conv2d missed twice in a row
    # by 26 and 31 % in one full run, and passed alone right after); a model error misses every time.
    misses = []
    for attempt in range(3):
        predicted, measured, said = await _advise_then_run(example, scratch, attempt)
        if abs(measured / predicted - 1) <= TOLERANCE:
            return
        misses.append(f"predicted {predicted:,.0f} tasks/s ({said}), measured {measured:,.0f}")
    pytest.fail(f"{example}: " + "; ".join(misses))
