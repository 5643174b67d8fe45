"""The sim's prefix cache under the load generator's shared-prefix and multi-turn
workloads (issue 20, items 2, 3 and the sim's part): two sims of one rig, prefix caching
at vLLM V1's default (on) and with ``--no-enable-prefix-caching``; the counters read
from ``/metrics`` before and after each ramp (vLLM 0.32's ``vllm:prefix_cache_queries``
/ ``vllm:prefix_cache_hits``, tokens, vllm/v1/metrics/loggers.py). No vLLM needed."""
from __future__ import annotations

import json
import urllib.request

import pytest

from app.config import ServerConfig
from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from app.server.supervisor import Supervisor
from app.telemetry.metrics_parse import parse_metrics

MODEL = "Qwen/Qwen2.5-7B-Instruct"
#: the sims run 2× faster than the wall clock; the specs below are in wall seconds. The
#: TTFT comparisons are measured in wall time, where the HTTP stack adds a few ms per
#: request (tens on a loaded machine): at 20× a 7B prefill of 800 tokens is 7 ms of wall
#: time and the cache's gain drowned in that noise (0.77 for a bound of 0.7 beside a busy
#: core); at 2× it is 70 ms. The levels last 1.5 s of wall time at any K.
K = 2.0
ARGS = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1", "--sim-time-scale", str(K), "--sim-seed", "3"]


def _start(cfg: ServerConfig) -> Supervisor:
    sup = Supervisor(cfg, engine="sim", sim_args=ARGS, startup_timeout=60, grace=5)
    sup.start()
    assert sup.wait_ready(60), f"sim not ready: {sup.failure and sup.failure.reason}"
    return sup


@pytest.fixture(scope="module")
def sims():
    on = _start(ServerConfig(model=MODEL, max_model_len=4096, max_num_seqs=32))
    try:
        off = _start(ServerConfig(model=MODEL, max_model_len=4096, max_num_seqs=32, enable_prefix_caching=False))
        try:
            yield on, off
        finally:
            assert off.stop() == []
    finally:
        assert on.stop() == []


def prefix_counters(url: str) -> tuple[float, float]:
    """(queries, hits) in tokens from the server's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        snap = parse_metrics(r.read().decode())
    return snap.counter("prefix_cache_queries") or 0.0, snap.counter("prefix_cache_hits") or 0.0


def ramp(url: str, **kw):
    spec = RampSpec(url=url, levels=[4], step_seconds=1.5, output_tokens=16, **kw)
    q0, h0 = prefix_counters(url)
    res = run_ramp(spec, timeout=120)
    assert res.ok, res.error or res.stop_reason
    q1, h1 = prefix_counters(url)
    return res, q1 - q0, h1 - h0


def test_shared_prefix_hits_with_caching_on_none_off_and_ttft_gains(sims):
    on, off = sims
    kw = {"prompt_tokens": 64, "shared_prefix": {"tokens": 1024, "fraction": 1.0, "count": 2}}
    res_on, q_on, h_on = ramp(on.url, **kw)
    res_off, q_off, h_off = ramp(off.url, **kw)
    st_on, st_off = res_on.steps[0], res_off.steps[0]
    assert st_on.n_ok > 10 and st_off.n_ok > 10
    # every request starts with one of two 1024-token prefixes: after the first two, ≈ 1024 of ≈ 1100 tokens hit
    assert h_on > 0.7 * q_on > 0, (q_on, h_on)
    assert (q_off, h_off) == (0, 0)  # caching off: vLLM records no prefix-cache stats (no manager stats)
    assert st_on.ttft_p50 < 0.6 * st_off.ttft_p50, (st_on.ttft_p50, st_off.ttft_p50)
    assert st_on.output_tps > st_off.output_tps


def test_multi_turn_reports_per_turn_ttft_and_later_turns_gain_from_the_cache(sims):
    on, off = sims
    kw = {"endpoint": "/v1/chat/completions", "prompt_tokens": 256, "length_spread": 0.0,
          "multi_turn": {"turns": 3}}
    res_on, q_on, h_on = ramp(on.url, **kw)
    res_off, _, h_off = ramp(off.url, **kw)
    t_on = {t.turn: t for t in res_on.steps[0].turns}
    t_off = {t.turn: t for t in res_off.steps[0].turns}
    assert set(t_on) == {1, 2, 3} and all(t.n >= 2 for t in t_on.values()), t_on
    assert {r.turn for r in res_on.records} == {1, 2, 3}
    # turn 3 re-sends two turns of history (≈ 2·(256 + 16) tokens + headers): cached with caching on
    assert h_on > 0.4 * q_on and h_off == 0
    assert t_on[3].ttft_p50 < 0.7 * t_off[3].ttft_p50, (t_on[3], t_off[3])
    # without the cache a later turn prefills its whole history: slower than the first
    assert t_off[3].ttft_p50 > t_off[1].ttft_p50
    # the users hold at most one request each
    assert res_on.steps[0].max_in_flight <= 4


def test_reset_between_levels_empties_the_cache_as_the_planner_assumes(sims):
    """The load generator resets the prefix cache before each level (POST /reset_prefix_cache,
    vLLM's dev-mode route, vllm/entrypoints/serve/dev/cache/api_router.py @ 0.32.0, which the
    sim always serves): each level's first requests miss the shared prefix again, so the
    level's hit rate is what a fresh server gives — the planner's assumption (every level
    starts on empty schedulers). While a request holds blocks the reset is refused
    ({"success": false}), as vLLM's BlockPool.reset_prefix_cache refuses it."""
    on, _ = sims
    req = urllib.request.Request(on.url + "/reset_prefix_cache", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:  # idle: the reset succeeds
        assert json.loads(r.read()) == {"success": True}
    kw = {"prompt_tokens": 64, "shared_prefix": {"tokens": 1024, "fraction": 1.0, "count": 2}}
    spec = RampSpec(url=on.url, levels=[2, 2], step_seconds=1.5, output_tokens=16, **kw)
    res = run_ramp(spec, timeout=120)
    assert res.ok, res.error or res.stop_reason
    for st in res.steps:
        assert st.server is not None and st.server.prefix_cache_reset is True, st.server
        # both levels start cold: the same hit rate within a few requests' worth
        assert 0.5 < st.server.prefix_cache_hit_rate < 0.99, st.server.prefix_cache_hit_rate
    a, b = (st.server.prefix_cache_hit_rate for st in res.steps)
    assert abs(a - b) < 0.1, (a, b)
