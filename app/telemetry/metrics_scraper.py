"""The ``/metrics`` scraper: server-side series at a set rate (default 2 Hz).

Samples, source ``metrics`` (totals over engines) and, with several engines,
``metrics.e<engine>`` per engine (names declared in :data:`app.telemetry.names.METRICS_SERIES`):

- ``up`` 1/0; on 0 the main series get a NaN gap and the reason is logged (once per
  change of reason) and kept in ``last_error``.
- ``running``, ``waiting`` (requests), ``kv_cache_usage`` (0–1, mean over engines) and
  ``kv_cache_usage_max``; not exported → no sample (``latest`` holds None, shown as
  "not exported", never 0).
- ``prompt_tokens_total``, ``generation_tokens_total``, ``preemptions_total`` and their
  rates ``prompt_tokens_per_s``, ``generation_tokens_per_s``, ``preemptions_per_s``
  (counter delta ÷ time between scrapes; a counter that went down restarted from 0).
- ``{ttft,itl,e2e,queue}_p{50,90,99}_s`` and ``…_mean_s``: quantiles of the requests
  observed between two scrapes, from histogram bucket deltas (Prometheus'
  histogram_quantile); no sample when no request finished in the interval.
- ``kv_capacity_tokens``: ``cache_config_info``'s ``kv_cache_size_tokens`` (vLLM 0.32's
  group-aware figure), else num_gpu_blocks × block_size
  (:attr:`~app.telemetry.metrics_parse.MetricsSnapshot.kv_cache_tokens`).
"""
from __future__ import annotations

import logging
import math
from typing import Any

from app.clock import SessionClock
from app.telemetry.http_source import fetch_text
from app.telemetry.names import (COUNTER_SERIES, HISTOGRAM_SERIES, KV_CACHE_USAGE, KV_CACHE_USAGE_MAX,
                                 KV_CAPACITY_TOKENS, QUANTILES, RUNNING, UP, WAITING, counter_rate,
                                 counter_total, quantile_series)
from app.telemetry.metrics_parse import (MetricsParseError, MetricsSnapshot, histogram_delta, histogram_quantile,
                                          parse_metrics)
from app.telemetry.periodic import PeriodicSampler
from app.telemetry.series import Sample

log = logging.getLogger(__name__)

#: sample prefix (app.telemetry.names.HISTOGRAM_SERIES) → histogram name (new names; old ones are
#: accepted by the parser)
HISTOGRAMS = dict(zip(HISTOGRAM_SERIES, ("time_to_first_token_seconds", "inter_token_latency_seconds",
                                         "e2e_request_latency_seconds", "request_queue_time_seconds")))
#: sample prefix (app.telemetry.names.COUNTER_SERIES) → counter name
COUNTERS = dict(zip(COUNTER_SERIES, ("prompt_tokens_total", "generation_tokens_total", "num_preemptions_total")))
#: sample name → the gauge it reads (per engine: ``metrics.e<engine>``)
GAUGES = {RUNNING: "num_requests_running", WAITING: "num_requests_waiting", KV_CACHE_USAGE: "kv_cache_usage_perc"}
GAP_SERIES = (RUNNING, WAITING, KV_CACHE_USAGE, counter_rate("prompt_tokens"), counter_rate("generation_tokens"))


class MetricsDeriver:
    """Turns successive snapshots into samples (rates and per-interval quantiles).

    Pure: feed ``(t, snapshot)`` pairs in time order; no I/O. ``split_engines``: also
    emit per-engine series when there is more than one engine.
    """

    def __init__(self, split_engines: bool = True) -> None:
        self.split_engines = split_engines
        self.prev: tuple[float, MetricsSnapshot] | None = None
        self.latest: dict[str, Any] = {}

    def gap(self, t: float) -> list[Sample]:
        self.latest = {"up": False}
        return [Sample(t, "metrics", UP, 0.0)] + [Sample(t, "metrics", n, math.nan) for n in GAP_SERIES]

    def feed(self, t: float, snap: MetricsSnapshot) -> list[Sample]:
        out = [Sample(t, "metrics", UP, 1.0)]
        latest: dict[str, Any] = {"up": True, "engines": sorted(snap.engines)}

        def put(name: str, v: float | None, src: str = "metrics") -> None:
            if src == "metrics":
                latest[name] = v
            if v is not None:
                out.append(Sample(t, src, name, float(v)))

        put(RUNNING, snap.total(GAUGES[RUNNING]))
        put(WAITING, snap.total(GAUGES[WAITING]))
        put(KV_CACHE_USAGE, snap.mean(GAUGES[KV_CACHE_USAGE]))
        put(KV_CACHE_USAGE_MAX, snap.max(GAUGES[KV_CACHE_USAGE]))
        put(KV_CAPACITY_TOKENS, snap.kv_cache_tokens)
        prev = self.prev
        dt = t - prev[0] if prev else 0.0
        for short, cname in COUNTERS.items():
            cur = snap.counter(cname)
            put(counter_total(short), cur)
            rate = None
            if cur is not None and prev and dt > 0:
                old = prev[1].counter(cname)
                if old is not None:
                    rate = (cur - old if cur >= old else cur) / dt
            put(counter_rate(short), rate)
        for short, hname in HISTOGRAMS.items():
            h = snap.histogram(hname)
            if h is None or not prev:
                continue
            d = histogram_delta(h, prev[1].histogram(hname))
            if d.count <= 0:
                continue
            b = sorted(d.buckets.items())
            for q in QUANTILES:
                put(quantile_series(short, q), histogram_quantile(q, b))
            put(f"{short}_mean_s", d.sum / d.count)
        if self.split_engines and len(snap.engines) > 1:
            for e in sorted(snap.engines):
                src = f"metrics.e{e}"
                for name, g in GAUGES.items():
                    put(name, snap.gauge_by_engine(g).get(e), src)
                cur = snap.counter_by_engine("generation_tokens").get(e)
                old = prev[1].counter_by_engine("generation_tokens").get(e) if prev else None
                if cur is not None and old is not None and dt > 0:
                    put(counter_rate("generation_tokens"), (cur - old if cur >= old else cur) / dt, src)
            latest["by_engine"] = {e: {"running": snap.gauge_by_engine("num_requests_running").get(e),
                                       "kv_cache_usage": snap.gauge_by_engine("kv_cache_usage_perc").get(e)}
                                   for e in sorted(snap.engines)}
        latest["cache_config"] = snap.cache_config
        self.latest = latest
        self.prev = (t, snap)
        return out


class MetricsScraper(PeriodicSampler):
    """Scrapes ``url`` + ``/metrics`` every ``interval`` seconds (default 0.5 s = 2 Hz).

    ``url``: the server's base URL (``http://127.0.0.1:8000``). ``timeout``: seconds per
    request. ``latest``: the newest totals (None = not exported); ``last_error``: why the
    latest scrape failed, or None.
    """

    name = "metrics-scraper"

    def __init__(self, url: str, interval: float = 0.5, clock: SessionClock | None = None, timeout: float = 2.0,
                 split_engines: bool = True) -> None:
        super().__init__(interval, clock)
        base = url.rstrip("/")
        self.url = base if base.endswith("/metrics") else base + "/metrics"
        self.timeout = timeout
        self.deriver = MetricsDeriver(split_engines)
        self.last_error: str | None = None
        self.last_text: str | None = None

    @property
    def latest(self) -> dict[str, Any]:
        return self.deriver.latest

    def fetch(self) -> str:
        """GET the metrics text (raises OSError/ValueError when unreachable)."""
        return fetch_text(self.url, self.timeout)

    def tick(self) -> list[Sample]:
        """One scrape; never raises for an unreachable server or malformed text."""
        try:
            text = self.fetch()
            t = self.clock.now()
            snap = parse_metrics(text)
        except (OSError, ValueError, MetricsParseError) as e:
            return self._gap(f"{type(e).__name__}: {e}")
        except Exception as e:  # anything else from the HTTP stack
            return self._gap(f"{type(e).__name__}: {e}")
        self.last_text = text
        if self.last_error is not None:
            log.warning("%s: scraping again", self.url)
        self.last_error = None
        return self.deriver.feed(t, snap)

    def _gap(self, reason: str) -> list[Sample]:
        reason = reason.splitlines()[0] if reason else "unknown error"
        if reason != self.last_error:
            log.warning("%s: gap in server metrics: %s", self.url, reason)
        self.last_error = reason
        return self.deriver.gap(self.clock.now())
