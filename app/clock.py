"""The session clock: one monotonic time base shared by every record.

All timestamps in the app are ``time.monotonic()`` seconds; a :class:`SessionClock`
also remembers the wall-clock time of its start so stored runs can be placed in
calendar time. Plots and tables use ``clock.rel(t)`` = seconds since session start.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SessionClock:
    """Monotonic origin (seconds, ``time.monotonic()``) and the wall time (Unix s) it maps to."""

    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)

    def now(self) -> float:
        """Seconds since the session started (monotonic)."""
        return time.monotonic() - self.t0

    def rel(self, t_monotonic: float) -> float:
        """Convert a raw ``time.monotonic()`` value to seconds since session start."""
        return t_monotonic - self.t0

    def wall(self, t_monotonic: float) -> float:
        """Convert a raw ``time.monotonic()`` value to Unix wall time (s)."""
        return self.wall0 + (t_monotonic - self.t0)


def clock_text(s: float) -> str:
    """Seconds as a clock reads them: ``m:ss`` (``17:05``), from an hour ``h:mm:ss``
    (``1:02:03``); negative values as 0. The tune's progress line and the Live tab's
    time axis, which never turns to "ks" (issue 37)."""
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


#: tick steps of a time axis, s: seconds, then minutes, then hours as a clock divides them
CLOCK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def clock_ticks(lo: float, hi: float, most: int = 8) -> tuple[float, list[float]]:
    """``(step, values)``: ticks of a time axis from ``lo`` to ``hi`` (s) at the smallest
    step of :data:`CLOCK_STEPS` that gives at most ``most`` of them (the largest step
    beyond); values are multiples of the step, within [lo, hi]."""
    lo, hi = min(lo, hi), max(lo, hi)
    span = max(hi - lo, 1e-9)
    step = next((float(x) for x in CLOCK_STEPS if span / x <= most), float(CLOCK_STEPS[-1]))
    first = step * -(-lo // step)
    n = int((hi - first) // step) + 1 if hi >= first else 0
    return step, [first + i * step for i in range(n)]
