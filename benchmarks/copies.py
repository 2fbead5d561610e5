"""Copies: host bytes written per input byte between the source and the device, warpdeck against a
DataLoader with ``pin_memory=True`` (issue 31: "one copy from the source into the slot, where the
DataLoader makes three").

Counted, not timed, so the figure does not depend on the machine's load. Every runner loads the same
items the same way: ``load(i, row)`` fills one item's row with its index, and each load counts the
bytes it wrote. The rest of each pipeline is wrapped where it writes input bytes on the host:

  warpdeck     an ``items`` source (the user's ``load``), NumPy backend, fill on threads and, second
               row, in 2 worker processes. The backend's ``h2d`` is wrapped: it counts the bytes it
               reads and checks, on threads, that they are the very rows the loads wrote (the slot's
               pinned input: no staging copy in between). In processes the rows are written into the
               slot's shared memory, which h2d reads (tests/engine/test_fill_processes.py).
  dataloader   ``DataLoader(dataset, batch_size=B, num_workers=2, pin_memory=True)``: ``__getitem__``
               loads one item into a fresh array (counted), ``collate_fn`` is ``default_collate``
               wrapped to count the batch it builds (in a worker it builds it in shared memory, so
               the hand-over to the main process copies nothing more; checked with ``is_shared``),
               and the pin thread's ``pin_memory`` is wrapped to count what it copies into pinned memory.

Copies per input byte = host bytes written / input bytes. The copy to the device itself is not
counted (a DMA on a GPU; on the NumPy backend it stands for one). Counts from worker processes come
back through a file each process appends to (``O_APPEND`` lines: atomic).

    python benchmarks/copies.py [--items N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import print_table, verdict, write_json

from warpdeck.engine.api import Engine, parse_spec
from warpdeck.engine.backends.numpy_backend import NumpyBackend

SHAPE = (3, 64, 64)
BATCH = 32
_LEDGER = "WD_COPIES_LEDGER"
"""Where each process appends ``what bytes`` lines (set in the environment, inherited by workers)."""
_ROWS: dict[int, int] = {}
"""Threads mode only: the data address of each row a load wrote, per item index."""


def _count(what: str, nbytes: int) -> None:
    with Path(os.environ[_LEDGER]).open("a", encoding="ascii") as f:
        f.write(f"{what} {nbytes}\n")


def _ledger(path: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    for line in path.read_text(encoding="ascii").splitlines():
        what, n = line.rsplit(" ", 1)
        totals[what] = totals.get(what, 0) + int(n)
    return totals


# -- the one load every runner uses -------------------------------------------------------------------
def items(count: int) -> Iterator[tuple[str, int]]:
    """The items source's list: ``count`` items, the handle its index."""
    for i in range(count):
        yield f"i{i:08d}", i


def load(i: int, row: np.ndarray) -> None:
    """Write item ``i`` into ``row`` (its index, everywhere) and count the bytes written."""
    row[...] = i
    _ROWS[i] = row.__array_interface__["data"][0]
    _count("load", row.nbytes)


# -- warpdeck ------------------------------------------------------------------------------------------
class _WatchedBackend(NumpyBackend):
    """NumPy, with h2d counting what it reads and where from."""

    def __init__(self) -> None:
        super().__init__("requested")
        self.sources: list[tuple[int, int, int]] = []  # (address, rows, first item) per batch

    def h2d(self, streams: Any, dst: Any, src: np.ndarray, deps: Sequence[Any]) -> Any:
        first = int(src.reshape(len(src), -1)[0, 0]) if len(src) else -1  # a row holds its item's index
        self.sources.append((src.__array_interface__["data"][0], len(src), first))
        _count("h2d read", src.nbytes)
        return super().h2d(streams, dst, src, deps)


def run_warpdeck(count: int, processes: bool, ledger: Path) -> dict[str, Any]:
    # The engine imports this file as ``copies`` (the spec names ``copies:load``); run as a script it
    # is also ``__main__``, with rows of its own: read the ones the engine's loads wrote.
    import copies as engines  # noqa: PLC0415

    ledger.write_text("")
    engines._ROWS.clear()
    host: dict[str, Any] = {"fill_pool": "processes", "fill_workers": 2} if processes else {"fill_pool": "threads"}
    spec = parse_spec({
        "name": "bench-copies", "backend": "numpy", "batch_size": BATCH,
        "source": {"kind": "items", "items": "copies:items", "load": "copies:load", "shape": list(SHAPE),
                   "dtype": "float32", "options": {"count": count}},
        "sink": {"kind": "null"}, "stages": [{"fn": "_stages:noop"}], "host": host})
    backend = _WatchedBackend()

    async def go() -> Any:
        async with Engine(spec, journal=False, backend=backend) as eng:
            return await eng.wait()

    report = asyncio.run(go())
    if report.counts.done != count:
        raise RuntimeError(f"warpdeck did not finish: {report.counts}")
    totals = _ledger(ledger)
    staged = None
    if not processes:  # every h2d read the rows the loads wrote, in place
        staged = sum(1 for addr, _n, first in backend.sources if engines._ROWS.get(first) != addr)
    return {"totals": totals, "batches_read_elsewhere": staged}


# -- the DataLoader -----------------------------------------------------------------------------------
def run_dataloader(count: int, ledger: Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - optional: the DataLoader's row is skipped without it
    from torch.utils.data import DataLoader, Dataset  # noqa: PLC0415
    from torch.utils.data import _utils as dl_utils  # noqa: PLC0415

    ledger.write_text("")

    class Items(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return count

        def __getitem__(self, i: int) -> torch.Tensor:
            row = np.empty(SHAPE, np.float32)
            load(i, row)
            return torch.from_numpy(row)

    pin = dl_utils.pin_memory.pin_memory
    unshared = [0]

    def counting_pin(data: Any, device: Any = None) -> Any:
        if isinstance(data, torch.Tensor):
            _count("pin", data.nbytes)
            if not data.is_shared():
                unshared[0] += 1
        return pin(data, device)

    dl_utils.pin_memory.pin_memory = counting_pin
    try:
        loader = DataLoader(Items(), batch_size=BATCH, num_workers=2, pin_memory=True, collate_fn=_collate)
        n = sum(len(b) for b in loader)
    finally:
        dl_utils.pin_memory.pin_memory = pin
    if n != count:
        raise RuntimeError(f"the DataLoader gave {n} items of {count}")
    return {"totals": _ledger(ledger), "batches_not_in_shared_memory": unshared[0]}


def _collate(batch: list[Any]) -> Any:
    from torch.utils.data._utils.collate import default_collate  # noqa: PLC0415

    out = default_collate(batch)
    _count("collate", out.nbytes)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=2048, help="items per runner (default 2048)")
    ap.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = ap.parse_args(argv)
    count = args.items
    item_bytes = int(np.prod(SHAPE)) * 4
    input_bytes = count * item_bytes
    with tempfile.TemporaryDirectory(prefix="wd-copies-") as tmp:
        ledger = Path(tmp) / "ledger"
        os.environ[_LEDGER] = str(ledger)
        results: dict[str, Any] = {"items": count, "item_bytes": item_bytes, "batch": BATCH,
                                   "warpdeck_threads": run_warpdeck(count, False, ledger),
                                   "warpdeck_processes": run_warpdeck(count, True, ledger)}
        try:
            results["dataloader"] = run_dataloader(count, ledger)
        except ImportError:
            results["dataloader"] = None
    rows: list[list[Any]] = []

    def per_byte(totals: dict[str, int], *what: str) -> float:
        return sum(totals.get(w, 0) for w in what) / input_bytes

    for name, key in (("warpdeck, fill on threads", "warpdeck_threads"),
                      ("warpdeck, fill in 2 processes", "warpdeck_processes")):
        t = results[key]["totals"]
        copies = per_byte(t, "load")
        extra = results[key]["batches_read_elsewhere"]
        how = "h2d reads the rows the loads wrote" if extra == 0 else (
            "rows written into the slot's shared memory" if extra is None else f"{extra} batches copied first")
        ok = copies <= 1.0 + 1e-9 and per_byte(t, "h2d read") == 1.0 and extra in (0, None)
        rows.append([name, f"{copies:.2f}", "1 (load)", how, "<= 1", verdict(ok)])
    dl = results["dataloader"]
    if dl is not None:
        t = dl["totals"]
        copies = per_byte(t, "load", "collate", "pin")
        pin = f"{per_byte(t, 'pin'):.0f} (pin)" if "pin" in t else "no pin: torch pins only with a device"
        parts = f"{per_byte(t, 'load'):.0f} (load) + {per_byte(t, 'collate'):.0f} (collate) + {pin}"
        note = ("collated in shared memory, no copy to hand it over" if dl["batches_not_in_shared_memory"] == 0
                else f"{dl['batches_not_in_shared_memory']} batches copied into shared memory too")
        rows.append(["DataLoader, 2 workers, pin_memory=True", f"{copies:.2f}", parts, note, "-", verdict(None)])
    print_table(f"copies: {count} items of {item_bytes:,} bytes (float32 {SHAPE}), batches of {BATCH}; host bytes "
                "written per input byte, source to device (the device copy not counted)",
                ["runner", "copies/byte", "of which", "checked", "target", "result"], rows,
                right=[False, True, False, False, False, False])
    write_json(args.json, "copies", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
