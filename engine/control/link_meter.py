"""How an attached control room's link to its engine is doing: bytes and frames a second, lag,
frames lost, silence.

The decisions this module protects:
- The link is measured where it ends, by the attached client, from what arrives: each frame's
  size on the wire, its arrival, the engine's send time (``Telemetry.sent``) and its frame number.
  The meter is pure and takes its clocks as arguments, so tests drive it without waiting.
- Lag is the arrival time less the send time, two machines' clocks: it includes their
  difference (a few milliseconds under NTP; seconds without it). So the meter also gives
  ``behind_s``: the lag above the least lag of the last minute, which no constant clock
  difference changes. It is what a link that cannot keep up shows first (frames queue in the
  broker and the network and arrive ever later), while a steady lag is the link's own.
- A link that has gone quiet says so: the snapshot an attached room draws carries the meter's
  view (``EngineSnapshot.link``), and the client tells it again while nothing arrives, so the
  silence grows on screen instead of the last good figures standing still.
"""

from __future__ import annotations

from collections import deque

from warpdeck.engine.state.part_views import LinkView

__all__ = ["LinkMeter", "LinkView"]


class LinkMeter:
    """Counts the frames of one link: ``on_frame`` as each arrives, ``view`` for what to show.
    Rates are over the last ``window_s`` seconds; ``behind_s`` against the least lag of ``floor_s``."""

    def __init__(self, window_s: float = 5.0, floor_s: float = 60.0) -> None:
        self.window_s = window_s
        self.floor_s = floor_s
        self._arrivals: deque[tuple[float, int]] = deque()  # (monotonic, bytes)
        self._lags: deque[tuple[float, float]] = deque()  # (monotonic, lag), lags increasing: the least first
        self._frame: int | None = None
        self._lag: float | None = None
        self._at: float | None = None
        self.frames = 0
        self.lost = 0
        self.refused = ""

    def on_frame(self, nbytes: int, sent: float, frame: int, mono: float, wall: float) -> None:
        """A frame of ``nbytes`` on the wire arrived at ``mono`` (``wall``: this machine's Unix
        time), sent at ``sent`` (the engine's) as its plane's ``frame``-th."""
        self.frames += 1
        self._arrivals.append((mono, nbytes))
        if self._frame is not None and frame > self._frame + 1:
            self.lost += frame - self._frame - 1
        self._frame = frame  # a number that goes back: the engine's plane started again
        lag = wall - sent
        while self._lags and self._lags[-1][1] >= lag:
            self._lags.pop()
        self._lags.append((mono, lag))
        self._lag, self._at = lag, mono
        self._forget(mono)

    def on_refused(self, reason: str) -> None:
        """A telemetry payload was refused (``WireError``'s reason and detail)."""
        self.refused = reason

    def _forget(self, mono: float) -> None:
        while self._arrivals and mono - self._arrivals[0][0] > self.window_s:
            self._arrivals.popleft()
        while len(self._lags) > 1 and mono - self._lags[0][0] > self.floor_s:
            self._lags.popleft()

    def view(self, mono: float, connected: bool) -> LinkView:
        """The link as of ``mono``. It changes nothing, so any thread may ask while frames arrive
        (``tuple()`` copies a deque in one step: it holds the GIL)."""
        arrivals = [a for a in tuple(self._arrivals) if mono - a[0] <= self.window_s]
        span = mono - arrivals[0][0] if arrivals else 0.0
        # Over the span from the oldest arrival kept to now: a link that goes quiet decays to zero.
        frames_s = (len(arrivals) - 1) / span if len(arrivals) > 1 and span > 0 else 0.0
        bytes_s = sum(b for _, b in arrivals[1:]) / span if len(arrivals) > 1 and span > 0 else 0.0
        lag, least = self._lag, min((v for _, v in tuple(self._lags)), default=None)
        behind = max(0.0, lag - least) if lag is not None and least is not None else 0.0
        silent = mono - self._at if self._at is not None else None
        return LinkView(connected, bytes_s, frames_s, lag, behind, silent, self.lost, self.refused)
