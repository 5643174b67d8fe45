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
