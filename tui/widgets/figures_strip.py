"""The figures strip at the foot of every screen: throughput, occupancy, stalls, overlap, Amdahl.

The sparkline is the only history the UI keeps: the recent rate of each snapshot it has seen,
because a rate over time is what tells a stall from a steady state at a glance.

The strip is never cut mid-figure: each line is a row of parts, and a line wider than the
terminal drops whole parts, least important first, and ends with where they are shown in full
(``… 3 timeline``). The rate says what the run is doing: a paused run's rate is labelled so, and
a run that has ended shows its average (done over elapsed time), not its last instant.
"""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot, more_lanes_words
from warpdeck.tui.app_access import warpdeck_app
from warpdeck.tui.fit import Part, fit_parts
from warpdeck.tui.glyphs import STALL_BADGES

__all__ = ["FiguresStrip", "sparkline"]

_BARS = " ▁▂▃▄▅▆▇█"
_PHASES = ("fill", "h2d", "compute", "d2h", "sink")
_GAP = "  "
_TIMELINE = "3 timeline"
"""Where the figures this strip drops for want of room are shown in full."""


def sparkline(values: list[float], width: int) -> str:
    """The last ``width`` values as block characters scaled to their maximum."""
    tail = values[-width:]
    top = max(tail, default=0.0)
    if top <= 0:
        return " " * len(tail)
    return "".join(_BARS[min(8, round(v / top * 8))] for v in tail)


class FiguresStrip(Widget):
    """Two lines of figures from the current snapshot."""

    DEFAULT_CSS = """
    FiguresStrip { height: 2; background: $panel; color: $foreground; padding: 0 1; text-wrap: nowrap; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._snap: EngineSnapshot | None = None
        self._rates: deque[float] = deque(maxlen=120)
        self._last_seq = -1
        self.paced = False
        """True: a new snapshot is only recorded; the screen says which to show, and when (``show``)."""
        self._shown: EngineSnapshot | None = None

    def on_mount(self) -> None:
        self.watch(warpdeck_app(self), "snapshot", self._update, init=True)

    def _update(self, snap: EngineSnapshot | None) -> None:
        if snap is None or snap.seq == self._last_seq:
            return
        self._last_seq = snap.seq
        self._snap = snap
        self._rates.append(snap.figures.recent_tasks_s)
        if not self.paced:
            self.refresh()

    def show(self, snap: EngineSnapshot) -> None:
        """Paced: show ``snap`` (the one the screen's other parts show) from the next repaint."""
        self._shown = snap
        self.refresh()

    def render(self) -> Text:
        snap = self._shown if self.paced else self._snap
        if snap is None:
            return Text("no figures yet")
        width = self.size.width or 1_000
        out = Text(no_wrap=True, overflow="crop")
        for i, parts in enumerate((self._rates_line(snap), self._work_line(snap))):
            kept, note = fit_parts(parts, width, len(_GAP))
            if i:
                out.append("\n")
            out.append_text(Text(_GAP).join(p.item for p in kept))
            if note:
                out.append(_GAP + note, "italic")
        return out

    def _rates_line(self, snap: EngineSnapshot) -> list[Part[Text]]:
        """Throughput (its history, the rate now, or the average of a run that ended), latency,
        overlap, and what more lanes could give."""
        f = snap.figures
        per_task = f.throughput_bytes_s / f.throughput_tasks_s if f.throughput_tasks_s > 0 else 0.0
        rate = Text()
        if snap.finished or snap.status == "stopped":
            # The last few seconds of a run that has ended say nothing about it: its average does.
            avg = snap.counts.done / snap.t if snap.t > 0 else 0.0
            rate.append(f"avg {avg:,.0f} tasks/s", "bold")
            rate.append(f" ({_bytes(avg * per_task)}/s)")
        else:
            if snap.feeder.state == "paused":
                rate.append("⏸ paused ", "bold")
            rate.append(f"{f.recent_tasks_s:,.0f} tasks/s", "bold")
            # The bytes of the same tasks, not the run's average: a paused run moves no bytes.
            rate.append(f" ({_bytes(f.recent_tasks_s * per_task)}/s)")
        busy = Text("│ device busy ")
        busy.append(f"{f.device_busy:.0%}", "bold")
        if f.bottleneck_phase and f.bottleneck_phase != "compute":
            busy.append(f" · {f.bottleneck_phase}-bound")
        overlap = Text("│ overlap ")
        overlap.append(f"{f.overlap_efficiency:.2f}", "bold")
        overlap.append(f" of bound {f.bound_tasks_s:,.0f}/s")
        lanes = Text(f"│ {more_lanes_words(f.amdahl if f.batches else {}, f.lanes_limit)}")
        return [_part(Text(sparkline(list(self._rates), 24), "bold"), 3), _part(rate, 0),
                _part(busy, 1),
                _part(Text(f"p50 {_ms(f.latency_p50_s)} p99 {_ms(f.latency_p99_s)}"), 2, _TIMELINE),
                _part(overlap, 4, _TIMELINE), _part(lanes, 5, _TIMELINE)]

    def _work_line(self, snap: EngineSnapshot) -> list[Part[Text]]:
        """Stalled tasks by reason, how busy each phase is, the time lanes waited, divergence."""
        f, c = snap.figures, snap.counts
        stalled = Text("stalled")
        # Only the reasons there are: the line has room for little else.
        present = [(badge, c.stalled[reason]) for reason, badge in STALL_BADGES.items() if c.stalled.get(reason)]
        for badge, n in present:
            stalled.append(f" {badge.glyph}{badge.label} {n:,}")
        if not present:
            stalled.append(" 0")
        occupancy = Text("│ occupancy")
        occ = f.occupancy
        for phase in _PHASES:
            vals = [lane.get(phase, 0.0) for lane in occ.values()]
            occupancy.append(f" {phase} {sum(vals) / len(vals) * 100 if vals else 0.0:.0f}%")
        stall_s = sum(f.stall_s.values())
        return [_part(stalled, 0), _part(occupancy, 2, _TIMELINE),
                _part(Text(f"│ lane-wait {stall_s:,.1f}s"), 3, _TIMELINE),
                _part(Text(f"│ divergence {f.divergence}"), 4, _TIMELINE)]


def _part(text: Text, rank: int, where: str = "") -> Part[Text]:
    return Part(text, text.cell_len, rank, where)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}ms" if seconds < 10 else f"{seconds:,.1f}s"


def _bytes(rate: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if rate < 1024:
            return f"{rate:,.0f} {unit}"
        rate /= 1024
    return f"{rate:,.1f} TB"
