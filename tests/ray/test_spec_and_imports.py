"""The executor section of a spec, and the promise that a single-machine run never loads Ray
(no Ray cluster needed for these)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from wd_build import spec as build_spec

from warpdeck.engine.api import SpecError


def test_executor_ray_is_short_for_its_section() -> None:
    assert build_spec(executor="ray").executor.kind == "ray"
    full = build_spec(executor={"kind": "ray", "address": "ray://head:10001", "workers": 4}).executor
    assert (full.kind, full.address, full.workers, full.max_restarts) == ("ray", "ray://head:10001", 4, -1)
    assert build_spec().executor.kind == "local", "specs without the section stay local"


@pytest.mark.parametrize(("value", "where"), [
    ("dask", "executor.kind"),
    ({"kind": "ray", "workers": 0}, "executor.workers"),
    ({"kind": "ray", "gpus_per_worker": -1}, "executor.gpus_per_worker"),
    ({"kind": "ray", "adress": "auto"}, "executor.adress"),
    ({"kind": "local", "address": "auto"}, "executor.address"),
])
def test_a_bad_executor_names_its_field(value: object, where: str) -> None:
    with pytest.raises(SpecError) as err:
        build_spec(executor=value)
    assert [i.loc for i in err.value.issues] == [where]


def test_a_local_run_never_imports_ray() -> None:
    code = (
        "import asyncio, sys\n"
        "from warpdeck.engine.api import Engine, parse_spec\n"
        "spec = parse_spec({'name': 'no-ray', 'backend': 'numpy', 'sink': {'kind': 'null'},\n"
        "    'source': {'kind': 'synthetic', 'count': 40, 'shape': [512]},\n"
        "    'stages': [{'fn': 'warpdeck.examples.dense:stage'}], 'batch_size': 8})\n"
        "async def main():\n"
        "    async with Engine(spec) as eng:\n"
        "        assert (await eng.wait()).counts.done == 40\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'warpdeck.engine.scaleout'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
