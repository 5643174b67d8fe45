"""Shared-prefix and multi-turn workloads against the real CPU vLLM (tiny model; issue 20,
items 2 and 3): the server's own prefix-cache counters read from its ``/metrics`` before
and after a ramp with :func:`app.telemetry.metrics_parse.parse_metrics` —
``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (tokens;
vllm/v1/metrics/loggers.py, 0.32.0; vLLM ≈0.10 also exported the deprecated
``vllm:gpu_prefix_cache_*`` twins, read as a fallback). The shared server runs with
prefix caching at vLLM V1's default (on: vllm/config/cache.py, 0.32.0); one more server
(tests/conftest.py's variant) runs with ``--no-enable-prefix-caching``, where vLLM records no lookups
(vllm/v1/core/kv_cache_manager.py ``record_prefix_cache_stats``: the counters stay 0)."""
from __future__ import annotations

import urllib.request

from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from app.telemetry.metrics_parse import parse_metrics


def prefix_counters(url: str) -> tuple[float, float]:
    """(queries, hits), tokens, summed over engines, from the server's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        snap = parse_metrics(r.read().decode())
    q = snap.counter("prefix_cache_queries")
    h = snap.counter("prefix_cache_hits")
    if q is None:  # the older name (vLLM ≈0.10 exported both)
        q, h = snap.counter("gpu_prefix_cache_queries"), snap.counter("gpu_prefix_cache_hits")
    return q or 0.0, h or 0.0


def ramp(url: str, **kw):
    """One level of 2 users for 6 s; (result, queries Δ, hits Δ)."""
    kw.setdefault("prompt_tokens", 16)
    spec = RampSpec(url=url, model="tiny", levels=[2], step_seconds=6, output_tokens=8, request_timeout=60, **kw)
    q0, h0 = prefix_counters(url)
    res = run_ramp(spec, timeout=180)
    q1, h1 = prefix_counters(url)
    assert res.ok, res.error or res.stop_reason
    st = res.steps[0]
    print(f"{kw}: n={st.n_ok}, TTFT p50 {st.ttft_p50 * 1e3:.1f} ms, prefix cache {h1 - h0:.0f}/{q1 - q0:.0f} "
          f"tokens hit; turns {[(t.turn, t.n, round(t.ttft_p50 * 1e3, 1)) for t in st.turns]}")
    return res, q1 - q0, h1 - h0


SHARED = {"shared_prefix": {"tokens": 256, "fraction": 1.0, "count": 2}}


def test_shared_prefix_ramp_hits_the_servers_prefix_cache(vllm_server):
    res, q, h = ramp(vllm_server.url, **SHARED)
    assert res.steps[0].n_ok >= 4 and res.steps[0].failures == {}
    assert q > 0 and h > 0.5 * q, (q, h)  # ≈ 256 of ≈ 272 tokens of each request after the first two


def test_multi_turn_chat_ramp_reports_per_turn_ttft(vllm_server):
    # 200-token messages: the CPU build caches blocks of 128 tokens (cache_config_info block_size), so
    # a history must pass 128 tokens before a later turn can hit it
    res, q, h = ramp(vllm_server.url, endpoint="/v1/chat/completions", multi_turn={"turns": 3, "think_s": 0.05},
                     length_spread=0.0, prompt_tokens=200)
    st = res.steps[0]
    turns = {t.turn: t for t in st.turns}
    assert set(turns) == {1, 2, 3} and all(t.n >= 1 and t.ttft_p50 > 0 for t in turns.values()), st.turns
    assert st.failures == {} and st.max_in_flight <= 2
    # later turns re-send the history: the server finds it cached
    assert h > 0, (q, h)
    # the server counted the growing history: turn 3's prompt is longer than turn 1's
    by_turn = {}
    for r in res.records:
        by_turn.setdefault(r.turn, []).append(r.prompt_tokens)
    assert min(by_turn[3]) > max(by_turn[1])


def test_shared_prefix_ramp_without_prefix_caching_hits_nothing(vllm_variant_server):
    assert "--no-enable-prefix-caching" in vllm_variant_server.argv
    res, q, h = ramp(vllm_variant_server.url, **SHARED)
    assert res.steps[0].n_ok >= 4
    assert (q, h) == (0, 0)
