"""The ready queue and the batcher: admitted tasks grouped into uniform batches.

The decision this module protects: a batch holds tasks of one batching key only (same kind,
shape, dtype), like a warp with every lane on the same instruction; how many keys compete in the
queue when a batch is formed is reported as divergence k. Retries go first, and a failed batch's
tasks may be retried one per batch so a single bad input cannot fail its neighbours twice.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

import numpy as np

from warpdeck.engine.state.batches import Batch, BatchKey, TaskInput

__all__ = ["ReadyQueue"]


class ReadyQueue:
    """Admitted tasks by batching key, oldest key first; retries ahead of everything."""

    def __init__(self, batch_size: int, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self._clock = clock
        self._groups: OrderedDict[BatchKey, deque[tuple[int, TaskInput, float]]] = OrderedDict()
        self._retry: deque[tuple[int, TaskInput, bool]] = deque()
        self._n = 0
        self._ids = itertools.count()
        self.max_divergence = 0

    def __len__(self) -> int:
        return self._n

    @property
    def divergence(self) -> int:
        """Distinct batching keys waiting now."""
        if not self._retry:
            return len(self._groups)
        return len(self._groups.keys() | {item.batch_key for _, item, _ in self._retry})

    def put(self, idx: int, item: TaskInput) -> None:
        """Queue an admitted task behind others of its key."""
        g = self._groups.get(item.batch_key)
        if g is None:
            g = self._groups[item.batch_key] = deque()
        g.append((idx, item, self._clock()))
        self._n += 1

    def put_many(self, rows: Iterable[int], items: Iterable[TaskInput]) -> None:
        """Queue admitted tasks, in order, each behind others of its key: ``put`` for each, with one
        clock reading for them all (they were admitted together) and the key looked up only where
        it changes (a source yields runs of one key: hashing it per task was a fifth of the loop's
        time at batch 256)."""
        now = self._clock()
        groups = self._groups
        last: BatchKey | None = None
        g: deque[tuple[int, TaskInput, float]] | None = None
        n = 0
        for idx, item in zip(rows, items, strict=True):
            key = item.batch_key
            if key is not last or g is None:
                g = groups.get(key)
                if g is None:
                    g = groups[key] = deque()
                last = key
            g.append((idx, item, now))
            n += 1
        self._n += n

    def put_retry(self, idx: int, item: TaskInput, isolate: bool) -> None:
        """Queue a task's new attempt at the front; ``isolate`` runs it in a batch of its own."""
        self._retry.append((idx, item, isolate))
        self._n += 1

    def pending(self) -> list[int]:
        """Every waiting task's row (retries first)."""
        out = [i for i, _, _ in self._retry]
        for g in self._groups.values():
            out.extend(i for i, _, _ in g)
        return out

    def remove(self, rows: Iterable[int]) -> int:
        """Drop these rows (cancelled); returns how many were waiting."""
        drop = set(rows)
        before = self._n
        self._retry = deque(e for e in self._retry if e[0] not in drop)
        for key in list(self._groups):
            g = deque(e for e in self._groups[key] if e[0] not in drop)
            if g:
                self._groups[key] = g
            else:
                del self._groups[key]
        self._n = len(self._retry) + sum(len(g) for g in self._groups.values())
        return before - self._n

    def next_due(self) -> float | None:
        """When the oldest partial batch becomes due (None if nothing waits)."""
        if self._retry:
            return self._clock()
        if not self._groups:
            return None
        return min(g[0][2] for g in self._groups.values()) + self.timeout_s

    def take(self, flush: bool = False) -> Batch | None:
        """The next batch to run, or None if no batch is due yet.

        Due means: a retry is waiting; a key has a full batch; a key's oldest task has waited
        ``timeout_s``; or ``flush`` (the source is exhausted, so no more tasks will come).
        """
        now = self._clock()
        div = self.divergence
        self.max_divergence = max(self.max_divergence, div)
        if self._retry:
            return self._take_retry(now, div)
        chosen: BatchKey | None = None
        for key, g in self._groups.items():  # oldest key first
            if len(g) >= self.batch_size:
                chosen = key
                break
        if chosen is None:
            for key, g in self._groups.items():
                if flush or now - g[0][2] >= self.timeout_s:
                    chosen = key
                    break
        if chosen is None:
            return None
        g = self._groups[chosen]
        n = min(self.batch_size, len(g))
        taken = [g.popleft() for _ in range(n)]
        if not g:
            del self._groups[chosen]
        else:
            self._groups.move_to_end(chosen)  # round-robin between keys: no key starves
        self._n -= n
        return Batch(next(self._ids), chosen, np.fromiter((t[0] for t in taken), np.int64, n),
                     [t[1] for t in taken], now, div)

    def _take_retry(self, now: float, div: int) -> Batch:
        first = self._retry.popleft()
        taken = [first]
        if not first[2]:
            while self._retry and len(taken) < self.batch_size and not self._retry[0][2] \
                    and self._retry[0][1].batch_key == first[1].batch_key:
                taken.append(self._retry.popleft())
        self._n -= len(taken)
        return Batch(next(self._ids), first[1].batch_key,
                     np.fromiter((t[0] for t in taken), np.int64, len(taken)),
                     [t[1] for t in taken], now, div, retry=True)
