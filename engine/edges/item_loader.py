"""An items source's loading (``load`` per item, ``load_batch`` per batch), one object for fill
threads and fill worker processes.

The decisions this module protects:
- A user may load a whole batch in one call (``load_batch(handles, out)``) where that is cheaper:
  one vectorised decode, one read or one request for n items instead of n. What it cannot change is
  that one bad item fails alone where it can: it says so per item (a returned entry), and a batch
  function that raises is followed by ``load`` item by item when the spec gives one, so only the bad
  item fails. Without ``load`` each item of the batch fails with what was raised, its traceback
  kept, and the retry policy's isolation (one task per batch) sorts the good items from the bad.
- A batch function that answers for a different number of items than it was given fails every item
  of the batch, saying so: no item is taken as loaded on an answer that cannot be matched to it.
- One object (``ItemLoader``) loads on a fill thread and in a fill worker process: it pickles as
  references to the user's functions, so a worker runs the very loading a thread runs, and a worker
  given a loader with ``load_batch`` calls it for the batch instead of looping over rows
  (engine/backends/process_pool.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BatchLoad", "ItemLoad", "ItemLoader"]

ItemLoad = Callable[[Any, npt.NDArray[Any]], None]
"""A spec's ``load``: ``load(handle, row)`` writes one item's input into ``row`` in place."""
BatchLoad = Callable[[Sequence[Any], npt.NDArray[Any]], Any]
"""A spec's ``load_batch``: ``load_batch(handles, out)`` writes item j's input into ``out[j]`` in place; None when every
item loaded, else one entry per item (None or the exception it failed with)."""


@dataclass(frozen=True)
class ItemLoader:
    """Loads an items source's handles into rows: by ``batch`` where given (``item`` the fallback
    when it raises), else by ``item``, one row at a time. Picklable when both are module-level
    functions; the process pool refuses one whose functions live in ``__main__``."""

    item: ItemLoad | None
    """The spec's ``load``; None when it gives only ``load_batch``."""
    batch: BatchLoad | None
    """The spec's ``load_batch``; None when it gives only ``load``."""

    def __post_init__(self) -> None:
        if self.item is None and self.batch is None:
            raise ValueError("an item loader needs load or load_batch")

    def __call__(self, handle: Any, row: npt.NDArray[Any]) -> None:
        """Load one item into ``row``; raises what it failed with."""
        if self.item is not None:
            self.item(handle, row)
            return
        failed = self.load_batch([handle], row[np.newaxis])[0]
        if failed is not None:
            raise failed

    def load_batch(self, handles: Sequence[Any], out: npt.NDArray[Any]) -> list[BaseException | None]:
        """Load ``handles[j]`` into ``out[j]`` (``out`` has exactly ``len(handles)`` rows); each
        item's error or None. Runs on a fill thread or in a fill worker process."""
        if self.batch is None:
            return self._each(handles, out)
        n = len(handles)
        try:
            said = self.batch(handles, out)
        except Exception as exc:  # noqa: BLE001 - the batch's items, one by one or all with it
            return self._each(handles, out) if self.item is not None else [exc] * n
        if said is None:
            return [None] * n
        if not isinstance(said, Sequence) or isinstance(said, str | bytes):
            wrong: BaseException = TypeError(
                f"load_batch returned a {type(said).__name__}: it returns None when every item loaded, or a "
                f"sequence of one entry per item (None or the exception that item failed with)")
            return [wrong] * n
        if len(said) != n:
            wrong = ValueError(f"load_batch returned {len(said)} entries for a batch of {n} items: it returns None, "
                               f"or one entry per item (None or the exception that item failed with)")
            return [wrong] * n
        return [e if e is None or isinstance(e, BaseException) else
                TypeError(f"load_batch returned {e!r:.60} for item {j}: an entry is None or the exception that "
                          f"item failed with")
                for j, e in enumerate(said)]

    def _each(self, handles: Sequence[Any], out: npt.NDArray[Any]) -> list[BaseException | None]:
        """``item`` for each handle into its row: each item fails alone."""
        assert self.item is not None
        errors: list[BaseException | None] = []
        for j, handle in enumerate(handles):
            try:
                self.item(handle, out[j])
                errors.append(None)
            except Exception as exc:  # noqa: BLE001 - reported per item
                errors.append(exc)
        return errors
