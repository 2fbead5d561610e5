"""Every MQTT topic string of a pipeline, built here and nowhere else (DESIGN.md section 5).

```
warpdeck/<pipeline>/engine/state          retained; Last Will "offline"
warpdeck/<pipeline>/worker/<id>/birth     retained; epoch, host, pid, device, lanes, version
warpdeck/<pipeline>/worker/<id>/hb        seq, epoch, progress, lanes busy, leases, device stats
warpdeck/<pipeline>/worker/<id>/death     Last Will and graceful; carries the epoch
warpdeck/<pipeline>/telemetry             snapshot summary, at most 4 Hz
warpdeck/<pipeline>/events                task failed, worker lost, stall began or ended
warpdeck/<pipeline>/cmd                   commands, HMAC-SHA256 signed
```

Names are checked, so that a pipeline or worker id can never smuggle a ``/``, ``+`` or ``#`` into a
topic and subscribe to, or publish on, another pipeline's tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ROOT", "Topics", "WorkerTopic", "check_name"]

ROOT = "warpdeck"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")  # fullmatch: "$" would let a trailing newline in
WorkerTopic = Literal["birth", "hb", "death"]
_WORKER_TOPICS: frozenset[str] = frozenset(("birth", "hb", "death"))


def check_name(what: str, name: str) -> str:
    """Return ``name`` if it is usable as one topic level; raise ``ValueError`` naming ``what``."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"{what} {name!r} cannot be an MQTT topic level: use letters, digits and _ . : - "
            "(at most 128, starting with a letter or digit)"
        )
    return name


@dataclass(frozen=True, slots=True)
class Topics:
    """The topic tree of one pipeline."""

    pipeline: str
    _worker_prefix: str = field(init=False, repr=False, compare=False)
    """``parse_worker`` runs on every message the monitor reads: its prefix is built once."""

    def __post_init__(self) -> None:
        check_name("pipeline name", self.pipeline)
        object.__setattr__(self, "_worker_prefix", f"{ROOT}/{self.pipeline}/worker/")

    @property
    def base(self) -> str:
        return f"{ROOT}/{self.pipeline}"

    @property
    def engine_state(self) -> str:
        return f"{self.base}/engine/state"

    @property
    def telemetry(self) -> str:
        return f"{self.base}/telemetry"

    @property
    def events(self) -> str:
        return f"{self.base}/events"

    @property
    def cmd(self) -> str:
        return f"{self.base}/cmd"

    def every_worker(self, which: WorkerTopic) -> str:
        """Subscription filter for one kind of message from every worker (``"hb"``: heartbeats)."""
        return f"{self.base}/worker/+/{which}"

    def worker(self, worker_id: str, which: WorkerTopic) -> str:
        return f"{self.base}/worker/{check_name('worker id', worker_id)}/{which}"

    def parse_worker(self, topic: str) -> tuple[str, WorkerTopic] | None:
        """``(worker id, "birth" | "hb" | "death")`` for one of this pipeline's worker topics."""
        prefix = self._worker_prefix
        if not topic.startswith(prefix):
            return None
        wid, sep, which = topic[len(prefix) :].partition("/")
        if not sep or which not in _WORKER_TOPICS or not _NAME.fullmatch(wid):
            return None
        return wid, which  # type: ignore[return-value]  # checked against _WORKER_TOPICS
