"""Where a run is written out while it runs: a trace file (``--trace``), a metrics endpoint (``--metrics``).

The decisions this module protects:
- Exporters are listeners: they hear the run's events and snapshots on the engine's loop and never
  change the run. One that fails is dropped (engine/state/run_events.py) and the run goes on; a
  failure to start one (a port taken, a path not writable) is a usage error before anything runs.
- Every front end (headless, the control room, a library user) wires them the same way, through
  ``exporting``; the trace and metrics libraries load only when asked for.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from warpdeck.engine.state.run_events import RunEvent, RunEvents
from warpdeck.engine.state.snapshot import EngineSnapshot, SnapshotPublisher

__all__ = ["ExportSettings", "Exporter", "Exports", "exporting", "parse_metrics_address"]

log = logging.getLogger(__name__)

_MAX_PORT = 65535


class Exporter(Protocol):
    def on_event(self, event: RunEvent) -> None: ...
    def on_snapshot(self, snap: EngineSnapshot) -> None: ...
    def close(self, last: EngineSnapshot | None) -> None: ...


@dataclass(frozen=True, slots=True)
class ExportSettings:
    """What to write out: a Trace Event Format file, an OpenMetrics endpoint (host, port; port 0
    takes a free one)."""

    trace: Path | None = None
    metrics: tuple[str, int] | None = None


def parse_metrics_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6; ``:9400`` for every interface) as (host, port);
    ``ValueError`` says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= _MAX_PORT:
        raise ValueError(f"--metrics {text!r}: give HOST:PORT, e.g. 127.0.0.1:9400 (PORT 0..65535; 0: a free one)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


@dataclass(slots=True)
class Exports:
    """The exporters of one run, as started (``metrics_url`` where an endpoint serves)."""

    exporters: list[Exporter]
    metrics_url: str | None = None
    trace: Path | None = None


@contextlib.contextmanager
def exporting(settings: ExportSettings | None, events: RunEvents, publisher: SnapshotPublisher,
              pipeline: str) -> Iterator[Exports]:
    """Start the exporters ``settings`` asks for, subscribed to ``events`` and ``publisher``; at the
    end, unsubscribe them and close each with the last snapshot. Raises ``OSError`` (a path or a
    port refused) before anything is subscribed."""
    exports = Exports([])
    if settings is not None and settings.trace is not None:
        from warpdeck.engine.edges.trace_export import TraceWriter  # noqa: PLC0415 - loads only when asked

        exports.exporters.append(TraceWriter(settings.trace, pipeline))
        exports.trace = settings.trace
    if settings is not None and settings.metrics is not None:
        from warpdeck.engine.edges.metrics_export import MetricsExporter  # noqa: PLC0415

        try:
            metrics = MetricsExporter(*settings.metrics, pipeline=pipeline)
        except BaseException:
            for x in exports.exporters:
                x.close(None)
            raise
        exports.exporters.append(metrics)
        exports.metrics_url = metrics.url
    unsubscribe: list[Callable[[], None]] = []
    for x in exports.exporters:
        unsubscribe += [events.subscribe(x.on_event), publisher.subscribe(x.on_snapshot)]
    try:
        yield exports
    finally:
        for off in unsubscribe:
            off()
        for x in exports.exporters:
            try:
                x.close(publisher.latest)
            except Exception:
                log.exception("an exporter failed as it closed")
