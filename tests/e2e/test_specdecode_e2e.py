"""Speculative decoding on the real CPU build (issue 20, item 4): vLLM 0.32's CPU
platform serves ``--speculative-config`` (vllm/v1/worker/cpu_model_runner.py: "speculative
decoding is now supported on CPU with C++ native impls"; ngram needs no draft model). One
launch of the tiny model with an ngram config, a short ramp of repetitive prompts, and
vLLM's own spec-decode counters read from its real ``/metrics`` (the session's variant
server, tests/conftest.py, shared with other tests: the counters are read as differences)
(``vllm:spec_decode_num_drafts``, ``…_num_draft_tokens``, ``…_num_accepted_tokens``,
``…_num_accepted_tokens_per_pos{position}``, vllm/v1/spec_decode/metrics.py
``SpecDecodingProm``). The tiny random model decodes greedily (the load generator's
temperature 0) into loops, which n-gram lookup then predicts."""
from __future__ import annotations

import json
import urllib.request

import pytest

from app.telemetry.metrics_parse import parse_metrics
from tests.conftest import NGRAM


COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


@pytest.fixture
def spec_server(vllm_variant_server):
    assert vllm_variant_server.config.speculative_config == NGRAM
    return vllm_variant_server


def _metrics(url: str):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return parse_metrics(text), text


def test_ngram_speculative_decoding_counts_drafts_on_the_cpu_build(spec_server, tmp_path, capsys):
    from app.loadgen.generator import run_ramp
    from app.loadgen.spec import RampSpec
    from app.planner.cards import cards_for
    from app.planner.models import resolve_model
    from app.planner.plan import plan

    before, text = _metrics(spec_server.url)
    # the counters exist from the start (one per position for the per-position one)
    assert all(before.counter(c) is not None for c in COUNTERS), text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"}' in text
    prompts = tmp_path / "repetitive.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join([w] * 12 + ["a b c"] * 6)}) + "\n"
                               for w in ("one", "two", "three", "four")))
    spec = RampSpec(url=spec_server.url, model="tiny", levels=[1, 2], step_seconds=4.0, warmup_seconds=0.5,
                    prompts_file=prompts, output_tokens=48, length_spread=0.0, ignore_eos=True, max_total_seconds=60)
    res = run_ramp(spec, timeout=120)
    assert res.ok, res.stop_reason
    ok = [r for r in res.records if r.ok]
    assert ok and all(r.output_tokens == 48 and r.tokens_source == "server_usage" for r in ok)
    after, text = _metrics(spec_server.url)
    drafts, drafted, accepted = (after.counter(c) - before.counter(c) for c in COUNTERS)
    assert drafts > 0 and drafted > 0 and accepted > 0, text
    assert drafted <= 2 * drafts and accepted <= drafted
    # every output token was generated: vLLM's generation counter and the usage agree
    assert (after.counter("generation_tokens") - before.counter("generation_tokens")
            == sum(r.output_tokens for r in res.records))
    # accepted drafts reach the client several tokens a chunk: fewer chunks than tokens
    chunks = sum(r.chunk_offsets.size for r in ok)
    tokens = sum(r.output_tokens for r in ok)
    assert chunks < tokens
    # the planner counts no draft memory for ngram: its KV tokens still match the log
    p = plan(spec_server.config, cards_for(cpu_build=True), resolve_model(spec_server.config.model),
             vllm_version=spec_server.parser.facts.version, use_calibration=False)
    assert p.draft is not None and p.draft.weight_bytes == 0
    f = spec_server.parser.facts
    assert abs(p.kv_cache_tokens - f.kv_cache_tokens) <= 0.02 * f.kv_cache_tokens
    # the step-level engine (the sim's and the planner's) at the measured acceptance, same ramp
    from dataclasses import replace

    from app.engine.specdecode import acceptance_from_rate
    from app.planner.predict import predict_ramp

    a = acceptance_from_rate(accepted / drafted, 2)
    prompt = round(sum(r.prompt_tokens or 0 for r in ok) / len(ok))
    pspec = RampSpec(url=spec_server.url, levels=[1, 2], step_seconds=4.0, warmup_seconds=0.5, prompt_tokens=prompt,
                     output_tokens=48, length_spread=0.0, ignore_eos=True)
    pred = predict_ramp(p.perf, replace(p.engine_limits(), spec_acceptance=a), pspec).steps
    with capsys.disabled():
        print(f"\nvLLM CPU ngram k=2: {drafts:.0f} drafts, {drafted:.0f} draft tokens, {accepted:.0f} accepted "
              f"(acceptance {accepted / drafted:.2f}, a = {a:.3f} a position, mean accepted length "
              f"{1 + accepted / drafts:.2f}); {tokens} tokens in {chunks} chunks")
        for s, q in zip(res.steps, pred):
            print(f"  c={s.level:g} measured {s.output_tps:5.0f} tok/s TPOT {s.tpot_mean * 1e3:5.1f} ms ITL "
                  f"{s.itl_mean * 1e3:5.1f} ms | engine {q.output_tps:5.0f} tok/s TPOT {q.tpot_mean * 1e3:5.1f} ms "
                  f"ITL {q.itl_mean * 1e3:5.1f} ms")
    # No bound on the throughput: the default CPU parameters are not calibrated to this
    # machine, and on the shared 2-core machine one run measured c=1 at 196 tok/s, the next
    # at 54. And vLLM's ngram drafts only where it finds a match (here a third of the steps
    # had none: 200 drafts in 302 decode steps), which num_drafts does not count, while the
    # engine drafts k every step: its tokens per chunk (ITL ÷ TPOT) are an upper bound.
    for s, q in zip(res.steps, pred):
        assert q.itl_mean / q.tpot_mean > 0.9 * s.itl_mean / s.tpot_mean, (s.itl_mean, s.tpot_mean, q.itl_mean)
