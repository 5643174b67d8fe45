"""Samples and the bounded in-memory time series that live plots read.

A :class:`Sample` is one reading ``(t, source, name, value)``: ``t`` in seconds on the
session clock (:class:`app.clock.SessionClock`), ``source`` such as ``'gpu0'``,
``'host'``, ``'server'`` or ``'metrics'``, ``name`` such as ``'power_w'``, and
``value`` a float. ``NaN`` marks a gap (e.g. ``/metrics`` unreachable); a field that a
card does not report produces no sample at all (the latest reading says why).

:class:`RingBuffer` holds one series in two preallocated numpy arrays; a
:class:`SeriesBank` holds many, keyed by ``(source, name)``, and is itself a sampler
subscriber. Memory is bounded by ``capacity × max_series × 16`` bytes.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Callable, Iterable, NamedTuple

import numpy as np

log = logging.getLogger(__name__)

GAP = math.nan


class Sample(NamedTuple):
    """One telemetry value: ``t`` session-clock seconds, ``value`` float (NaN = gap)."""

    t: float
    source: str
    name: str
    value: float


#: a subscriber receives every sample of one sampling round as one list
Subscriber = Callable[[list[Sample]], None]


def publish(subscribers: Iterable[Subscriber], samples: list[Sample]) -> None:
    """Hand ``samples`` to every subscriber; a failing subscriber is logged, never raised."""
    for cb in list(subscribers):
        try:
            cb(samples)
        except Exception:  # a plot or store must not stop a sampler
            log.exception("telemetry subscriber %r failed", cb)


class RingBuffer:
    """A bounded series of ``(t, value)`` float64 pairs; the oldest point is overwritten.

    ``capacity``: number of points (≥ 2). Not thread-safe on its own (see SeriesBank).
    """

    __slots__ = ("capacity", "_t", "_v", "_n", "_i")

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"RingBuffer capacity must be at least 2, got {capacity}")
        self.capacity = int(capacity)
        self._t = np.empty(self.capacity, dtype=np.float64)
        self._v = np.empty(self.capacity, dtype=np.float64)
        self._n = 0  # points held
        self._i = 0  # next write position

    def __len__(self) -> int:
        return self._n

    def append(self, t: float, v: float) -> None:
        """Add one point (t in seconds); overwrites the oldest when full."""
        i = self._i
        self._t[i] = t
        self._v[i] = v
        self._i = (i + 1) % self.capacity
        if self._n < self.capacity:
            self._n += 1

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the held points in time order: ``(t, values)``, each shape ``(len,)``."""
        if self._n < self.capacity:
            return self._t[: self._n].copy(), self._v[: self._n].copy()
        i = self._i
        return np.concatenate((self._t[i:], self._t[:i])), np.concatenate((self._v[i:], self._v[:i]))

    def last(self) -> tuple[float, float] | None:
        """The newest ``(t, value)``, or None when empty."""
        if not self._n:
            return None
        j = (self._i - 1) % self.capacity
        return float(self._t[j]), float(self._v[j])


class SeriesBank:
    """Ring buffers keyed by ``(source, name)``; call it with a list of samples.

    ``capacity``: points per series (default 16,384 ≈ 68 min at 4 Hz). ``max_series``:
    series beyond this are dropped (logged once) so memory stays bounded. Thread-safe.
    """

    def __init__(self, capacity: int = 16384, max_series: int = 1024) -> None:
        self.capacity = capacity
        self.max_series = max_series
        self._series: dict[tuple[str, str], RingBuffer] = {}
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, samples: list[Sample]) -> None:
        with self._lock:
            series = self._series
            for t, source, name, value in samples:
                buf = series.get((source, name))
                if buf is None:
                    if len(series) >= self.max_series:
                        if not self._warned:
                            log.warning("telemetry: more than %d series; further series are not kept", self.max_series)
                            self._warned = True
                        continue
                    buf = series[(source, name)] = RingBuffer(self.capacity)
                buf.append(t, value)

    def keys(self) -> list[tuple[str, str]]:
        """The ``(source, name)`` pairs held, sorted."""
        with self._lock:
            return sorted(self._series)

    def get(self, source: str, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(t, values)`` arrays of one series (empty arrays when unknown)."""
        with self._lock:
            buf = self._series.get((source, name))
            if buf is None:
                return np.empty(0), np.empty(0)
            return buf.view()

    def last(self, source: str, name: str) -> tuple[float, float] | None:
        """Newest ``(t, value)`` of one series, or None."""
        with self._lock:
            buf = self._series.get((source, name))
            return None if buf is None else buf.last()

    def nbytes(self) -> int:
        """Bytes held by the buffers' arrays."""
        with self._lock:
            return sum(b._t.nbytes + b._v.nbytes for b in self._series.values())
