"""Per-lane timeline: the last seconds of fill, h2d, compute, d2h and sink as bars.

The decision this module protects: overlap is the product's point, so the timeline draws what each
phase of each lane was doing in each slice of time (a cell's height is the busy fraction of its
slice), and a slice in which a phase did nothing is drawn as an idle dot, so gaps stand out.

While following, every snapshot moves every cell, so the whole timeline is redrawn ten times a
second: its lines are built as strips (the Line API), straight from segments, once per snapshot,
never through rich Text and its per-span layout.

The timeline is where the figures strip sends the reader for the figures it has no room for
(overlap and its bound, what more lanes could give, latency, lane-wait, divergence, how busy each
phase is): so it shows all of them, and a header line too wide for the terminal drops whole
figures, least important first, and ends in ``…``, never in half a figure.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt
from rich.segment import Segment
from rich.style import Style
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from warpdeck.engine.api import EngineSnapshot, more_lanes_words
from warpdeck.tui.fit import Part, fit_parts

__all__ = ["ZOOMS", "LaneTimeline", "coverage"]

PHASES = ("fill", "h2d", "compute", "d2h", "sink")
ZOOMS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Window lengths in seconds, shortest first."""
_LEVELS = " ▁▂▃▄▅▆▇█"
_GLYPHS = np.array(list("·" + _LEVELS[1:]))  # 0: idle, 1..8: busy eighths
_LABEL = 15  # "  compute  86% ": the phase and how busy it was over the run
_SEP = " · "


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
        self._built: tuple[object, list[Strip]] = (None, [])
        self._styles: dict[str, Style] = {}

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._built = (None, [])

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

    def render_line(self, y: int) -> Strip:
        lines = self._lines()
        return lines[y] if y < len(lines) else Strip.blank(self.size.width, self.rich_style)

    def _lines(self) -> list[Strip]:
        """Every line, built once per snapshot, size, zoom and style."""
        key = (id(self._snap), self._frozen_end, self.zoom, self.size.width)
        if self._built[0] != key:
            self._built = (key, self._build())
        return self._built[1]

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.rich_style if not name else self.get_component_rich_style(name)
        return style

    def _build(self) -> list[Strip]:
        snap, width, base = self._snap, self.size.width, self._style("")
        lines: list[list[Segment]] = []
        if snap is None:
            lines.append([Segment("waiting for the engine…", base)])
            return [Strip(line).adjust_cell_length(width, base) for line in lines]
        end = self._frozen_end if self._frozen_end is not None else snap.t0 + snap.t
        start = end - self.window_s
        cells = max(1, width - _LABEL - 2)
        cov = coverage(snap, len(snap.lanes), start, end, cells)
        f = snap.figures
        head, idle = self._style("lane-timeline--head"), self._style("lane-timeline--idle")
        if f.bottleneck:  # two lines of whole clauses: what holds the device back, and what to do
            what, _, advice = f.bottleneck.partition("; ")
            busy, _, advice = advice.rpartition("; ") if advice.count("; ") else ("", "", advice)
            lines.append(_fit([([Segment(what, head)], 0)]
                              + ([([Segment(busy, base)], 1)] if busy else []), width, base))
            lines.append(_fit([([Segment(part.strip(), base)], i) for i, part in enumerate(advice.split(": "))],
                              width, base))
        lines.append(_fit([
            ([Segment(f"device busy {f.device_busy:.0%}", head)], 0),
            ([Segment(f"overlap efficiency {f.overlap_efficiency:.2f} of the bound", base)], 0),
            ([Segment(f"bound {f.bound_tasks_s:,.0f} tasks/s", base)], 1),
            ([Segment(f"steady {f.steady_tasks_s:,.0f} tasks/s", base)], 2),
            ([Segment(f"no overlap {f.serial_bound_tasks_s:,.0f} tasks/s", base)], 3)], width, base))
        lines.append(_fit([
            ([Segment(more_lanes_words(f.amdahl if f.batches else {}, f.lanes_limit), base)], 0),
            ([Segment(f"latency p50 {_ms(f.latency_p50_s)} p99 {_ms(f.latency_p99_s)}", base)], 1),
            ([Segment(f"lane-wait {sum(f.stall_s.values()):,.1f}s", base)], 2),
            ([Segment(f"divergence {f.divergence} (most {f.max_divergence})", base)], 3)], width, base))
        mode = "following" if self._frozen_end is None else "frozen (f follows)"
        lines.append([Segment(f"window {self.window_s:g} s · {mode} · [ ] zoom", base)])
        lines.append([])
        for lane in snap.lanes:
            occ = f.occupancy.get(lane.id, {})
            # " proc": the phase runs in worker processes ([host] fill_pool, sink_pool)
            pools = (f"fill ×{lane.fill_workers}{' proc' if lane.fill_processes else ''} "
                     f"sink ×{lane.sink_workers}{' proc' if lane.sink_processes else ''}")
            lines.append(_fit([([Segment(f"lane {lane.id}", head)], 0), ([Segment(lane.status, base)], 0),
                               ([Segment(f"depth {lane.depth}", base)], 1),
                               ([Segment(pools, base)], 1),
                               ([Segment(f"{lane.batches_done:,} batches", base)], 2)], width, base))
            for p, phase in enumerate(PHASES):
                style = self._style(f"lane-timeline--{phase}")
                row = cov[lane.id, p] if lane.id < len(cov) else np.zeros(cells)
                label = f"  {phase:<8}{occ.get(phase, 0.0) * 100:3.0f}% "
                lines.append([Segment(label, style), *_bar(row, style, idle)])
        left = f"-{self.window_s:g}s"
        lines.append([Segment(" " * _LABEL + left + " " * max(1, cells - len(left) - 3) + "now", base)])
        return [Strip(line).adjust_cell_length(width, base) for line in lines]


def _fit(parts: list[tuple[list[Segment], int]], width: int, base: Style) -> list[Segment]:
    """One header line from ``(segments, rank)`` parts: those that fit ``width`` cells, in
    order, `` · `` between them, and ``…`` if some did not."""
    sized = [Part(segments, sum(seg.cell_length for seg in segments), rank) for segments, rank in parts]
    kept, note = fit_parts(sized, width, len(_SEP))
    out: list[Segment] = []
    for i, part in enumerate(kept):
        if i:
            out.append(Segment(_SEP, base))
        out.extend(part.item)
    if note:
        out.append(Segment(_SEP + note, base))
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}ms" if seconds < 10 else f"{seconds:,.1f}s"


def _bar(row: npt.NDArray[np.float64], busy: Style, idle: Style) -> list[Segment]:
    """A cell each: an idle dot, or the busy fraction in eighths. (One segment a cell, not a run:
    an exported SVG places each segment's glyphs by the font's widths, and block glyphs are not
    all one cell wide in every font.)"""
    level = np.where(row < 0.02, 0, np.clip(np.rint(row * 8), 1, 8)).astype(np.intp)
    return [Segment(glyph, busy if n else idle) for glyph, n in zip(_GLYPHS[level].tolist(), level.tolist(),
                                                                     strict=True)]
