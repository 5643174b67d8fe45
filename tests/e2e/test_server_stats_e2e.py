"""The server's own figures per level from a real vLLM's ``/metrics`` (the CPU build,
0.32, tiny model; issue 20, items 3 and 6): prompts sharing a long prefix hit the prefix
cache (on by default in V1), token counts reconcile with the client's, the server's TTFT
agrees with the client's within its buckets plus the client's HTTP overhead.

The shared server runs in dev mode (``VLLM_SERVER_DEV_MODE=1``, tests/conftest.py): the
controller resets its prefix cache before every level. The variant server runs without
it: it offers no ``POST /reset_prefix_cache`` (404), and the levels say the cache was not
reset. No launch of this module's own."""
from __future__ import annotations

import json


from app.config import ServerConfig
from app.loadgen.server_stats import server_summary
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore

#: a document of a few hundred tokens shared by every prompt (several 16-token KV blocks)
SHARED = " ".join(f"Section {i}: the pump at station {i} runs at {i * 7 % 50} litres a minute." for i in range(30))


def _prompts(tmp_path) -> str:
    p = tmp_path / "shared.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"{SHARED}\nQuestion {i}: which station pumps most?"}) + "\n"
                         for i in range(40)))
    return str(p)


def _ramp(url: str, store: RunStore, prompts: str):
    spec = RampSpec(url=url, model="tiny", levels=[2, 4], step_seconds=8, warmup_seconds=1, output_tokens=16,
                    prompts_file=prompts, request_timeout=60)
    ctl = RunController(store=store)
    try:
        ctl.launch(LaunchTarget("attach", ServerConfig(model="tiny"), attach_url=url, attach_model="tiny",
                                telemetry=False))
        res = ctl.ramp(spec, record=RecordSpec(name="server figures e2e"), timeout=240)
    finally:
        ctl.stop()
    assert res.status == "done", res.stop_reason
    for st in res.steps:
        print(f"level {st.level:g}: {st.server.model_dump(exclude={'resolution'}) if st.server else None}")
    return res


def _check_level(st) -> None:
    sv = st.server
    assert sv is not None, "the CPU build serves /metrics"
    # 0.32 counts prefix-cache queries and hits in tokens; the shared document is cached after its first prefill
    assert sv.prefix_cache_queries > 0 and sv.prefix_cache_hit_rate > 0.5, sv
    assert sv.spec_decode_acceptance_rate is None and sv.spec_decode_mean_accepted_length is None
    assert sv.ttft_count > 0 and sv.itl_count > 0 and sv.tpot_count > 0 and sv.queue_count > 0
    # tokens by the server's rule over the same two instants: a step or two of the level's users apart
    assert abs(sv.client_output_tokens - sv.generation_tokens) <= 0.05 * sv.generation_tokens + 2 * st.level, sv
    assert abs(sv.client_prompt_tokens - sv.prompt_tokens) <= 0.05 * sv.prompt_tokens + 400 * st.level, sv
    # the client's TTFT is the engine's plus HTTP, tokenization and streaming: never much below it
    lo = sv.resolution["ttft_p50"][0]
    assert st.ttft_p50 >= lo - 0.005, (st.ttft_p50, sv.resolution["ttft_p50"])
    assert st.ttft_mean >= sv.ttft_mean - 0.02, (st.ttft_mean, sv.ttft_mean)
    assert any(n.startswith("TTFT:") for n in sv.notes) and any(n.startswith("output tokens:") for n in sv.notes)


def test_dev_mode_server_resets_the_prefix_cache_before_each_level(vllm_server, tmp_path):
    """``VLLM_SERVER_DEV_MODE=1``: vLLM 0.32 serves ``POST /reset_prefix_cache``
    (``vllm/entrypoints/serve/dev/cache/api_router.py``, answering ``{"success": true}``)."""
    assert vllm_server.config.env.get("VLLM_SERVER_DEV_MODE") == "1"
    with RunStore() as store:
        res = _ramp(vllm_server.url, store, _prompts(tmp_path))
        stored = store.levels(res.run_id)
    for st in res.steps:
        _check_level(st)
        assert st.server.prefix_cache_reset is True
    assert [d["server"]["prefix_cache_hit_rate"] for d in stored] == [s.server.prefix_cache_hit_rate
                                                                      for s in res.steps]
    assert server_summary(res.steps) == []


def test_a_server_without_dev_mode_records_no_reset(vllm_variant_server, tmp_path):
    """Without dev mode vLLM 0.32 answers ``POST /reset_prefix_cache`` with 404: each level
    records that the cache was not reset (None). This server also runs without prefix
    caching, so it counts no prefix-cache queries and the run's summary has nothing to
    warn about (the "not reset" sentence needs a cache that was hit: tests/unit/
    test_server_stats.py and the sim's tests/integration/test_gui_server_stats.py)."""
    assert "VLLM_SERVER_DEV_MODE" not in vllm_variant_server.config.env
    with RunStore() as store:
        res = _ramp(vllm_variant_server.url, store, _prompts(tmp_path))
    for st in res.steps:
        assert st.server is not None and st.server.prefix_cache_reset is None, st.server
        assert st.server.ttft_count > 0 and st.server.generation_tokens > 0
        assert not st.server.prefix_cache_queries, st.server
    assert server_summary(res.steps) == []
