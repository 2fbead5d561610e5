"""``warpdeck check SPEC``: is this spec ready to run here? Checked in seconds, nothing run.

The decisions this module protects:
- check never runs the pipeline and starts nothing: no engine, no actors, no run directory. It
  validates the spec (a bad field is named as ``run`` names it), imports every stage function and
  target, opens the source and counts its tasks (its ``total`` when known, else by enumerating up
  to a cap), and with ``executor.kind = "ray"`` joins the cluster under ``connect_timeout_s`` and
  sets what the spec asks for (workers x each actor's CPUs, GPUs and custom resources) against
  what the alive nodes have. Ray's own lines go to a scratch log, never the terminal.
- Each problem is one line on stderr (``error: ...``); the findings go to stdout, as text or, with
  ``--json``, one JSON object (``ok``, ``problems``, ``spec``, ``source``, ``executor``). Exit 0
  when nothing is wrong, 2 otherwise (as ``run`` for a spec that cannot run).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from warpdeck.engine.api import (
    ExitStatus,
    PipelineSpec,
    SpecError,
    check_executor,
    load_spec,
    open_source,
    resource_amounts,
)

__all__ = ["add_check_parser", "check_spec", "run_check"]

COUNT_CAP = 100_000
"""A source that cannot say how many tasks it has is enumerated this far, no further."""
COUNT_BUDGET_S = 10.0
"""... and for at most this long."""
_RAY_OWN = ("memory", "object_store_memory")
"""Resources every Ray node has, left out of a node's line."""


def add_check_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``check`` subcommand and its flags."""
    p = sub.add_parser("check", help="check a spec before a job: fields, imports, the source's tasks and, on Ray, "
                       "the cluster (nothing runs)")
    p.add_argument("spec", type=Path)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run_check(args: argparse.Namespace, err: Console) -> int:
    """Check, print, and the exit status: 0 ready, 2 not."""
    result = check_spec(args.spec)
    for problem in result["problems"]:
        err.print(f"error: {problem}", markup=False, highlight=False, soft_wrap=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        out = Console(soft_wrap=True, highlight=False)
        for line in _text(result):
            out.print(line, markup=False)
    return ExitStatus.FINISHED if result["ok"] else ExitStatus.USAGE


def check_spec(path: Path) -> dict[str, Any]:
    """Every finding about the spec at ``path``, as a JSON-ready dict."""
    result: dict[str, Any] = {"spec": str(path), "ok": False, "problems": [], "pipeline": None, "stages": [],
                              "source": None, "executor": None}
    problems: list[str] = result["problems"]
    try:
        spec = load_spec(path)  # validates every field and imports every stage function and target
    except SpecError as exc:
        problems.extend(f"{exc.file}: {issue}" for issue in exc.issues)
        return result
    result["pipeline"] = spec.name
    every = [*spec.stages, *(s for step in spec.steps for s in step.stages)]
    result["stages"] = [{"fn": s.fn, "framework": s.framework, "factory": s.factory} for s in every]
    if spec.steps:
        result["steps"] = [{"name": st.name, "kind": "reduce" if st.is_reduce else "map", "after": st.after,
                            "gate": st.gate} for st in spec.steps]
    result["source"] = _source(spec, problems)
    result["executor"] = check_executor(spec, problems)
    result["ok"] = not problems
    return result


def _source(spec: PipelineSpec, problems: list[str]) -> dict[str, Any]:
    src = spec.source
    where = getattr(src, "path", None) or getattr(src, "target", None)
    found: dict[str, Any] = {"kind": src.kind, "where": str(where) if where is not None else None, "tasks": None,
                             "counted": "unknown"}
    try:
        source = open_source(src)
        total = source.total
        if total is not None:
            found.update(tasks=total, counted="total")
        else:
            n, deadline, complete = 0, time.monotonic() + COUNT_BUDGET_S, True
            for _ in source.items():
                n += 1
                if n >= COUNT_CAP or time.monotonic() > deadline:
                    complete = False
                    break
            found.update(tasks=n, counted="enumerated" if complete else "at least")
    except Exception as exc:  # noqa: BLE001 - whatever opening the source raises is the finding
        problems.append(f"source ({src.kind}): cannot be opened: {type(exc).__name__}: {exc}")
        return found
    if found["tasks"] == 0:
        problems.append(f"source ({src.kind}{': ' + str(where) if where is not None else ''}): no tasks")
    return found


def _text(r: dict[str, Any]) -> list[str]:
    lines = [f"{r['spec']}: " + (f"pipeline {r['pipeline']!r}: fields valid" if r["pipeline"] else "not valid")]
    if r["pipeline"] is None:
        return lines
    if r.get("steps"):
        lines.append(f"steps: {len(r['steps'])} (" + ", ".join(
            f"{st['name']} {st['kind']}" + (f" after {'+'.join(st['after'])}" if st["after"] else "")
            + (" gated" if st["gate"] else "") for st in r["steps"]) + ")")
    lines.append(f"stages: {len(r['stages'])} imported ("
                 + ", ".join(s["fn"] + (f" with {s['factory']}" if s["factory"] else "") for s in r["stages"]) + ")")
    src = r["source"]
    if src is not None:
        k = src["tasks"]
        n = "tasks unknown" if k is None else {"total": f"{k:,} tasks", "enumerated": f"{k:,} tasks (counted)",
                                              "at least": f"at least {k:,} tasks (stopped counting)"}[src["counted"]]
        lines.append(f"source: {src['kind']}" + (f" {src['where']}" if src["where"] else "") + f": {n}")
    ex = r["executor"]
    if ex is None or ex["kind"] == "local":
        lines.append("executor: local (lanes in this process)")
    else:
        lines.extend(_ray_text(ex))
    lines.append("ok: ready to run" if r["ok"] else f"not ready: {len(r['problems'])} problem(s)")
    return lines


def _ray_text(ex: dict[str, Any]) -> list[str]:
    where = ex["address"] or ("the Ray of this process" if ex["joined"] else "a local Ray started for the run")
    lines = [f"executor: ray at {where}" + (f", joined in {ex['join_s']:.1f} s" if ex["joined"] else "")]
    if ex.get("note"):
        lines.append(f"  {ex['note']}")
    for n in ex["nodes"]:
        custom = ", ".join(f"{k} {v:g}" for k, v in sorted(n["resources"].items())
                           if not k.startswith(("node:", "accelerator_type")) and k not in _RAY_OWN)
        lines.append(f"  node {n['ip']}: {'alive' if n['alive'] else 'dead'}, {n['CPU']:g} CPU, {n['GPU']:g} GPU"
                     + (f", {custom}" if custom else ""))
    if ex["joined"]:
        asks = ", ".join(f"{v:g} {k}" for k, v in ex["asks"].items()) or "nothing"
        has = ", ".join(f"{v:g} {k}" for k, v in ex["cluster"].items())
        holds = "any number of" if ex["holds"] is None else f"{ex['holds']}"
        each = resource_amounts(ex["per_worker"])
        lines.append(f"  asks: {ex['workers']} actors x ({each}) = {asks}; the cluster has "
                     f"{has or 'them'}: it holds {holds} actors: {'fits' if ex['fits'] else 'does NOT fit'}")
    if ex["data_mode"] is not None:
        lines.append(f"  data: {ex['data_mode']}: {ex['data_why']}")
    if ex.get("remote_nodes"):
        lines.append(f"  nodes on other hosts ({', '.join(ex['remote_nodes'])}): run it with a broker they reach: "
                     f"{ex['plane_fix']}")
    return lines
