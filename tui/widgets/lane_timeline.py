"""Per-lane timeline: the last seconds of fill, h2d, compute, d2h and sink as bars.

The decision this module protects: overlap is the product's point, so the timeline draws what each
phase of each lane was doing in each slice of time (a cell's height is the busy fraction of its
slice), and a slice in which a phase did nothing is drawn as an idle dot, so gaps stand out.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot

__all__ = ["ZOOMS", "LaneTimeline", "coverage"]

PHASES = ("fill", "h2d", "compute", "d2h", "sink")
#: Window lengths in seconds, shortest first.
ZOOMS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_LEVELS = " ▁▂▃▄▅▆▇█"
_LABEL = 10


def coverage(snap: EngineSnapshot, lanes: int, start: float, end: float, cells: int) -> npt.NDArray[np.float64]:
    """Busy fraction per (lane, phase, cell) over [start, end] on the engine's clock."""
    cov = np.zeros((lanes, len(PHASES), cells))
    span = end - start
    if cells <= 0 or span <= 0:
        return cov
    scale = cells / span
    for rec in snap.timeline:
        if rec.lane >= lanes:
            continue
        for p, (a, b) in enumerate(rec.phases):
            if b <= a or b <= start or a >= end:
                continue
            _paint(cov[rec.lane, p], (max(a, start) - start) * scale, (min(b, end) - start) * scale)
    return np.minimum(cov, 1.0, out=cov)


def _paint(row: npt.NDArray[np.float64], a: float, b: float) -> None:
    """Add the interval [a, b) (in cells) to ``row``: whole cells get 1, the ends their fraction."""
    i, j = int(a), int(b)
    if i == j:
        row[min(i, len(row) - 1)] += b - a
        return
    row[i] += (i + 1) - a
    row[i + 1:j] += 1.0
    if j < len(row):
        row[j] += b - j


class LaneTimeline(Widget):
    """Lanes as stacked rows of phase bars over a sliding (or frozen) window."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"lane-timeline--idle", "lane-timeline--head",
                                             *(f"lane-timeline--{p}" for p in PHASES)}

    DEFAULT_CSS = """
    LaneTimeline { height: 1fr; padding: 0 1; }
    LaneTimeline > .lane-timeline--idle { color: $wd-idle; }
    LaneTimeline > .lane-timeline--head { text-style: bold; }
    LaneTimeline > .lane-timeline--fill { color: $wd-fill; }
    LaneTimeline > .lane-timeline--h2d { color: $wd-h2d; }
    LaneTimeline > .lane-timeline--compute { color: $wd-compute; }
    LaneTimeline > .lane-timeline--d2h { color: $wd-d2h; }
    LaneTimeline > .lane-timeline--sink { color: $wd-sink; }
    """

    zoom: reactive[int] = reactive(3)
    """Index into ZOOMS: the window's length."""
    follow: reactive[bool] = reactive(True)
    """Slide with the newest snapshot; off freezes the window where it is."""

    def __init__(self) -> None:
        super().__init__(id="lane-timeline")
        self._snap: EngineSnapshot | None = None
        self._frozen_end: float | None = None

    def validate_zoom(self, value: int) -> int:
        return max(0, min(value, len(ZOOMS) - 1))

    def watch_follow(self, follow: bool) -> None:
        self._frozen_end = None if follow or self._snap is None else self._snap.t0 + self._snap.t
        self.refresh()

    def watch_zoom(self) -> None:
        self.refresh()

    def show(self, snap: EngineSnapshot) -> None:
        """Draw from this snapshot (while following; a frozen window keeps its time span)."""
        self._snap = snap
        self.refresh()

    @property
    def window_s(self) -> float:
        return ZOOMS[self.zoom]

    def render(self) -> Text:
        snap = self._snap
        out = Text(no_wrap=True, overflow="crop")
        if snap is None:
            return out.append("waiting for the engine…")
        end = self._frozen_end if self._frozen_end is not None else snap.t0 + snap.t
        start = end - self.window_s
        cells = max(1, self.size.width - _LABEL - 2)
        cov = coverage(snap, len(snap.lanes), start, end, cells)
        f = snap.figures
        head = self.get_component_rich_style("lane-timeline--head")
        out.append(f"overlap efficiency {f.overlap_efficiency:.2f} of the bound", head)
        out.append(f"  (bound {f.bound_tasks_s:,.0f} tasks/s, steady {f.steady_tasks_s:,.0f} tasks/s, "
                   f"no overlap {f.serial_bound_tasks_s:,.0f})\n")
        mode = "following" if self._frozen_end is None else "frozen (f follows)"
        out.append(f"window {self.window_s:g} s · {mode} · [ ] zoom\n\n")
        idle = self.get_component_rich_style("lane-timeline--idle")
        for lane in snap.lanes:
            occ = f.occupancy.get(lane.id, {})
            out.append(f"lane {lane.id}", head)
            out.append(f"  depth {lane.depth} · {lane.status} · {lane.batches_done:,} batches · compute busy "
                       f"{occ.get('compute', 0.0) * 100:.0f}%\n")
            for p, phase in enumerate(PHASES):
                style = self.get_component_rich_style(f"lane-timeline--{phase}")
                out.append(f"  {phase:<{_LABEL - 2}}", style)
                row = cov[lane.id, p] if lane.id < len(cov) else np.zeros(cells)
                for value in row.tolist():
                    if value < 0.02:
                        out.append("·", idle)
                    else:
                        out.append(_LEVELS[max(1, min(8, round(value * 8)))], style)
                out.append("\n")
        left = f"-{self.window_s:g}s"
        out.append(" " * _LABEL + left + " " * max(1, cells - len(left) - 3) + "now")
        return out
