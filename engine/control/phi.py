"""The phi-accrual failure detector (Hayashibara et al., 2004), one per worker.

The decision this module protects: a worker is suspected in proportion to how unusual its current
silence is *for that worker*, not after one fixed timeout for everyone. phi is the confidence, in
powers of ten, that the next heartbeat is not coming: phi 8 means the silence would be this long
once in 10^8 if the worker were alive. The learned distribution is a normal one over a bounded
window of inter-arrival intervals, with a floor under its standard deviation (a metronome-steady
worker would otherwise be convicted after a few milliseconds of jitter) and an acceptable-pause
margin added to its mean (to forgive a garbage-collector pause or a broker hiccup).

The normal CDF uses the logistic approximation that Akka and Cassandra use,
``F(y) = 1 / (1 + exp(-y (1.5976 + 0.070566 y^2)))``, so ``phi = -log10(1 - F(y))`` is
``softplus(z) / ln 10`` with ``z = y (1.5976 + 0.070566 y^2)``: finite and exact for any silence,
with no overflow and no log of zero. The code is pure and clock-injected: callers pass ``now``
(seconds from ``time.monotonic``). A heartbeat costs O(1): running sums over the window, and the
window's mean and standard deviation are worked out once per change of the window, not on every
question (a monitor asks for phi and a silence budget of every worker several times a second).
"""

from __future__ import annotations

import functools
import math
from collections import deque

__all__ = ["PhiAccrual", "phi_of_sigmas", "sigmas_for_phi"]

_A = 0.070566
_B = 1.5976
_LN10 = math.log(10.0)
# phi at 50 standard deviations is ~3 900; clamping there keeps y**3 finite for any input.
_MAX_SIGMAS = 50.0


def phi_of_sigmas(y: float) -> float:
    """phi for a silence ``y`` standard deviations past the expected arrival (y may be negative)."""
    # Comparisons rather than min/max/abs calls: this runs for every worker a monitor shows.
    if y > _MAX_SIGMAS:
        y = _MAX_SIGMAS
    elif y < -_MAX_SIGMAS:
        y = -_MAX_SIGMAS
    z = y * (_B + _A * y * y)
    # softplus(z) = log(1 + e^z), written so that neither branch can overflow.
    if z > 0.0:
        return (z + math.log1p(math.exp(-z))) / _LN10
    return math.log1p(math.exp(z)) / _LN10


@functools.lru_cache(maxsize=64)
def sigmas_for_phi(phi: float) -> float:
    """The inverse of ``phi_of_sigmas``: how many standard deviations of silence reach ``phi``.

    Callers turn a threshold into a deadline once per heartbeat (``PhiAccrual.silence_for``), so
    a periodic check compares a time instead of evaluating phi for every worker.
    """
    if phi <= 0:
        raise ValueError(f"phi must be positive (got {phi})")
    s = phi * _LN10
    # Inverse softplus: z = log(e^s - 1), in the form that stays finite for large s.
    z = s + math.log(-math.expm1(-s))
    # The one real root of A y^3 + B y - z = 0 (A, B > 0), by Cardano's formula.
    q = z / (2.0 * _A)
    p = _B / (3.0 * _A)
    root = math.sqrt(q * q + p * p * p)
    return math.cbrt(q + root) + math.cbrt(q - root)


class PhiAccrual:
    """One worker's detector: a window of heartbeat intervals and phi for any silence.

    Until ``min_samples`` intervals are known, the expected interval is ``interval_s`` with a
    standard deviation of ``max(min_std_s, interval_s / 4)``; a freshly born worker is judged by
    its promise rather than by one or two samples.
    """

    __slots__ = (
        "_evictions",
        "_expect",
        "_intervals",
        "_mean",
        "_std",
        "_sum",
        "_sumsq",
        "acceptable_pause_s",
        "interval_s",
        "last_arrival",
        "min_samples",
        "min_std_s",
    )

    def __init__(
        self,
        interval_s: float = 0.5,
        min_std_s: float = 0.1,
        acceptable_pause_s: float = 0.0,
        window: int = 200,
        min_samples: int = 3,
    ) -> None:
        if interval_s <= 0 or min_std_s <= 0:
            raise ValueError(f"interval_s and min_std_s must be positive (got {interval_s}, {min_std_s})")
        if acceptable_pause_s < 0:
            raise ValueError(f"acceptable_pause_s must not be negative (got {acceptable_pause_s})")
        if not 1 <= min_samples <= window:
            raise ValueError(f"need 1 <= min_samples <= window (got {min_samples}, {window})")
        self.interval_s = interval_s
        self.min_std_s = min_std_s
        self.acceptable_pause_s = acceptable_pause_s
        self.min_samples = min_samples
        self.last_arrival: float | None = None
        """When the last heartbeat arrived; None before the first."""
        self._intervals: deque[float] = deque(maxlen=window)
        self._sum = 0.0
        self._sumsq = 0.0
        self._evictions = 0
        self._mean = self._std = self._expect = 0.0
        """``mean_std()``, and the mean plus the acceptable pause: worked out when the window changes."""
        self._refresh()

    @property
    def samples(self) -> int:
        """Intervals in the window."""
        return len(self._intervals)

    def reset(self) -> None:
        """Forget everything: a new epoch of the worker is a new process with its own rhythm."""
        self.last_arrival = None
        self._intervals.clear()
        self._sum = self._sumsq = 0.0
        self._evictions = 0
        self._refresh()

    def heartbeat(self, now: float, *, sample: bool = True) -> None:
        """Record a heartbeat at ``now``. ``sample=False`` restarts the clock without learning the
        interval (it spans a time the caller could not hear, such as its own disconnection)."""
        last = self.last_arrival
        self.last_arrival = now
        if not sample or last is None:
            return
        interval = now - last if now > last else 0.0
        window = self._intervals
        if len(window) == window.maxlen:
            old = window[0]
            self._sum -= old
            self._sumsq -= old * old
            self._evictions += 1
        window.append(interval)
        self._sum += interval
        self._sumsq += interval * interval
        if self._evictions >= len(window):
            # Running sums drift by rounding; re-add them once per window turnover (amortised O(1)).
            self._sum = math.fsum(window)
            self._sumsq = math.fsum(x * x for x in window)
            self._evictions = 0
        self._refresh()

    def _refresh(self) -> None:
        n = len(self._intervals)
        if n < self.min_samples:
            mean, std = self.interval_s, max(self.min_std_s, self.interval_s / 4.0)
        else:
            mean = self._sum / n
            var = self._sumsq / n - mean * mean
            std = math.sqrt(var) if var > 0.0 else 0.0
            std = max(std, self.min_std_s)
        self._mean, self._std, self._expect = mean, std, mean + self.acceptable_pause_s

    def mean_std(self) -> tuple[float, float]:
        """The expected interval (without the acceptable pause) and its floored standard deviation."""
        return self._mean, self._std

    def phi_after(self, silence_s: float) -> float:
        """phi for ``silence_s`` seconds since the last heartbeat."""
        return phi_of_sigmas((silence_s - self._expect) / self._std)

    def phi(self, now: float) -> float:
        """phi at ``now``; 0.0 before the first heartbeat (nothing is expected yet)."""
        if self.last_arrival is None:
            return 0.0
        return self.phi_after(now - self.last_arrival)

    def silence_for(self, phi: float) -> float:
        """Seconds of silence after which phi reaches ``phi``, under the current window."""
        return self._expect + sigmas_for_phi(phi) * self._std
