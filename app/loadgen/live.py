"""Client-side live series for the dashboard, built from the load generator's records.

The load generator hands record batches to :meth:`ClientSeries.add` on its reader
thread; the dashboard's redraw timer reads :meth:`ClientSeries.snapshot` on the GUI
thread. Nothing here emits a Qt signal per request.

- Output throughput: output chunks binned by arrival time into ``bin_s`` bins (session
  clock s), each chunk weighted by its request's output tokens ÷ chunks (as
  app.loadgen.stats does), ÷ ``bin_s`` → tokens/s. Only complete bins are shown.
  ``tps_mean``: the trailing mean over ``smooth_s`` (the last ``smooth_s ÷ bin_s`` bins;
  fewer at the start) — streamed chunks arrive in bursts, so single bins swing between
  0 and twice the rate; the plot names the window.
- Latency: TTFT and TPOT of successful requests grouped by completion time into
  ``window_s`` windows; p50/p99 per window (``numpy.percentile``, linear, as vllm bench).
- Concurrency: the ramp's level starts as a step series.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from app.loadgen.records import RequestRecord


@dataclass
class Snapshot:
    """Arrays for plotting; times in session-clock s, throughput tok/s, latencies s."""

    tps_t: np.ndarray
    tps: np.ndarray
    lat_t: np.ndarray
    ttft_p50: np.ndarray
    ttft_p99: np.ndarray
    tpot_p50: np.ndarray
    tpot_p99: np.ndarray
    level_edges: np.ndarray  # len(levels) + 1 (stepMode="center")
    levels: np.ndarray
    n_records: int = 0
    n_failed: int = 0
    boundaries: list[tuple[float, float]] = field(default_factory=list)  # (t, level)
    tps_mean: np.ndarray = field(default_factory=lambda: np.zeros(0))  # trailing mean of tps over smooth_s


#: the throughput bin and the trailing mean over it, s (the Live tab's legend names both)
BIN_S = 2.0
SMOOTH_S = 10.0


class ClientSeries:
    """Thread-safe accumulator; ``bin_s`` throughput bin, ``window_s`` latency window (s)."""

    def __init__(self, bin_s: float = BIN_S, window_s: float = 2.0, lag_s: float = 0.5, smooth_s: float = SMOOTH_S) -> None:
        self.bin_s, self.window_s, self.lag_s, self.smooth_s = bin_s, window_s, lag_s, smooth_s
        self.time_scale = 1.0  # sim k: throughput ÷ k and latencies × k (rig time)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._tok = np.zeros(4096, dtype=np.float64)
            self._tok_max = -1
            self._tok_min: int | None = None
            self._win: dict[int, tuple[list[float], list[float]]] = {}
            self._done_w: list[tuple[float, float, float, float, float]] = []
            self._next_w: int | None = None
            self._levels: list[tuple[float, float]] = []
            self._end: float | None = None
            self.n_records = 0
            self.n_failed = 0
            self.version = 0

    # ------------------------------------------------------------------ feeding (any thread)
    def add(self, records: Iterable[RequestRecord]) -> None:
        """Add finished :class:`app.loadgen.records.RequestRecord` objects."""
        with self._lock:
            for r in records:
                self.n_records += 1
                if r.failed:  # a rejection (HTTP 503) is not a failure
                    self.n_failed += 1
                n = r.chunk_offsets.size
                if n:
                    idx = ((r.t_start + r.chunk_offsets.astype(np.float64)) // self.bin_s).astype(np.int64)
                    idx = idx[idx >= 0]
                    if idx.size:
                        hi = int(idx.max())
                        if hi >= self._tok.size:
                            grown = np.zeros(max(hi + 1, self._tok.size * 2))
                            grown[: self._tok.size] = self._tok
                            self._tok = grown
                        np.add.at(self._tok, idx, (r.output_tokens / n) if r.output_tokens else 1.0)
                        self._tok_max = max(self._tok_max, hi)
                        lo = int(idx.min())
                        self._tok_min = lo if self._tok_min is None else min(self._tok_min, lo)
                if r.ok and r.ttft is not None:
                    w = int(r.t_end // self.window_s)
                    if self._next_w is not None and w < self._next_w:
                        w = self._next_w  # arrived after its window closed: count it in the open one
                    ttfts, tpots = self._win.setdefault(w, ([], []))
                    ttfts.append(r.ttft)
                    tp = r.tpot
                    if tp is not None:
                        tpots.append(tp)
            self.version += 1

    def level_started(self, t: float, level: float) -> None:
        with self._lock:
            self._levels.append((float(t), float(level)))
            self._end = None
            self.version += 1

    def ramp_ended(self, t: float) -> None:
        """The ramp ended at session time ``t`` (s): the level step line stops there."""
        with self._lock:
            self._end = float(t)

    # ------------------------------------------------------------------ reading (GUI thread)
    def snapshot(self, now: float) -> Snapshot:
        """Series up to session time ``now`` (s): complete bins and closed windows only."""
        with self._lock:
            last_bin = min(self._tok_max, int(now // self.bin_s) - 1)
            if self._tok_min is not None and last_bin >= self._tok_min:
                i = np.arange(self._tok_min, last_bin + 1)
                tps_t = (i + 0.5) * self.bin_s
                tps = self._tok[self._tok_min: last_bin + 1] / (self.bin_s * self.time_scale)
            else:
                tps_t = tps = np.zeros(0)
            closed = int((now - self.lag_s) // self.window_s)  # windows < closed are final
            for w in sorted(k for k in self._win if k < closed):
                ttfts, tpots = self._win.pop(w)
                a = np.asarray(ttfts)
                b = np.asarray(tpots) if tpots else np.asarray([np.nan])
                self._done_w.append(((w + 0.5) * self.window_s, float(np.percentile(a, 50)),
                                     float(np.percentile(a, 99)), float(np.percentile(b, 50)),
                                     float(np.percentile(b, 99))))
                self._next_w = w + 1
            lat = np.asarray(self._done_w, dtype=np.float64).reshape(-1, 5)
            lv = list(self._levels)
            end = self._end
        if lv:
            edges = np.array([t for t, _ in lv] + [max(end if end is not None else now, lv[-1][0])])
            levels = np.array([l for _, l in lv])
        else:
            edges, levels = np.zeros(0), np.zeros(0)
        k = self.time_scale
        return Snapshot(tps_t, tps, lat[:, 0], lat[:, 1] * k, lat[:, 2] * k, lat[:, 3] * k, lat[:, 4] * k, edges, levels,
                        self.n_records, self.n_failed, lv, trailing_mean(tps, max(1, round(self.smooth_s / self.bin_s))))


def trailing_mean(x: np.ndarray, n: int) -> np.ndarray:
    """``out[i]`` = mean of ``x[max(0, i−n+1)] … x[i]`` (a trailing window of ``n``
    samples, shorter at the start)."""
    if len(x) == 0:
        return np.zeros(0)
    c = np.cumsum(np.concatenate([[0.0], np.asarray(x, dtype=np.float64)]))
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(0, i - n)
    return (c[i] - c[lo]) / (i - lo)
