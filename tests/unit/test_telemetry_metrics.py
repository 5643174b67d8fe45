"""/metrics parsing: the cases in tests/cases/metrics/, old names, quantiles, malformed text."""
from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.telemetry.metrics_parse import (Histogram, MetricsParseError, histogram_delta, histogram_quantile,
                                          parse_metrics)
from app.telemetry.metrics_scraper import MetricsDeriver
from tests.conftest import CASES

METRICS_CASES = sorted((CASES / "metrics").glob("*.yaml"))

# vLLM 0.10-style exposition: old gauge and histogram names, no engine label
OLD_STYLE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 5120.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 20480.0
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_sum{model_name="meta-llama/Llama-3.1-8B-Instruct"} 600.0
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10000.0
vllm:time_per_output_token_seconds_bucket{le="0.05",model_name="meta-llama/Llama-3.1-8B-Instruct"} 20000.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 20480.0
vllm:time_per_output_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 20480.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.9",num_gpu_blocks="27056",num_cpu_blocks="2048"} 1.0
"""


def _load(path):
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", METRICS_CASES, ids=[p.stem for p in METRICS_CASES])
def test_metrics_case(path):
    case = _load(path)
    snap = parse_metrics(case["text"])
    _check(snap, case["expect"])
    for var in case.get("variants", []):
        (how, arg), = var["change"].items()
        if how == "rename_metric":
            assert arg["from"] in case["text"]
            text = case["text"].replace(arg["from"], arg["to"])
        elif how == "drop_metric":
            assert arg in case["text"]
            text = "\n".join(l for l in case["text"].splitlines() if arg not in l) + "\n"
        else:
            pytest.fail(f"change not understood by this test: {var['change']}")
        _check(parse_metrics(text), var["expect"])


def _check(snap, exp):
    for key, want in exp.items():
        if key == "running_total":
            assert snap.total("num_requests_running") == want
        elif key == "running_by_engine":
            assert snap.gauge_by_engine("num_requests_running") == {k: float(v) for k, v in want.items()}
        elif key == "kv_cache_usage":
            if want == "not_exported":
                assert snap.mean("kv_cache_usage_perc") is None and snap.max("kv_cache_usage_perc") is None
                samples = MetricsDeriver().feed(1.0, snap)
                assert not [s for s in samples if s.name.startswith("kv_cache_usage")]  # never 0
            else:
                assert snap.max("kv_cache_usage_perc") == pytest.approx(want["max"])
                assert snap.mean("kv_cache_usage_perc") == pytest.approx(want["mean"])
        elif key == "generation_tokens_total":
            assert snap.counter("generation_tokens_total") == want
        elif key == "created_series_shown":
            names = {n for m in snap.engines.values() for d in (m.gauges, m.counters, m.histograms) for n in d}
            assert not any(n.endswith("_created") for n in names) or want
            samples = MetricsDeriver().feed(1.0, snap)
            assert not any("created" in s.name for s in samples)
        else:
            pytest.fail(f"expect key not handled: {key}")


def test_old_names():
    snap = parse_metrics(OLD_STYLE)
    assert list(snap.engines) == ["0"]
    assert snap.total("num_requests_running") == 4 and snap.total("num_requests_waiting") == 2
    assert snap.mean("kv_cache_usage_perc") == 0.42
    assert snap.counter("num_preemptions") == 3
    h = snap.histogram("inter_token_latency_seconds")
    assert h is not None and h.count == 20480
    assert snap.num_gpu_blocks == 27056 and snap.block_size == 16
    out = {s.name: s.value for s in MetricsDeriver().feed(0.0, snap)}
    assert out["kv_capacity_tokens"] == 27056 * 16 and out["running"] == 4


def test_kv_capacity_is_the_servers_own_group_aware_figure_where_it_gives_one():
    """vLLM 0.32 exports every CacheConfig field as a label of ``cache_config_info``
    (vllm/config/cache.py ``metrics_info`` :322, vllm/v1/metrics/loggers.py:1114), among them
    ``kv_cache_size_tokens``, each engine's group-aware capacity (cache.py:227): for Gemma 3
    27B on one H100 15,163 blocks of 16 tokens hold 134,961 tokens of 131,072-token requests,
    not 242,608 (tests/unit/test_kvcache.py). Where the label is absent (before 0.32) or
    "None", blocks × block size stays the figure."""
    text = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",'
            'kv_cache_max_concurrency="1.0296754040472633",kv_cache_size_tokens="134961",num_gpu_blocks="15163"} 1.0\n'
            'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",gpu_memory_utilization="0.9",'
            'kv_cache_max_concurrency="1.0296754040472633",kv_cache_size_tokens="134961",num_gpu_blocks="15163"} 1.0\n')
    snap = parse_metrics(text)
    assert snap.kv_cache_tokens == 2 * 134_961 and snap.num_gpu_blocks * snap.block_size == 2 * 242_608
    assert {s.name: s.value for s in MetricsDeriver().feed(0.0, snap)}["kv_capacity_tokens"] == 2 * 134_961
    assert parse_metrics(text.replace('"134961"', '"None"')).kv_cache_tokens == 2 * 242_608
    assert parse_metrics("vllm:num_requests_running{engine=\"0\"} 1\n").kv_cache_tokens is None


def test_rates_and_interval_quantiles_from_two_scrapes():
    d = MetricsDeriver()
    d.feed(10.0, parse_metrics(OLD_STYLE))
    later = (OLD_STYLE.replace("vllm:generation_tokens_total{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 20480.0",
                               "vllm:generation_tokens_total{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 21480.0")
             .replace('le="0.025",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10000.0',
                      'le="0.025",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10000.0')
             .replace('le="0.05",model_name="meta-llama/Llama-3.1-8B-Instruct"} 20000.0',
                      'le="0.05",model_name="meta-llama/Llama-3.1-8B-Instruct"} 21000.0')
             .replace('le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 20480.0',
                      'le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 21480.0')
             .replace("time_per_output_token_seconds_count{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 20480.0",
                      "time_per_output_token_seconds_count{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 21480.0")
             .replace("time_per_output_token_seconds_sum{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 600.0",
                      "time_per_output_token_seconds_sum{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 640.0"))
    out = {s.name: s.value for s in d.feed(12.0, parse_metrics(later))}
    assert out["generation_tokens_per_s"] == pytest.approx(500.0)
    assert out["prompt_tokens_per_s"] == 0.0
    # interval: 1000 new observations in (0.025, 0.05] → p50 = 0.0375 (linear in bucket)
    assert out["itl_p50_s"] == pytest.approx(0.0375)
    assert out["itl_mean_s"] == pytest.approx(0.04)
    assert "ttft_p50_s" not in out  # not exported → no sample


def test_counter_reset_after_restart():
    d = MetricsDeriver()
    d.feed(0.0, parse_metrics(OLD_STYLE))
    reset = OLD_STYLE.replace("} 20480.0\n# HELP vllm:time", "} 100.0\n# HELP vllm:time")
    out = {s.name: s.value for s in d.feed(1.0, parse_metrics(reset))}
    assert out["generation_tokens_per_s"] == 100.0


def test_histogram_quantile_matches_prometheus():
    inf = math.inf
    b = [(0.1, 10.0), (0.2, 20.0), (0.4, 40.0), (inf, 40.0)]
    assert histogram_quantile(0.5, b) == pytest.approx(0.2)
    assert histogram_quantile(0.25, b) == pytest.approx(0.1)
    assert histogram_quantile(0.75, b) == pytest.approx(0.3)
    assert histogram_quantile(0.99, [(0.1, 0.0), (inf, 5.0)]) == 0.1  # in +Inf: largest finite bound
    assert histogram_quantile(0.5, [(0.1, 0.0), (inf, 0.0)]) is None
    assert histogram_quantile(0.5, [(0.1, 1.0)]) is None
    cur = Histogram({0.1: 5, inf: 10}, 10, 2.0)
    prev = Histogram({0.1: 5, inf: 6}, 6, 1.0)
    assert histogram_delta(cur, prev).buckets == {0.1: 0, inf: 4}


def test_several_engines_shown_apart():
    text = (CASES / "metrics" / "two-engines-renamed-created.yaml").read_text()
    snap = parse_metrics(yaml.safe_load(text)["text"])
    out = MetricsDeriver().feed(1.0, snap)
    per = {(s.source, s.name): s.value for s in out}
    assert per[("metrics", "running")] == 8
    assert per[("metrics.e0", "running")] == 3 and per[("metrics.e1", "running")] == 5
    assert per[("metrics.e1", "kv_cache_usage")] == 0.75


@pytest.mark.parametrize("bad", [
    "vllm:num_requests_running{engine=\"0\" 3\n",
    "vllm:num_requests_running{engine=\"0\"} three\n",
    "# TYPE vllm:x histogram\nvllm:x_bucket{le=\"abc\"} 1\n",
    "\x00\x01\x02",
])
def test_malformed_raises_parse_error(bad):
    with pytest.raises(MetricsParseError, match="malformed /metrics"):
        parse_metrics(bad)


_lines = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["# TYPE vllm:a histogram", "# TYPE vllm:b counter", "# TYPE vllm:c gauge", "# HELP x y",
                     "vllm:a_bucket{le=\"+Inf\"} 1", "vllm:a_bucket{le=\"0.1\"} 2", "vllm:a_count 3", "vllm:a_sum 1",
                     "vllm:b_total{engine=\"1\"} 5", "vllm:c{engine=\"x\"} NaN", "vllm:cache_config_info{} 1",
                     "vllm:c 1e400", "vllm:b_created 1.7e9", "vllm:c{le=\"x\"} 1"]),
    st.builds(lambda n, v: f"vllm:{n} {v}", st.text("abc_:{}\"=,", max_size=12), st.text("0123456789.e+-naNIf", max_size=8)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_lines, max_size=12), st.lists(_lines, max_size=12))
def test_malformed_input_never_raises_out_of_the_scraper(a, b):
    from app.telemetry.metrics_scraper import MetricsScraper

    texts = iter(["\n".join(a) + "\n", "\n".join(b)])

    class Fixed(MetricsScraper):
        def fetch(self) -> str:
            return next(texts)

    s = Fixed("http://127.0.0.1:9", interval=1.0)
    for _ in range(2):
        out = s.tick()
        assert out and out[0].name == "up"
