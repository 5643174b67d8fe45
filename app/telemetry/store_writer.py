"""Write telemetry samples to the SQLite run store, decimated for long runs.

:class:`StoreWriter` is a sampler subscriber. Per series it keeps full rate at first,
then averages into buckets that grow with the run's length (:data:`DEFAULT_SCHEDULE`:
full rate for 10 min, 1 s buckets to 1 h, 5 s to 6 h, 30 s after — a 72 h run at 4 Hz
stores ≈ 18k points per series instead of ≈ 1M). A bucket is written as one row at the
time of its last sample with the mean of its values (so integrals such as energy are
kept); ``throttle_reasons`` is OR-ed, ``up`` keeps its minimum and ``lost`` its maximum
(so an event inside a bucket is never averaged away). A NaN gap is written at once as
a NULL value. Rows reach :meth:`RunStore.add_samples` from the writer's own thread, so
a slow disk never blocks a sampler; at most ``max_pending`` rows wait (older ones are
dropped and counted in ``dropped``).
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Any

from app.telemetry.series import Sample

log = logging.getLogger(__name__)

#: (run seconds up to which it applies, bucket seconds; 0 = every sample)
DEFAULT_SCHEDULE: tuple[tuple[float, float], ...] = ((600.0, 0.0), (3600.0, 1.0), (6 * 3600.0, 5.0), (math.inf, 30.0))

_AGG = {"throttle_reasons": "or", "up": "min", "lost": "max"}


class _Bucket:
    __slots__ = ("end", "total", "n", "acc", "last_t", "how")

    def __init__(self, end: float, how: str) -> None:
        self.end, self.total, self.n, self.acc, self.last_t, self.how = end, 0.0, 0, None, 0.0, how

    def add(self, t: float, v: float) -> None:
        self.last_t = t
        self.n += 1
        if self.how == "or":
            self.acc = int(v) if self.acc is None else (self.acc | int(v))
        elif self.how == "min":
            self.acc = v if self.acc is None else min(self.acc, v)
        elif self.how == "max":
            self.acc = v if self.acc is None else max(self.acc, v)
        else:
            self.total += v

    def value(self) -> float:
        return float(self.acc) if self.how != "mean" else self.total / self.n


class StoreWriter:
    """Subscriber that writes samples of run ``run_id`` into ``store`` (a RunStore).

    ``schedule``: see :data:`DEFAULT_SCHEDULE`; times are seconds since the first sample.
    ``flush_interval``: seconds between hand-overs to the store. Call :meth:`close` at
    the end of the run (writes open buckets and pending rows).
    """

    def __init__(self, store: Any, run_id: int, *, schedule: tuple[tuple[float, float], ...] = DEFAULT_SCHEDULE,
                 flush_interval: float = 1.0, max_pending: int = 200_000, thread: bool = True) -> None:
        self.store = store
        self.run_id = run_id
        self.schedule = schedule
        self.max_pending = max_pending
        self.flush_interval = flush_interval
        self.dropped = 0
        self.rows_written = 0
        self._t0: float | None = None
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._pending: list[tuple[float, str, str, float | None]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = None
        if thread:
            self._thread = threading.Thread(target=self._loop, name="dyno-telemetry-writer", daemon=True)
            self._thread.start()

    def period_at(self, elapsed: float) -> float:
        """Bucket length (s) for a sample ``elapsed`` seconds into the run."""
        for until, period in self.schedule:
            if elapsed < until:
                return period
        return self.schedule[-1][1]

    def __call__(self, samples: list[Sample]) -> None:
        if not samples:
            return
        rows: list[tuple[float, str, str, float | None]] = []
        buckets = self._buckets
        with self._lock:
            if self._t0 is None:
                self._t0 = samples[0].t
            period = self.period_at(samples[0].t - self._t0)  # one round: one period
            for t, source, name, v in samples:
                if period <= 0 and v == v and not buckets:
                    rows.append((t, source, name, v))
                    continue
                key = (source, name)
                b = buckets.get(key)
                if b is not None and t >= b.end:
                    rows.append((b.last_t, source, name, b.value()))
                    del buckets[key]
                    b = None
                if v != v:  # NaN: a gap, written at once
                    if b is not None:
                        rows.append((b.last_t, source, name, b.value()))
                        del buckets[key]
                    rows.append((t, source, name, None))
                    continue
                if period <= 0:
                    rows.append((t, source, name, v))
                    continue
                if b is None:
                    b = buckets[key] = _Bucket((t // period + 1) * period, _AGG.get(name, "mean"))
                b.add(t, v)
            if rows:
                self._pending.extend(rows)
                over = len(self._pending) - self.max_pending
                if over > 0:
                    del self._pending[:over]
                    self.dropped += over

    def flush(self) -> None:
        """Hand pending rows to the store now."""
        with self._lock:
            rows, self._pending = self._pending, []
        if rows:
            try:
                self.store.add_samples(self.run_id, rows)
                self.rows_written += len(rows)
            except Exception:
                log.exception("telemetry: %d samples could not be written to the run store", len(rows))

    def _loop(self) -> None:
        while not self._closed.wait(self.flush_interval):
            self.flush()

    def close(self) -> None:
        """Write open buckets and pending rows, stop the writer thread (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            for (source, name), b in self._buckets.items():
                self._pending.append((b.last_t, source, name, b.value()))
            self._buckets.clear()
        self.flush()
