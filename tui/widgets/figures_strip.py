"""The figures strip at the foot of every screen: throughput, occupancy, stalls, overlap, Amdahl.

The sparkline is the only history the UI keeps: the recent rate of each snapshot it has seen,
because a rate over time is what tells a stall from a steady state at a glance.
"""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot
from warpdeck.tui.glyphs import STALL_BADGES

__all__ = ["FiguresStrip", "sparkline"]

_BARS = " ▁▂▃▄▅▆▇█"
_PHASES = ("fill", "h2d", "compute", "d2h", "sink")


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
    FiguresStrip { height: 2; background: $panel; color: $foreground; padding: 0 1; text-wrap: nowrap;
                   text-overflow: ellipsis; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._snap: EngineSnapshot | None = None
        self._rates: deque[float] = deque(maxlen=120)
        self._last_seq = -1
        self.paced = False
        """True: a new snapshot is only recorded; the screen says when to repaint (``refresh``)."""

    def on_mount(self) -> None:
        self.watch(self.app, "snapshot", self._update, init=True)

    def _update(self, snap: EngineSnapshot | None) -> None:
        if snap is None or snap.seq == self._last_seq:
            return
        self._last_seq = snap.seq
        self._snap = snap
        self._rates.append(snap.figures.recent_tasks_s)
        if not self.paced:
            self.refresh()

    def render(self) -> Text:
        snap = self._snap
        if snap is None:
            return Text("no figures yet")
        f = snap.figures
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append(sparkline(list(self._rates), 24), "bold")
        out.append(f" {f.recent_tasks_s:,.0f} tasks/s", "bold")
        out.append(f" ({_bytes(f.throughput_bytes_s)}/s)  p50 {_ms(f.latency_p50_s)} p99 {_ms(f.latency_p99_s)}  │ ")
        out.append("overlap ")
        out.append(f"{f.overlap_efficiency:.2f}", "bold")
        out.append(f" of bound {f.bound_tasks_s:,.0f}/s  │ ")
        if f.batches:
            amdahl = ", ".join(f"{k.removeprefix('p=').replace('inf', '∞')} → ×{v:.2f}" for k, v in f.amdahl.items())
            out.append(f"more lanes: at most {amdahl}")
        else:
            out.append("more lanes: — (no batch done yet)")
        out.append("\n")
        out.append("occupancy ")
        occ = f.occupancy
        for phase in _PHASES:
            vals = [lane.get(phase, 0.0) for lane in occ.values()]
            mean = sum(vals) / len(vals) if vals else 0.0
            out.append(f"{phase} {mean * 100:3.0f}% ")
        out.append(" │ stalled ")
        c = snap.counts
        for reason, badge in STALL_BADGES.items():
            out.append(f"{badge.glyph}{badge.label} {c.stalled.get(reason, 0):,} ")
        stall_s = sum(f.stall_s.values())
        out.append(f"({stall_s:,.1f}s lane-wait)  │ divergence {f.divergence}")
        return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}ms" if seconds < 10 else f"{seconds:,.1f}s"


def _bytes(rate: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if rate < 1024:
            return f"{rate:,.0f} {unit}"
        rate /= 1024
    return f"{rate:,.1f} TB"
