"""``/metrics`` with vLLM V1's metric names, types and labels (prometheus_client).

Names and buckets from vLLM ``vllm/v1/metrics/loggers.py`` (0.10–0.32) as listed in
docs/vllm-facts.md, "/metrics". Labels ``model_name`` and ``engine`` (the data parallel
rank: "0", "1", …). Durations are rig seconds.

With speculative decoding (``spec_tokens`` k > 0) the counters of vLLM's
``SpecDecodingProm`` (vllm/v1/spec_decode/metrics.py, 0.32): ``vllm:spec_decode_num_drafts``,
``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens`` and
``vllm:spec_decode_num_accepted_tokens_per_pos`` with a ``position`` label "0" … "k−1"
(exported with the ``_total`` suffix), created only when the server runs a speculative
config, as vLLM does.

Admission control: ``vllm:admission_rejections`` (exported ``_total``), labels
``model_name`` and ``reason`` (no ``engine``: the API server counts it), one child per
reason of :data:`app.engine.admission.ADMISSION_REASONS`, created whatever the limits, as
vLLM 0.32's ``PrometheusStatLogger`` does (vllm/v1/metrics/loggers.py:845–858).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from app.engine.admission import ADMISSION_REASONS, ADMISSION_REJECTIONS_METRIC

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class EngineMetrics:
    """One engine's series (label ``engine`` = its data parallel rank): the gauges
    ``running``, ``waiting``, ``kv_usage``, the counters ``preemptions``,
    ``prompt_tokens``, ``generation_tokens``, ``prefix_queries``, ``prefix_hits``,
    ``success[finished_reason]`` and the
    histograms ``ttft``, ``itl``, ``e2e``, ``queue``, ``prompt_hist``."""

    def __init__(self, fam: dict, model_name: str, engine: str, spec_tokens: int = 0) -> None:
        v = (model_name, engine)
        for name in ("running", "waiting", "kv_usage", "preemptions", "prompt_tokens", "generation_tokens", "ttft",
                     "itl", "e2e", "queue", "prompt_hist", "prefix_queries", "prefix_hits"):
            setattr(self, name, fam[name].labels(*v))
        self.success = {k: fam["success"].labels(model_name, engine, k) for k in ("stop", "length", "abort")}
        if spec_tokens:  # vllm/v1/spec_decode/metrics.py SpecDecodingProm: one child per position
            for name in ("spec_drafts", "spec_draft_tokens", "spec_accepted"):
                setattr(self, name, fam[name].labels(*v))
            self.spec_accepted_per_pos = [fam["spec_per_pos"].labels(model_name, engine, str(i))
                                          for i in range(spec_tokens)]


class SimMetrics:
    """Holds a private registry; :meth:`render` gives the exposition text (bytes).
    ``engines`` data parallel replicas, each with its own series as vLLM exports them
    (vLLM 0.32 ``PrometheusStatLogger``: label values ``[model_name, str(engine_index)]``
    per engine, and one ``cache_config_info`` series per engine, ``cache_dtype`` the
    ``--kv-cache-dtype``, ``kv_cache_size_tokens`` and ``kv_cache_max_concurrency`` one
    engine's group-aware capacity — vLLM 0.32 exports every CacheConfig field as a label,
    these two among them: vllm/config/cache.py:227–231 and ``metrics_info`` :322,
    vllm/v1/metrics/loggers.py:1114; None: not exported, as before 0.32); :meth:`engine`
    gives one replica's."""

    def __init__(self, model_name: str, num_gpu_blocks: int, gpu_memory_utilization: float,
                 engines: int = 1, cache_dtype: str = "auto", spec_tokens: int = 0, block_size: int = 16,
                 kv_cache_size_tokens: int | None = None, kv_cache_max_concurrency: float | None = None) -> None:
        r = self.registry = CollectorRegistry()
        lab = ("model_name", "engine")
        fam = {
            "running": Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             lab, registry=r),
            "waiting": Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             lab, registry=r),
            "kv_usage": Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              lab, registry=r),
            "preemptions": Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                   lab, registry=r),
            "prompt_tokens": Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lab, registry=r),
            "generation_tokens": Counter("vllm:generation_tokens", "Number of generation tokens processed.", lab,
                                         registry=r),
            # vllm/v1/metrics/loggers.py (0.32.0) PrometheusStatLogger: both in tokens, exported with
            # ``_total`` (prometheus_client); counted with prefix caching off too (they stay 0)
            "prefix_queries": Counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.", lab, registry=r),
            "prefix_hits": Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                                   lab, registry=r),
            "success": Counter("vllm:request_success", "Count of successfully processed requests.",
                               ("model_name", "engine", "finished_reason"), registry=r),
            "ttft": Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              lab, buckets=TTFT_BUCKETS, registry=r),
            "itl": Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             lab, buckets=ITL_BUCKETS, registry=r),
            "e2e": Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             lab, buckets=E2E_BUCKETS, registry=r),
            "queue": Histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", lab,
                               buckets=E2E_BUCKETS, registry=r),
            "prompt_hist": Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lab,
                                     buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000,
                                              50000, 100000), registry=r),
        }
        if spec_tokens:
            fam.update({
                "spec_drafts": Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lab,
                                       registry=r),
                "spec_draft_tokens": Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lab,
                                             registry=r),
                "spec_accepted": Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", lab,
                                         registry=r),
                "spec_per_pos": Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position.", lab + ("position",), registry=r),
            })
        names = ["block_size", "cache_dtype", "gpu_memory_utilization", "num_gpu_blocks"]
        values = [str(block_size), cache_dtype, str(gpu_memory_utilization), str(num_gpu_blocks)]
        if kv_cache_size_tokens is not None:
            names += ["kv_cache_size_tokens", "kv_cache_max_concurrency"]
            values += [str(kv_cache_size_tokens), str(kv_cache_max_concurrency)]
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", (*names, "engine"),
                     registry=r)
        self.engines = [EngineMetrics(fam, model_name, str(i), spec_tokens) for i in range(engines)]
        rejections = Counter(ADMISSION_REJECTIONS_METRIC,
                             "Number of admission attempts rejected by a queue limit, by reason.",
                             ("model_name", "reason"), registry=r)
        #: reason → its counter (the front end's, over every engine)
        self.admission_rejections = {why: rejections.labels(model_name, why) for why in ADMISSION_REASONS}
        for i in range(engines):
            info.labels(*values, str(i)).set(1)

    def engine(self, index: int) -> EngineMetrics:
        return self.engines[index]

    def render(self) -> bytes:
        return generate_latest(self.registry)
