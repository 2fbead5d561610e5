"""``advise`` on the three synthetic examples, end to end: a run of the recommended settings (through
``with_plan``, the public way to apply a plan) runs as planned and lands near the predicted throughput
(NumPy backend, real engine runs, no mocks).

"Near" here is a model check, a factor of ``FACTOR`` either way, not the accuracy figure: on this
shared 2-core VM two runs of one plan a few seconds apart have differed by 30-60 % (dense: 11,460
then 7,054 tasks/s; in one CI run conv2d missed a 35 % bound three times running, +39 %, -36 %,
-37 %), so a tighter bound fails on the machine's drift. A wrong model (a cost per task taken per
batch, a phase left out of the bounds, a plan not applied) is off by far more. How close it comes
is measured by ``benchmarks/advise.py`` (bound 35 %), whose figures the README's table gives."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from warpdeck.engine.api import Engine, advise, load_spec, with_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHECK_S = 4.0
"""How long the run that checks a prediction lasts, at the predicted rate, and its fewest batches: ``steady_tasks_s``
counts from the first batch done, when the ring already holds the next ones, which a short run of large batches would
pass for speed."""
MIN_BATCHES = 16
FACTOR = 2.0
"""How far a run of the plan may land from the prediction, as a ratio either way."""


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
    run = with_plan(spec, plan).model_copy(update={
        "backend": "numpy", "source": spec.source.model_copy(update={"count": batches * plan.batch_size})})
    async with Engine(run, scratch / f"run-{attempt}", journal=False) as engine:
        report = await engine.wait()
    assert report.status == "finished"
    assert report.counts.done == batches * plan.batch_size
    assert report.slot_depth == [plan.slot_depth]
    assert (run.batch_size, run.host.fill_workers, run.host.sink_workers) == (
        plan.batch_size, plan.fill_workers, plan.sink_workers)
    said = f"batch {plan.batch_size}, fill {plan.fill_workers}, sink {plan.sink_workers}, depth {plan.slot_depth}"
    return plan.tasks_s, report.steady_tasks_s, said


@pytest.mark.parametrize("example", ["dense", "conv2d", "spectrogram"])
async def test_a_run_with_the_advice_reaches_its_prediction(example: str, scratch: Path) -> None:
    # Two tries: a burst of the machine's other work can still cover one whole check run.
    misses = []
    for attempt in range(2):
        predicted, measured, said = await _advise_then_run(example, scratch, attempt)
        if 1 / FACTOR <= measured / predicted <= FACTOR:
            return
        misses.append(f"predicted {predicted:,.0f} tasks/s ({said}), measured {measured:,.0f}")
    pytest.fail(f"{example}: " + "; ".join(misses))
