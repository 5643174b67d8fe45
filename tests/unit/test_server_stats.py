"""The server's own figures per level (issue 20, items 3, 4 and 6): deltas of vLLM's
``/metrics`` over a window, and their reconciliation with the client's figures.

The exposition texts are written by prometheus_client itself with vLLM's names, types,
labels and buckets (``vllm/v1/metrics/loggers.py`` and ``vllm/v1/spec_decode/metrics.py``
at 0.32.0, the installed CPU build; ``vllm:gpu_prefix_cache_*`` as 0.10 exports them next
to the new names, deprecated since 0.9.2 and hidden from 0.11), so the parser meets the
exact text a server sends.
"""
from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from app.loadgen.records import RequestRecord
from app.loadgen.server_stats import client_tokens, explain, server_summary, server_window, with_notes
from app.loadgen.stats import StepStats, to_rig_time
from app.sim.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from app.telemetry.metrics_parse import histogram_quantile, parse_metrics, quantile_bucket



class VllmExposition:
    """A registry with vLLM's series (one engine), written by prometheus_client."""

    def __init__(self, *, spec_decode: int = 0, old_prefix_names: bool = False, new_prefix_names: bool = True,
                 itl_name: str = "vllm:inter_token_latency_seconds") -> None:
        r = self.r = CollectorRegistry()
        lab = ("model_name", "engine")
        v = ("tiny", "0")

        def c(name: str):
            return Counter(name, name, lab, registry=r).labels(*v)

        def h(name: str, buckets):
            return Histogram(name, name, lab, buckets=buckets, registry=r).labels(*v)

        self.prompt, self.gen = c("vllm:prompt_tokens"), c("vllm:generation_tokens")
        self.queries = c("vllm:prefix_cache_queries") if new_prefix_names else None
        self.hits = c("vllm:prefix_cache_hits") if new_prefix_names else None
        self.old_queries = c("vllm:gpu_prefix_cache_queries") if old_prefix_names else None
        self.old_hits = c("vllm:gpu_prefix_cache_hits") if old_prefix_names else None
        self.success = Counter("vllm:request_success", "", ("model_name", "engine", "finished_reason"),
                               registry=r).labels("tiny", "0", "length")
        self.ttft = h("vllm:time_to_first_token_seconds", TTFT_BUCKETS)
        self.itl = h(itl_name, ITL_BUCKETS)
        self.queue = h("vllm:request_queue_time_seconds", E2E_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", E2E_BUCKETS)
        self.drafts = self.draft_tokens = self.accepted = None
        self.per_pos: list = []
        if spec_decode:  # vllm/v1/spec_decode/metrics.py SpecDecodingProm (0.32.0)
            self.drafts = c("vllm:spec_decode_num_drafts")
            self.draft_tokens = c("vllm:spec_decode_num_draft_tokens")
            self.accepted = c("vllm:spec_decode_num_accepted_tokens")
            pp = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "", lab + ("position",), registry=r)
            self.per_pos = [pp.labels(*v, str(p)) for p in range(spec_decode)]

    def prefix(self, queries: float, hits: float) -> None:
        for q, hh in ((self.queries, self.hits), (self.old_queries, self.old_hits)):
            if q is not None:
                q.inc(queries)
                hh.inc(hits)

    def text(self) -> str:
        return generate_latest(self.r).decode()

    def snap(self):
        return parse_metrics(self.text())


def test_prefix_cache_hit_rate_is_the_delta_over_the_window():
    x = VllmExposition()
    x.prefix(100, 40)  # before the window: another level's traffic
    before = x.snap()
    x.prefix(200, 150)
    s = server_window(before, x.snap(), scrape_start=1.0, scrape_end=2.0)
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (200, 150)
    assert s.prefix_cache_hit_rate == pytest.approx(0.75)


def test_prefix_cache_0_10_exports_both_names_and_they_are_not_summed():
    x = VllmExposition(old_prefix_names=True)
    before = x.snap()
    x.prefix(200, 50)
    assert "vllm:gpu_prefix_cache_queries_total" in x.text()
    s = server_window(before, x.snap(), scrape_start=0, scrape_end=1)
    assert (s.prefix_cache_queries, s.prefix_cache_hit_rate) == (200, 0.25)


def test_prefix_cache_old_names_alone_are_read():
    x = VllmExposition(old_prefix_names=True, new_prefix_names=False)
    before = x.snap()
    x.prefix(80, 60)
    s = server_window(before, x.snap(), scrape_start=0, scrape_end=1)
    assert s.prefix_cache_hit_rate == pytest.approx(0.75)


def test_prefix_cache_hit_rate_is_null_without_queries_or_counters():
    x = VllmExposition()
    x.prefix(100, 10)
    before = x.snap()
    s = server_window(before, x.snap(), scrape_start=0, scrape_end=1)  # caching off: nothing queried
    assert s.prefix_cache_queries == 0 and s.prefix_cache_hit_rate is None
    y = VllmExposition(new_prefix_names=False)
    s = server_window(y.snap(), y.snap(), scrape_start=0, scrape_end=1)
    assert s.prefix_cache_queries is None and s.prefix_cache_hit_rate is None


def test_spec_decode_acceptance_and_mean_accepted_length_as_vllm_logs_them():
    x = VllmExposition(spec_decode=3)
    x.drafts.inc(10)
    x.draft_tokens.inc(30)
    x.accepted.inc(12)
    before = x.snap()
    # 20 drafts of 3 tokens, 36 accepted: position 0 accepted 16 times, 1 12, 2 8
    x.drafts.inc(20)
    x.draft_tokens.inc(60)
    x.accepted.inc(36)
    for p, n in zip(x.per_pos, (16, 12, 8)):
        p.inc(n)
    s = server_window(before, x.snap(), scrape_start=0, scrape_end=1)
    assert s.spec_decode_acceptance_rate == pytest.approx(36 / 60)
    # SpecDecodingLogging.log: mean_acceptance_length = 1 + accepted / drafts (the bonus token)
    assert s.spec_decode_mean_accepted_length == pytest.approx(1 + 36 / 20)
    assert s.spec_decode_acceptance_per_position == pytest.approx([0.8, 0.6, 0.4])


def test_spec_decode_is_null_when_not_served():
    x = VllmExposition()
    s = server_window(x.snap(), x.snap(), scrape_start=0, scrape_end=1)
    assert s.spec_decode_acceptance_rate is None and s.spec_decode_mean_accepted_length is None
    assert s.spec_decode_acceptance_per_position is None


def test_server_percentiles_come_from_the_window_and_state_their_bucket():
    x = VllmExposition()
    for _ in range(50):
        x.ttft.observe(3.0)  # an earlier level's slow requests: outside the window
    before = x.snap()
    rng = np.random.default_rng(1)
    obs = rng.uniform(0.11, 0.24, 200)
    for v in obs:
        x.ttft.observe(v)
        x.queue.observe(0.01)
    for v in rng.uniform(0.02, 0.05, 1000):
        x.itl.observe(v)
    s = server_window(before, x.snap(), scrape_start=0, scrape_end=1)
    assert s.ttft_count == 200
    assert s.ttft_mean == pytest.approx(obs.mean())  # exact: Δsum ÷ Δcount
    assert s.resolution["ttft_p50"] == [0.1, 0.25]  # only known to lie in vLLM's 0.1–0.25 s bucket
    assert 0.1 <= s.ttft_p50 <= 0.25 and s.ttft_p99 <= 0.25  # the 3 s requests before the window are not in it
    assert abs(s.ttft_p50 - np.percentile(obs, 50)) <= 0.15
    assert s.queue_p99 <= 0.3 and s.itl_count == 1000 and s.resolution["itl_p50"] == [0.025, 0.05]
    assert s.tpot_p50 is None and "tpot_p50" not in s.resolution  # not exported here


def test_itl_read_under_its_old_name():
    x = VllmExposition(itl_name="vllm:time_per_output_token_seconds")
    before = x.snap()
    x.itl.observe(0.03)
    s = server_window(before, x.snap(), scrape_start=0, scrape_end=1)
    assert s.itl_count == 1 and s.itl_mean == pytest.approx(0.03)


def test_quantile_bucket_matches_histogram_quantile():
    b = [(0.1, 0.0), (0.25, 10.0), (0.5, 10.0), (float("inf"), 12.0)]
    assert quantile_bucket(0.5, b) == (0.1, 0.25)
    assert 0.1 <= histogram_quantile(0.5, b) <= 0.25
    assert quantile_bucket(0.99, b) == (0.5, float("inf"))
    assert quantile_bucket(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_counter_reset_between_scrapes_counts_from_zero():
    x = VllmExposition()
    x.gen.inc(500)
    before = x.snap()
    y = VllmExposition()  # the server restarted
    y.gen.inc(30)
    assert server_window(before, y.snap(), scrape_start=0, scrape_end=1).generation_tokens == 30


def _rec(t_start, offsets, out, prompt=100, status="ok"):
    return RequestRecord(level_idx=0, level=1, t_start=t_start, ttft=offsets[0] if offsets else None,
                         e2e=offsets[-1] if offsets else None, prompt_tokens=prompt, output_tokens=out,
                         status=status, chunk_offsets=np.array(offsets, dtype=np.float32))


def test_client_tokens_follow_the_servers_counting_rule():
    recs = [
        _rec(0.0, [0.5, 1.0, 1.5, 2.0], 8),  # first chunk before the window: its prompt is not counted
        _rec(2.0, [0.5, 1.0], 2, prompt=50),  # wholly inside
        _rec(4.5, [0.2, 0.8], 4, prompt=70),  # first chunk inside, last after the window
        _rec(6.0, [], 0, prompt=999, status="http_500"),
    ]
    prompt, out = client_tokens(recs, 1.2, 5.0)
    # chunks in [1.2, 5]: 1.5 and 2.0 of the first (2 tokens each), both of the second, 4.7 of the third (2)
    assert out == pytest.approx(2 * 2 + 2 + 2)
    assert prompt == 50 + 70


def _level(**kw):
    base = dict(idx=0, level=4, t_start=0, t_end=10, window_start=1, window_end=9, window_s=8, n_ok=40)
    base.update(kw)
    return StepStats(**base)


def test_explain_names_overhead_queueing_and_token_agreement():
    x = VllmExposition()
    before = x.snap()
    for _ in range(40):
        x.ttft.observe(1.1)
        x.queue.observe(0.8)
        x.itl.observe(0.03)
    x.gen.inc(1000)
    x.prompt.inc(4000)
    sv = server_window(before, x.snap(), scrape_start=1, scrape_end=9)
    sv.client_output_tokens, sv.client_prompt_tokens = 998, 4000
    st = _level(ttft_mean=1.112, ttft_p50=1.11, itl_mean=0.0301, itl_p50=0.03, server=sv)
    notes = explain(st)
    assert any(n.startswith("TTFT: the client's mean exceeds the server's by 12 ms") for n in notes), notes
    assert any(n.startswith("ITL: client and server agree") for n in notes), notes
    assert any(n.startswith("queueing: queue time p99") for n in notes), notes
    assert any(n.startswith("output tokens: client 998 (usage) and server 1000") and "agree" in n for n in notes)
    assert any(n.startswith("prompt tokens:") and "agree" in n for n in notes)
    assert with_notes(st).server.notes == notes
    assert explain(st.model_dump(mode="json")) == notes  # a stored level (its dict) explains alike


def test_explain_prefill_and_token_gaps():
    x = VllmExposition()
    before = x.snap()
    for _ in range(40):
        x.ttft.observe(0.2)
        x.queue.observe(0.001)
    x.gen.inc(1500)
    sv = server_window(before, x.snap(), scrape_start=1, scrape_end=9)
    sv.client_output_tokens = 1000
    notes = explain(_level(ttft_mean=0.15, server=sv))
    assert any(n.startswith("TTFT: the server's mean exceeds the client's") for n in notes), notes
    assert any(n.startswith("prefill:") for n in notes), notes
    assert any(n.startswith("output tokens: the server counted 500 more") for n in notes), notes
    assert explain(_level()) == []


def test_summary_says_once_what_is_missing():
    assert server_summary([_level(), _level(idx=1)]) == []  # not asked: a run from before server figures
    assert server_summary([_level(server_problem="GET /metrics: HTTP 404"), _level(idx=1)]) == [
        "the server's /metrics did not answer (GET /metrics: HTTP 404; not vLLM?): the levels have no "
        "server-side figures"]
    x = VllmExposition()
    before = x.snap()
    x.prefix(100, 50)
    sv = server_window(before, x.snap(), scrape_start=0, scrape_end=1)
    (msg,) = server_summary([_level(server=sv)])
    assert "not reset" in msg and "VLLM_SERVER_DEV_MODE=1" in msg
    assert server_summary([_level(server=sv.model_copy(update={"prefix_cache_reset": True}))]) == []


def test_rig_time_scales_only_the_scrape_instants():
    x = VllmExposition()
    before = x.snap()
    x.ttft.observe(0.2)
    sv = server_window(before, x.snap(), scrape_start=1.0, scrape_end=3.0)
    st = to_rig_time(_level(ttft_p50=0.05, server=sv), 4.0)
    assert st.ttft_p50 == pytest.approx(0.2)  # client: wall × k
    assert st.server.ttft_mean == pytest.approx(0.2)  # server: already rig seconds
    assert (st.server.scrape_start, st.server.scrape_end) == (4.0, 12.0)


def test_explain_says_a_sims_overhead_is_wall_time_times_k():
    x = VllmExposition()
    before = x.snap()
    for _ in range(10):
        x.ttft.observe(0.5)
    sv = server_window(before, x.snap(), scrape_start=1, scrape_end=9)
    (line,) = [n for n in explain(_level(ttft_mean=0.54, server=sv), k=8) if n.startswith("TTFT")]
    assert "by 40 ms" in line and "a sim 8× faster: 5 ms of wall time" in line


def test_summary_names_the_levels_whose_reset_failed():
    x = VllmExposition()
    before = x.snap()
    x.prefix(100, 50)
    sv = server_window(before, x.snap(), scrape_start=0, scrape_end=1, prefix_cache_reset=True)
    levels = [_level(server=sv), _level(idx=1, level=8, server=sv.model_copy(update={"prefix_cache_reset": False}))]
    (msg,) = server_summary(levels)
    assert msg.startswith("the prefix cache reset failed before level(s) 8")
