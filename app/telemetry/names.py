"""The names of the telemetry series, declared once: what every producer writes and every
consumer reads — the Live tab (widgets.dashboard), the HTML report (app.report), the
verdict's observation and the safety stop (app.run.verdict, app.run.safety), the
comparison's and the controller's energy (app.comparison, app.run.controller,
app.telemetry.derived). A consumer names a series by a constant of this module, never by
a string of its own (tests/unit/test_telemetry_names.py fails on one no producer declares).

A series is ``(source, name)`` (:class:`app.telemetry.series.Sample`); each producer
writes under its own sources, and each of its names is declared here with the unit of
the stored value (a reader converts for display: bytes → GiB, a fraction → %):

- ``gpu`` (:data:`GPU_SERIES`): every card, source ``gpu<index>`` — NVML, the sim rig
  over HTTP, a rig host's agent (app.telemetry.gpu_sampler);
- ``metrics`` (:data:`METRICS_SERIES`): the server's ``/metrics``, source ``metrics``
  (totals over engines) and ``metrics.e<engine>`` (app.telemetry.metrics_scraper);
- ``host`` and ``server`` (:data:`HOST_SERIES`, :data:`SERVER_SERIES`): this machine
  and the server's process tree (app.telemetry.host_sampler).

A rig's other hosts send the same series under ``<host>:`` + the source (app.hosts.link).
"""
from __future__ import annotations

import re

# ---------------------------------------------------------------------- gpu<index>
#: per card: GpuReading's numeric fields (app.telemetry.gpu_source), then the derived ones
GPU_SERIES: dict[str, str] = {
    "memory_total_bytes": "bytes", "memory_used_bytes": "bytes", "memory_free_bytes": "bytes",
    "memory_reserved_bytes": "bytes", "util_gpu_pct": "%", "util_memory_pct": "%", "temp_gpu_c": "°C",
    "temp_memory_c": "°C", "temp_slowdown_c": "°C", "temp_shutdown_c": "°C", "power_w": "W", "power_limit_w": "W",
    "clock_sm_mhz": "MHz", "clock_mem_mhz": "MHz", "throttle_reasons": "NVML clocks-event bitmask",
    "pcie_tx_bytes_per_s": "bytes/s", "pcie_rx_bytes_per_s": "bytes/s", "fan_pct": "%",
    "vram_headroom_bytes": "bytes", "lost": "1 when the card fell off the bus",
}
#: the GPU reading's fields that are series (sample name = field name), in order
GPU_READING_SERIES: tuple[str, ...] = tuple(GPU_SERIES)[:-2]
MEMORY_TOTAL_BYTES, MEMORY_USED_BYTES = "memory_total_bytes", "memory_used_bytes"
VRAM_HEADROOM_BYTES = "vram_headroom_bytes"
TEMP_GPU_C, TEMP_SLOWDOWN_C = "temp_gpu_c", "temp_slowdown_c"
POWER_W, POWER_LIMIT_W = "power_w", "power_limit_w"
UTIL_GPU_PCT, THROTTLE_REASONS = "util_gpu_pct", "throttle_reasons"
LOST = "lost"

# ---------------------------------------------------------------------- metrics[.e<engine>]
#: requests running / waiting (gauges), and the KV cache's use (a fraction 0–1, mean over engines)
RUNNING, WAITING, KV_CACHE_USAGE = "running", "waiting", "kv_cache_usage"
#: the scrape's state (1 up, 0 down), the busiest engine's KV cache use (0–1), KV capacity (tokens)
UP, KV_CACHE_USAGE_MAX, KV_CAPACITY_TOKENS = "up", "kv_cache_usage_max", "kv_capacity_tokens"
#: counters: ``<short>_total`` (tokens or events) and ``<short>_per_s`` (their rate)
COUNTER_SERIES: tuple[str, ...] = ("prompt_tokens", "generation_tokens", "preemptions")
#: histograms: ``<short>_p50_s`` … ``<short>_mean_s`` (seconds, over the requests between two scrapes)
HISTOGRAM_SERIES: tuple[str, ...] = ("ttft", "itl", "e2e", "queue")
#: the quantiles of each histogram (``p50``, ``p90``, ``p99``)
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)


def quantile_series(short: str, q: float) -> str:
    """``ttft``, 0.99 → ``ttft_p99_s``."""
    return f"{short}_p{round(q * 100)}_s"


def counter_total(short: str) -> str:
    """``preemptions`` → ``preemptions_total`` (the counter's value)."""
    return f"{short}_total"


def counter_rate(short: str) -> str:
    """``preemptions`` → ``preemptions_per_s`` (the counter's rate)."""
    return f"{short}_per_s"


#: the engines' preemptions so far (a counter)
PREEMPTIONS_TOTAL = counter_total("preemptions")


METRICS_SERIES: dict[str, str] = {
    UP: "1 up / 0 down", RUNNING: "requests", WAITING: "requests", KV_CACHE_USAGE: "fraction 0–1",
    KV_CACHE_USAGE_MAX: "fraction 0–1", KV_CAPACITY_TOKENS: "tokens",
    **{counter_total(c): "count" for c in COUNTER_SERIES}, **{counter_rate(c): "per s" for c in COUNTER_SERIES},
    **{quantile_series(h, q): "s" for h in HISTOGRAM_SERIES for q in QUANTILES},
    **{f"{h}_mean_s": "s" for h in HISTOGRAM_SERIES},
}

# ---------------------------------------------------------------------- host, server
HOST_SERIES: dict[str, str] = {"cpu_pct": "% of all cores", "memory_used_bytes": "bytes",
                               "memory_available_bytes": "bytes", "memory_total_bytes": "bytes"}
SERVER_SERIES: dict[str, str] = {"rss_bytes": "bytes", "cpu_pct": "% of one core", "processes": "count"}

#: producer → the series it writes
PRODUCERS: dict[str, dict[str, str]] = {"gpu": GPU_SERIES, "metrics": METRICS_SERIES, "host": HOST_SERIES,
                                        "server": SERVER_SERIES}



def declared(name: str, producer: str | None = None) -> bool:
    """Whether ``producer`` (any producer when None) declares the series ``name``."""
    return any(name in series for p, series in PRODUCERS.items() if producer in (None, p))


_SOURCE = re.compile(r"^(?:[^:]+:)?(gpu)\d+$|^(?:[^:]+:)?(metrics)(?:\.e\d+)?$|^(?:[^:]+:)?(host|server)$")


def producer_of(source: str) -> str | None:
    """The producer of a sample's ``source``: ``gpu3`` → ``gpu``, ``metrics.e1`` →
    ``metrics``, ``h2:host`` → ``host``; None for a source no producer writes."""
    m = _SOURCE.match(source)
    return next((g for g in m.groups() if g), None) if m else None
