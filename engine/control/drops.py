"""Messages dropped at the socket, counted by reason (``invalid``, ``oversized``, ``version``…).

The decision this module protects: a malformed or hostile message is counted and dropped, never
raised; the counts are read from other threads (snapshots, telemetry, the report), so a read is a
copy and the last reason is kept whole for the one line an operator sees.
"""

from __future__ import annotations

from collections import Counter

from warpdeck.engine.control.wire import WireError

__all__ = ["DropCounter"]


class DropCounter:
    """Counts dropped messages by reason; cheap to read from another thread (a copy is returned)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self.last: str = ""

    def drop(self, err: WireError | str, detail: str = "") -> None:
        reason = err.reason if isinstance(err, WireError) else err
        self._counts[reason] += 1
        self.last = str(err) if isinstance(err, WireError) else f"{reason}: {detail}"

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    @property
    def total(self) -> int:
        return sum(self._counts.values())
