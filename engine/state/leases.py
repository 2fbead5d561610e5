"""Leases and fencing: which worker, under which epoch, holds each batch in flight.

The decisions this module protects:
- A batch is leased to one worker under that worker's epoch at the moment it is handed out.
- When the monitor convicts a worker's epoch, every batch leased under it (or an older epoch) is
  *fenced*: the dispatcher requeues its tasks at once, and whatever that batch later reports (a phase,
  a result, a failure) is ignored and counted, so a worker that comes back from the dead can neither
  commit a result twice nor disturb the tasks' new attempts.
- A convicted worker gets no new batch until it is re-born with a newer epoch.

Pure bookkeeping on the engine's event loop: no I/O, no locks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from warpdeck.engine.state.batches import Batch

__all__ = ["Lease", "LeaseBook"]


@dataclass(frozen=True, slots=True)
class Lease:
    worker: str
    epoch: int
    batch: Batch


class LeaseBook:
    """Leases of the batches in flight, the fenced ones, and the convicted epochs per worker."""

    def __init__(self, epoch_of: Callable[[str], int]) -> None:
        self._epoch_of = epoch_of
        self._leases: dict[int, Lease] = {}
        self._fenced: set[int] = set()
        self._convicted: dict[str, int] = {}
        """Worker → its newest convicted epoch."""
        self.rejected = 0
        """Results (or failures) that arrived from fenced batches and were rejected."""
        self.reclaimed = 0
        """Batches taken back from convicted workers."""

    def current_epoch(self, worker: str) -> int:
        """The epoch ``worker`` lives in now (its births so far)."""
        return self._epoch_of(worker)

    def lease(self, batch: Batch, worker: str) -> None:
        self._leases[batch.id] = Lease(worker, self._epoch_of(worker), batch)

    def epoch(self, batch: Batch) -> int | None:
        """The epoch ``batch`` is leased under (None: not leased now)."""
        lease = self._leases.get(batch.id)
        return None if lease is None else lease.epoch

    def release(self, batch: Batch) -> None:
        """The batch ended normally (its result or failure counted)."""
        self._leases.pop(batch.id, None)

    def fenced(self, batch: Batch) -> bool:
        return batch.id in self._fenced

    def reject(self, batch: Batch) -> None:
        """A fenced batch reported its end: count it and forget it."""
        if batch.id in self._fenced:
            self._fenced.discard(batch.id)
            self.rejected += 1

    def held(self, worker: str) -> bool:
        """True while ``worker``'s current epoch is convicted (it must be re-born to work again)."""
        convicted = self._convicted.get(worker)
        return convicted is not None and convicted >= self._epoch_of(worker)

    def convict(self, worker: str, epoch: int) -> list[Lease]:
        """Fence every batch ``worker`` holds under ``epoch`` or older; return their leases."""
        self._convicted[worker] = max(epoch, self._convicted.get(worker, epoch))
        lost = [lease for lease in self._leases.values() if lease.worker == worker and lease.epoch <= epoch]
        for lease in lost:
            del self._leases[lease.batch.id]
            self._fenced.add(lease.batch.id)
        self.reclaimed += len(lost)
        return lost

    def leased_to(self, worker: str) -> list[int]:
        return [bid for bid, lease in self._leases.items() if lease.worker == worker]
