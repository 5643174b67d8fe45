"""Parse vLLM's Prometheus ``/metrics`` text into a :class:`MetricsSnapshot`.

Parsing is ``prometheus_client.parser.text_string_to_metric_families``. Only ``vllm:``
series are kept, grouped by the ``engine`` label (absent → ``"0"``) and summed over
every other label (``model_name``, ``finished_reason``, …). ``*_created`` series hold
epoch seconds of a counter's creation, not data: they are dropped.

Renamed metrics (docs/vllm-facts.md, "/metrics"): ``kv_cache_usage_perc`` was
``gpu_cache_usage_perc`` (≤ 0.11); ``inter_token_latency_seconds`` was
``time_per_output_token_seconds``; ``prefix_cache_queries``/``prefix_cache_hits`` were
``gpu_prefix_cache_queries``/``gpu_prefix_cache_hits`` (renamed in 0.9.2: 0.10 exports
both, 0.11 the old ones only with ``--show-hidden-metrics-for-version=0.10``, 0.12+ the
new ones only; vllm/v1/metrics/loggers.py). Lookups by the new name fall back to the old
one (never both summed: newer vLLMs may export both with different meanings).

Counters with a ``position`` label (``vllm:spec_decode_num_accepted_tokens_per_pos``) are
summed like the others and also kept per position (:meth:`MetricsSnapshot.counter_by_position`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:"

#: new name → older names to fall back to
FALLBACKS: dict[str, tuple[str, ...]] = {
    "kv_cache_usage_perc": ("gpu_cache_usage_perc",),
    "inter_token_latency_seconds": ("time_per_output_token_seconds",),
    "prefix_cache_queries_total": ("gpu_prefix_cache_queries_total",),
    "prefix_cache_hits_total": ("gpu_prefix_cache_hits_total",),
}


class MetricsParseError(ValueError):
    """The ``/metrics`` text could not be parsed; the message says where."""


@dataclass
class Histogram:
    """A Prometheus histogram: ``buckets`` maps upper bound ``le`` (seconds, ``inf`` for
    +Inf) to the cumulative count; ``count`` and ``sum`` (seconds) as exported."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def add(self, other: "Histogram") -> None:
        for le, c in other.buckets.items():
            self.buckets[le] = self.buckets.get(le, 0.0) + c
        self.count += other.count
        self.sum += other.sum


@dataclass
class EngineMetrics:
    """One engine's series; names without the ``vllm:`` prefix. Counters keep ``_total``."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    #: counter name → ``position`` label → value (counters with a ``position`` label only)
    by_position: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass
class MetricsSnapshot:
    """Everything one ``/metrics`` scrape said, per engine.

    ``cache_config``: engine → labels of ``vllm:cache_config_info`` (strings, e.g.
    ``num_gpu_blocks``, ``block_size``, ``gpu_memory_utilization``).
    """

    engines: dict[str, EngineMetrics] = field(default_factory=dict)
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)

    def _engine(self, e: str) -> EngineMetrics:
        m = self.engines.get(e)
        if m is None:
            m = self.engines[e] = EngineMetrics()
        return m

    @staticmethod
    def _resolve(table_of, name: str) -> dict[str, float]:
        for n in (name, *FALLBACKS.get(name, ())):
            found = {e: v for e, v in table_of(n)}
            if found:
                return found
        return {}

    # ---- gauges
    def gauge_by_engine(self, name: str) -> dict[str, float]:
        """engine → value of gauge ``name`` (old names accepted); {} when not exported."""
        return self._resolve(lambda n: [(e, m.gauges[n]) for e, m in self.engines.items() if n in m.gauges], name)

    def total(self, name: str) -> float | None:
        """Sum over engines of gauge ``name``; None when not exported (never 0 for absent)."""
        v = self.gauge_by_engine(name)
        return sum(v.values()) if v else None

    def mean(self, name: str) -> float | None:
        v = self.gauge_by_engine(name)
        return sum(v.values()) / len(v) if v else None

    def max(self, name: str) -> float | None:
        v = self.gauge_by_engine(name)
        return max(v.values()) if v else None

    # ---- counters
    def counter_by_engine(self, name: str) -> dict[str, float]:
        """engine → counter value; ``name`` with or without ``_total``."""
        if not name.endswith("_total"):
            name += "_total"
        return self._resolve(lambda n: [(e, m.counters[n]) for e, m in self.engines.items() if n in m.counters], name)

    def counter(self, name: str) -> float | None:
        v = self.counter_by_engine(name)
        return sum(v.values()) if v else None

    def counter_by_position(self, name: str) -> dict[int, float]:
        """``position`` label → counter value summed over engines (``name`` with or
        without ``_total``); {} when not exported."""
        if not name.endswith("_total"):
            name += "_total"
        out: dict[int, float] = {}
        for m in self.engines.values():
            for pos, v in m.by_position.get(name, {}).items():
                out[pos] = out.get(pos, 0.0) + v
        return out

    # ---- histograms
    def histogram(self, name: str, engine: str | None = None) -> Histogram | None:
        """Histogram ``name`` of one engine, or summed over engines; None when not exported."""
        for n in (name, *FALLBACKS.get(name, ())):
            hs = [m.histograms[n] for e, m in self.engines.items() if n in m.histograms and engine in (None, e)]
            if hs:
                out = Histogram()
                for h in hs:
                    out.add(h)
                return out
        return None

    @property
    def num_gpu_blocks(self) -> int | None:
        """Sum over engines of ``cache_config_info``'s ``num_gpu_blocks`` label."""
        vals = [_int(c.get("num_gpu_blocks")) for c in self.cache_config.values()]
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None

    @property
    def kv_cache_tokens(self) -> int | None:
        """The server's KV capacity in tokens, summed over engines: ``cache_config_info``'s
        ``kv_cache_size_tokens`` label where the server gives it (vLLM 0.32: each engine's
        group-aware "KV cache size", vllm/config/cache.py:227 — num_gpu_blocks ×
        block_size overstates a hybrid sliding-window/mamba model's), else num_gpu_blocks ×
        block_size (older versions); None when neither is exported."""
        vals = [_int(c.get("kv_cache_size_tokens")) for c in self.cache_config.values()]
        if vals and all(v is not None for v in vals):
            return sum(v for v in vals if v is not None)
        if self.num_gpu_blocks is not None and self.block_size is not None:
            return self.num_gpu_blocks * self.block_size
        return None

    @property
    def block_size(self) -> int | None:
        for c in self.cache_config.values():
            v = _int(c.get("block_size"))
            if v is not None:
                return v
        return None


def _int(s: str | None) -> int | None:
    try:
        return int(float(s)) if s not in (None, "", "None") else None
    except ValueError:
        return None


def _le(s: str) -> float:
    return math.inf if s in ("+Inf", "Inf", "inf") else float(s)


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse ``/metrics`` text. Raises :class:`MetricsParseError` for malformed text."""
    snap = MetricsSnapshot()
    try:
        for fam in text_string_to_metric_families(text):
            kind = fam.type
            for s in fam.samples:
                name = s.name
                if not name.startswith(PREFIX) or name.endswith("_created"):
                    continue
                base = name[len(PREFIX):]
                labels = s.labels
                engine = str(labels.get("engine", "0"))
                value = float(s.value)
                if base.startswith("cache_config_info"):
                    snap.cache_config[engine] = {k: v for k, v in labels.items() if k != "engine"}
                    continue
                m = snap._engine(engine)
                if kind == "histogram" or (kind == "unknown" and base.endswith(("_bucket", "_count", "_sum"))
                                            and (("le" in labels) or not base.endswith("_bucket"))):
                    if base.endswith("_bucket"):
                        h = m.histograms.setdefault(base[:-7], Histogram())
                        le = _le(labels["le"])
                        h.buckets[le] = h.buckets.get(le, 0.0) + value
                    elif base.endswith("_count"):
                        m.histograms.setdefault(base[:-6], Histogram()).count += value
                    elif base.endswith("_sum"):
                        m.histograms.setdefault(base[:-4], Histogram()).sum += value
                elif kind == "counter" or (kind == "unknown" and base.endswith("_total")):
                    m.counters[base] = m.counters.get(base, 0.0) + value
                    if "position" in labels:
                        per = m.by_position.setdefault(base, {})
                        pos = int(labels["position"])
                        per[pos] = per.get(pos, 0.0) + value
                elif kind in ("gauge", "unknown"):
                    m.gauges[base] = m.gauges.get(base, 0.0) + value
                # summaries, info, stateset: not used
    except MetricsParseError:
        raise
    except Exception as e:  # the parser raises ValueError, KeyError, IndexError… on bad lines
        raise MetricsParseError(f"malformed /metrics text: {type(e).__name__}: {e}") from None
    snap.engines = {e: m for e, m in snap.engines.items() if m.gauges or m.counters or m.histograms}
    return snap


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Quantile ``q`` (0–1) from cumulative buckets ``[(le, count), …]`` sorted by ``le``.

    Prometheus' ``histogram_quantile`` (promql/quantile.go): linear interpolation inside
    the bucket holding rank q·N, lower bound 0 for the first bucket; a rank in the +Inf
    bucket returns the largest finite bound. None when there are no observations or no
    +Inf bucket.
    """
    if not 0 <= q <= 1 or len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return None
    counts, run = [], 0.0
    for _, c in buckets:  # enforce monotonic counts (scrape races)
        run = max(run, c)
        counts.append(run)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    end = buckets[b][0]
    if b == 0 and end <= 0:
        return end
    start = 0.0 if b == 0 else buckets[b - 1][0]
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return end
    return start + (end - start) * (rank - below) / in_bucket


def quantile_bucket(q: float, buckets: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """The bucket ``(lower, upper)`` bound, in the histogram's unit, that
    :func:`histogram_quantile` interpolates quantile ``q`` inside: the quantile is only
    known to lie in it (the interpolation assumes observations spread evenly across
    it). A rank in the +Inf bucket gives ``(largest finite bound, inf)``. None when
    :func:`histogram_quantile` is None."""
    if histogram_quantile(q, buckets) is None:
        return None
    counts, run = [], 0.0
    for _, c in buckets:
        run = max(run, c)
        counts.append(run)
    rank = q * counts[-1]
    b = next(i for i, c in enumerate(counts) if c >= rank)
    return (0.0 if b == 0 else buckets[b - 1][0]), buckets[b][0]


def histogram_delta(cur: Histogram, prev: Histogram | None) -> Histogram:
    """Observations between two scrapes (``cur − prev``); ``cur`` itself after a reset."""
    if prev is None or cur.count < prev.count or set(cur.buckets) != set(prev.buckets):
        return cur
    return Histogram({le: c - prev.buckets[le] for le, c in cur.buckets.items()},
                     cur.count - prev.count, cur.sum - prev.sum)
