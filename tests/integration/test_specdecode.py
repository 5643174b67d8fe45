"""Speculative decoding (issue 20, item 4): the ``--speculative-config`` option, the
engine's verification steps and acceptance, the step time, the planner's draft memory,
the sim's chunks and vLLM's ``vllm:spec_decode_*`` counters, and the load generator's
per-token and per-chunk figures on multi-token chunks. No vLLM needed (the CPU build's
own spec-decode counters: tests/e2e/test_specdecode_e2e.py)."""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

import numpy as np
import pytest
from pydantic import ValidationError

from app.config import ServerConfig, add_server_options, config_from_namespace
from app.engine.scheduler import Request, Scheduler
from app.engine.specdecode import (DEFAULT_ACCEPTANCE, draft_acceptance_rate, expected_accepted, geometric_accept,
                                   mean_accepted_length)
from app.loadgen.records import RequestRecord
from app.loadgen.stats import compute_step_stats

NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


# ---------------------------------------------------------------------- the option
def test_speculative_config_round_trips_argv_yaml_and_the_command_line():
    c = ServerConfig(model="m", speculative_config=NGRAM)
    argv = c.option_argv()
    assert argv[:2] == ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}']
    assert ServerConfig.from_command_line(c.shell_command()) == c
    assert ServerConfig.from_vllm_config_yaml(c.to_vllm_config_yaml()) == c
    # a profile's server: mapping may write it as a nested mapping (vLLM 0.32's --config does too)
    assert ServerConfig.from_vllm_config_yaml("model: m\nspeculative-config:\n  method: ngram\n"
                                              "  num_speculative_tokens: 2\n  prompt_lookup_max: 3\n") == c
    assert c.num_speculative_tokens == 2 and c.speculative_method == "ngram"
    assert ServerConfig(model="m").num_speculative_tokens == 0
    assert ServerConfig(model="m", speculative_config={"method": "deepseek_mtp"}).speculative_method == "mtp"


@pytest.mark.parametrize("value, words", [
    ({"method": "lookahead", "num_speculative_tokens": 2}, ["method 'lookahead'", "ngram, eagle, eagle3"]),
    ({"method": "eagle", "num_speculative_tokens": 3}, ["method 'eagle' needs a draft", 'add "model"']),
    ({"method": "draft_model", "num_speculative_tokens": 3}, ["needs a draft", "use method \"ngram\""]),
    ({"num_speculative_tokens": 3}, ["'draft_model' needs a draft"]),  # vLLM's inference without a method
    ({"method": "ngram"}, ["needs num_speculative_tokens", '"num_speculative_tokens": 3']),
    ({"method": "ngram", "num_speculative_tokens": 0}, ["num_speculative_tokens=0", "≥ 1"]),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     ["prompt_lookup_min=4 must be ≤ prompt_lookup_max=2"]),
    ('{"method": "ngram"', ["is not JSON", "write an object such as"]),
    ("[1, 2]", ["must be a JSON object"]),
])
def test_a_bad_speculative_config_names_the_key_and_the_fix(value, words):
    with pytest.raises(ValidationError) as e:
        ServerConfig(model="m", speculative_config=value)
    msg = str(e.value)
    assert "speculative_config" in msg
    for w in words:
        assert w in msg, msg


def test_the_command_line_refuses_a_bad_speculative_config_with_exit_2():
    p = argparse.ArgumentParser()
    add_server_options(p)
    ns = p.parse_args(["--model", "m", "--speculative-config", '{"method": "eagle3", "model": "h", '
                                                                 '"num_speculative_tokens": 4}'])
    assert config_from_namespace(ns).speculative_config["method"] == "eagle3"
    r = subprocess.run([sys.executable, "-m", "app.cli", "plan", "--model", "meta-llama/Llama-3.1-8B", "--gpu",
                        "RTX 4090", "--speculative-config", '{"method": "eagle"}'], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--speculative-config" in r.stderr and "needs a draft" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------- acceptance and the engine
def test_geometric_acceptance_per_position_is_a_to_the_i():
    """Position i (1-based) accepted with a^i: the per-position rates vLLM's
    vllm:spec_decode_num_accepted_tokens_per_pos ÷ num_drafts shows."""
    a, k, n = 0.7, 4, 40000
    acc = geometric_accept(a, random.Random(5))
    per_pos = np.zeros(k)
    total = 0
    for _ in range(n):
        x = acc(None, k)
        total += x
        per_pos[:x] += 1
    for i in range(k):
        assert per_pos[i] / n == pytest.approx(a ** (i + 1), abs=0.01)
    assert total / n == pytest.approx(expected_accepted(a, k), rel=0.02)
    assert mean_accepted_length(a, k) == pytest.approx(1 + 0.7 + 0.49 + 0.343 + 0.2401)
    assert draft_acceptance_rate(a, k) == pytest.approx(expected_accepted(a, k) / 4)
    assert draft_acceptance_rate(1.0, 3) == 1.0 and draft_acceptance_rate(0.0, 3) == 0.0


class _Chunks:
    def __init__(self):
        self.sizes, self.seen = [], 0

    def on_token(self, req, t):
        self.sizes.append(req.output - self.seen)
        self.seen = req.output

    def on_finish(self, req, t):
        pass


def _drive(k: int, accept, max_tokens=20, eos_at=None, seqs=4):
    shapes = []

    def step_time(b, ctx, n, attn, *spec):
        shapes.append((b, n, spec))
        return 0.01

    s = Scheduler(1000, seqs, 4096, step_time, spec_tokens=k, accept=accept)
    sink = _Chunks()
    r = Request("r", 32, max_tokens, 0.0, eos_at, sink)
    s.add(r)
    t = 0.0
    while s.has_work:
        st = s.schedule(t)
        t += st.dt
        s.complete(st, t)
    return s, r, sink.sizes, shapes


def test_every_draft_accepted_emits_k_plus_one_tokens_a_step_in_one_chunk():
    s, r, chunks, shapes = _drive(3, lambda req, k: k, max_tokens=21)
    assert r.output == 21 and r.finish_reason == "length"
    assert chunks == [1, 4, 4, 4, 4, 4]  # the prefill's token, then 1 + 3 a step
    assert shapes[0] == (0, 32, (0,))  # the prefill step: no drafts
    assert all(b == 1 and spec == (3,) for b, _, spec in shapes[1:])  # each decode verifies 3 drafts
    assert (s.spec_drafts, s.spec_draft_tokens, s.spec_accepted) == (5, 15, 15)
    assert s.spec_accepted_per_pos == [5, 5, 5]
    assert s.generation_tokens == 21


def test_no_draft_accepted_is_one_token_a_step_and_drafts_stop_at_max_tokens():
    s, r, chunks, shapes = _drive(3, lambda req, k: 0, max_tokens=6)
    assert chunks == [1] * 6 and r.output == 6
    # drafts never run past max_tokens: after the prefill's token the steps verify 3, 3, 2, 1, 0 drafts
    assert [spec[0] for _, _, spec in shapes[1:]] == [3, 3, 2, 1, 0]
    assert s.spec_accepted == 0 and s.spec_accepted_per_pos == [0, 0, 0]


def test_eos_inside_an_accepted_run_ends_the_chunk_there():
    _, r, chunks, _ = _drive(3, lambda req, k: k, max_tokens=100, eos_at=7)
    assert r.output == 7 and r.finish_reason == "stop" and chunks == [1, 4, 2]


def test_without_speculative_decoding_the_step_time_gets_four_arguments():
    s, r, chunks, shapes = _drive(0, None, max_tokens=5)
    assert chunks == [1] * 5 and all(spec == () for _, _, spec in shapes)


# ---------------------------------------------------------------------- step time
def _plan(spec=None, model="meta-llama/Llama-3.1-70B", gpu="H100 SXM", count=4, spec_acceptance=None, **kw):
    from app.planner.gpus import lookup_gpu
    from app.planner.models import resolve_model
    from app.planner.plan import Workload, plan

    cfg = ServerConfig(model=model, tensor_parallel_size=count, max_model_len=8192, speculative_config=spec, **kw)
    return plan(cfg, [lookup_gpu(gpu)] * count, resolve_model(model), Workload.of(512, 128), use_calibration=False,
                spec_acceptance=spec_acceptance)


def test_verification_costs_like_a_k_plus_one_token_chunk_and_a_draft_adds_its_passes():
    base = _plan().perf
    ngram = _plan(NGRAM).perf
    draft = _plan({"method": "draft_model", "model": "meta-llama/Llama-3.1-8B", "num_speculative_tokens": 4}).perf
    b, ctx = 8, 8 * 600.0
    t1 = base.step_time(b, ctx, 0, 0.0)
    # ngram: the same forward pass with 2 more query tokens per sequence; weights and KV read once
    t_ng = ngram.step_time(b, ctx, 0, 0.0, 2 * b)
    assert ngram.draft is None and t1 < t_ng < 1.25 * t1
    assert ngram.step_time(b, ctx, 0, 0.0, 0) == pytest.approx(t1)
    # a draft model adds k of its own decode passes: more than the ngram step, less than k target steps
    t_dm = draft.step_time(b, ctx, 0, 0.0, 4 * b)
    assert draft.draft is not None
    extra = draft.draft_s(b, 600.0, 0, 0.0, 4 * b)
    assert extra == pytest.approx(4 * draft.draft._forward(b, 600.0, 0, 0))
    assert t_dm > base.step_time(b, ctx, 0, 0.0, 4 * b) and extra < 4 * t1


def test_predicted_decode_gains_from_accepted_tokens():
    """At one user the engine's TPOT falls by about the mean accepted length (ngram: no
    draft passes), and more acceptance means faster tokens."""
    from app.engine.specdecode import mean_accepted_length as mal
    from app.planner.predict import EngineLimits, predict_ramp

    p0, p1 = _plan(), _plan({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    spec = p0.workload.ramp_spec([1])
    t0 = predict_ramp(p0.perf, p0.engine_limits(), spec).steps[0].tpot_mean
    lim = p1.engine_limits()
    assert lim.spec_tokens == 3 and lim.spec_acceptance == DEFAULT_ACCEPTANCE
    t1 = predict_ramp(p1.perf, lim, spec).steps[0].tpot_mean
    assert 0.6 * mal(0.7, 3) < t0 / t1 < 1.05 * mal(0.7, 3)
    hi = EngineLimits(lim.num_blocks, lim.max_num_seqs, lim.max_num_batched_tokens, 1, 3, 0.95)
    assert predict_ramp(p1.perf, hi, spec).steps[0].tpot_mean < t1


# ---------------------------------------------------------------------- planner memory
def test_the_draft_models_weights_and_kv_come_off_the_kv_budget():
    base = _plan()
    d = _plan({"method": "draft_model", "model": "meta-llama/Llama-3.1-8B", "num_speculative_tokens": 4})
    r0, r1 = base.ranks[0], d.ranks[0]
    from app.planner.models import resolve_model

    small = resolve_model("meta-llama/Llama-3.1-8B")
    assert r1.draft_weights_gib == pytest.approx(small.weight_bytes(None, 2) / 4 / 2**30)
    assert r1.weights_gib == pytest.approx(r0.weights_gib + r1.draft_weights_gib)
    assert r1.draft_kv_bytes_per_token == small.kv_bytes_per_token(2, 4) == 32768
    assert r1.kv_gib == pytest.approx(r0.kv_gib - r1.draft_weights_gib)
    # every KV token now holds the target's and the draft's layers
    ratio = r0.kv_bytes_per_token / (r0.kv_bytes_per_token + r1.draft_kv_bytes_per_token)
    assert d.kv_cache_tokens == pytest.approx(base.kv_cache_tokens * ratio * r1.kv_gib / r0.kv_gib, rel=0.01)
    from app.planner.render import render_plan

    text = render_plan(d)
    assert "speculative decoding: draft_model, 4 draft tokens a step" in text and "draft weights 3.74 GiB" in text
    assert d.as_dict()["speculative"]["num_speculative_tokens"] == 4


def test_ngram_needs_no_memory_and_an_unknown_eagle_head_is_one_layer():
    base, ng = _plan(), _plan(NGRAM)
    assert ng.kv_cache_tokens == base.kv_cache_tokens and ng.ranks[0].draft_weights_gib == 0
    eagle = _plan({"method": "eagle", "model": "nobody/EAGLE-head", "num_speculative_tokens": 3})
    m = eagle.model
    layer = m.layer_params(0) * 2 / 4 / 2**30
    assert eagle.ranks[0].draft_weights_gib == pytest.approx(layer)
    assert eagle.ranks[0].draft_kv_bytes_per_token == m.kv_bytes_per_token(2, 4, 1)
    assert "assumed one decoder layer" in eagle.draft.note
    assert "speculative_draft_unknown" not in eagle.problems()


def test_a_draft_model_the_planner_cannot_read_is_a_warning_naming_the_key():
    p = _plan({"method": "draft_model", "model": "nobody/tiny-draft", "num_speculative_tokens": 3})
    f = next(f for f in p.findings if f.problem == "speculative_draft_unknown")
    assert f.verdict == "warn" and "nobody/tiny-draft" in f.message and "speculative_config" in f.message


def test_the_option_tooltip_gives_the_drafts_memory_and_the_prediction():
    from app.planner.option_help import option_notes

    n = option_notes(_plan({"method": "draft_model", "model": "meta-llama/Llama-3.1-8B",
                            "num_speculative_tokens": 4}))["speculative_config"]
    assert "ngram needs no draft model" in n.default
    assert any("3.74 GiB of draft weights" in a for a in n.advice)
    assert any("predicted at 1 user" in a for a in n.advice)


# ---------------------------------------------------------------------- the load generator
def test_tpot_per_token_and_itl_per_chunk_with_multi_token_chunks():
    """Chunks of 1 + accepted tokens: TPOT = (e2e − TTFT)/(tokens − 1) per token, ITL
    the gap between chunks, output tokens/s by the usage's count (not the chunks)."""
    # first chunk at 0.1 s (1 token), then 4 chunks of 3 tokens every 0.03 s: 13 tokens
    offs = np.array([0.1, 0.13, 0.16, 0.19, 0.22], dtype=np.float32)
    recs = [RequestRecord(0, 1, t_start=float(i), ttft=0.1, e2e=0.22, prompt_tokens=8, output_tokens=13,
                          tokens_source="server_usage", chunk_offsets=offs) for i in range(10)]
    st = compute_step_stats(recs, idx=0, level=1, mode="concurrency", t_start=0, t_end=10.22, window_start=0,
                            window_end=10.0)
    assert st.tpot_mean == pytest.approx(0.12 / 12)  # 10 ms a token
    assert st.itl_mean == pytest.approx(0.03, rel=1e-4)  # 30 ms a chunk = 3 tokens × TPOT
    assert st.output_tps == pytest.approx(10 * 13 / 10.0)  # usage's 13 tokens each, not 5 chunks
    # a window that cuts the last request after 2 of its 5 chunks counts 2 × 13/5 of its tokens
    # (app/loadgen/stats.py: each chunk weighted by its request's tokens ÷ chunks)
    cut = compute_step_stats(recs, idx=0, level=1, mode="concurrency", t_start=0, t_end=10.22, window_start=0,
                             window_end=9.15)
    assert cut.output_tps == pytest.approx((9 * 13 + 2 * 13 / 5) / 9.15)


# ---------------------------------------------------------------------- the sim serves it
def test_sim_streams_accepted_tokens_in_chunks_and_counts_them_as_vllm_does():
    """The sim with an ngram config (k = 3) and --sim-spec-acceptance 0.6: a ramp's
    requests get usage's token counts, fewer chunks than tokens (≈ 1 + 0.6 + 0.36 +
    0.216 tokens a chunk), ITL ≈ TPOT × tokens per chunk; /metrics has vLLM's four
    spec_decode counters, whose ratios are the acceptance model's."""
    from prometheus_client.parser import text_string_to_metric_families

    from app.loadgen.generator import run_ramp
    from app.loadgen.spec import RampSpec
    from app.server.supervisor import Supervisor
    from app.telemetry.metrics_parse import parse_metrics
    import urllib.request

    a, k = 0.6, 3
    cfg = ServerConfig(model="meta-llama/Llama-3.1-8B", served_model_name="llama8", max_model_len=4096,
                       max_num_seqs=16, speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                                            "prompt_lookup_max": 3})
    sup = Supervisor(cfg, engine="sim", sim_args=["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1",
                                                  "--sim-time-scale", "10", "--sim-spec-acceptance", str(a)],
                     startup_timeout=60, grace=5)
    sup.start()
    try:
        assert sup.wait_ready(60), sup.failure
        spec = RampSpec(url=sup.url, model="llama8", levels=[1, 4], step_seconds=3.0, warmup_seconds=0.3,
                        prompt_tokens=256, output_tokens=64, ignore_eos=True, length_spread=0.0)
        res = run_ramp(spec, timeout=120)
        assert res.ok, res.stop_reason
        ok = [r for r in res.records if r.ok]
        assert len(ok) > 20
        assert all(r.output_tokens == 64 and r.tokens_source == "server_usage" for r in ok)
        chunks = np.mean([r.chunk_offsets.size for r in ok])
        per_chunk = 63 / (chunks - 1)  # the first chunk is the prefill's one token
        assert per_chunk == pytest.approx(mean_accepted_length(a, k), rel=0.12), per_chunk
        for st in res.steps:
            assert st.itl_mean == pytest.approx(st.tpot_mean * per_chunk, rel=0.2), (st.itl_mean, st.tpot_mean)
        info = json.loads(urllib.request.urlopen(sup.url + "/sim/info", timeout=10).read())
        assert info["speculative"] == {"method": "ngram", "num_speculative_tokens": k, "acceptance": a}
        text = urllib.request.urlopen(sup.url + "/metrics", timeout=10).read().decode()
        m = parse_metrics(text)
        drafts, drafted = m.counter("spec_decode_num_drafts"), m.counter("spec_decode_num_draft_tokens")
        accepted = m.counter("spec_decode_num_accepted_tokens")
        assert drafts and drafted and accepted
        gen = m.counter("generation_tokens")
        assert gen == sum(r.output_tokens for r in res.records)
        assert accepted / drafted == pytest.approx(draft_acceptance_rate(a, k), rel=0.12)
        assert 1 + accepted / drafts == pytest.approx(mean_accepted_length(a, k), rel=0.12)
        per_pos = {s.labels["position"]: s.value for f in text_string_to_metric_families(text)
                   if f.name == "vllm:spec_decode_num_accepted_tokens_per_pos" for s in f.samples
                   if s.name.endswith("_total")}
        assert sorted(per_pos) == ["0", "1", "2"]
        for i in range(k):
            assert per_pos[str(i)] / drafts == pytest.approx(a ** (i + 1), abs=0.05)
        # and vLLM's log line every 5 s (vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log)
        assert any("SpecDecoding metrics: Mean acceptance length: " in ln and "Per-position acceptance rate: " in ln
                   for ln in sup.log_tail(400)), sup.log_tail(40)
    finally:
        assert sup.stop() == []


# ---------------------------------------------------------------------- vLLM's refusals
# vLLM 0.32.0 (the CPU build in .venv-vllm): EngineArgs(model=build/tiny-llama,
# speculative_config=…).create_engine_config(), raised in SpeculativeConfig.__post_init__
# (vllm/config/speculative.py) and by pydantic for the `method` literal
_URL = "    For further information visit https://errors.pydantic.dev/2.14/v/"
NO_DRAFT_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
  Value error, num_speculative_tokens was provided but without speculative model. [type=value_error, input_value=ArgsKwargs((), {'method':...very_timeout_sec=120))}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"
LOOKUP_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
  Value error, prompt_lookup_min=4 must be <= prompt_lookup_max=2 [type=value_error, input_value=ArgsKwargs((), {'method':...very_timeout_sec=120))}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"
METHOD_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
method
  Input should be 'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', 'custom_class', 'eagle', 'eagle3', 'extract_hidden_states', 'deepseek_mtp', 'mtp', 'dflash', 'ngram_gpu' or 'dspark' [type=literal_error, input_value='lookahead', input_type=str]
""" + _URL + "literal_error\n"
KEY_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
foo
  Unexpected keyword argument [type=unexpected_keyword_argument, input_value=1, input_type=int]
""" + _URL + "unexpected_keyword_argument\n"


@pytest.mark.parametrize("log, problem, words", [
    (NO_DRAFT_032, "speculative_draft_missing", ['add "model"', '"method": "ngram"']),
    (LOOKUP_032, "speculative_ngram_lookup", ["prompt_lookup_min ≤ prompt_lookup_max"]),
    (METHOD_032, "speculative_method_unknown", ['"ngram" (no draft model)']),
    (KEY_032, "invalid_config", ["SpeculativeConfig", "foo", "Unexpected keyword argument"]),
])
def test_vllms_speculative_refusals_are_explained(log, problem, words):
    from app.planner.diagnose import diagnose_text

    d = diagnose_text(log)
    assert d is not None and d.problem == problem, d
    text = d.explanation + " " + " ".join(d.evidence)
    for w in words:
        assert w in text, text


def test_the_verdict_names_the_speculative_config_in_words():
    from app.run.verdict import flags_text

    assert flags_text({"tensor_parallel_size": 8, "speculative_config": '{"method": "ngram", '
                                                                       '"num_speculative_tokens": 3}'}) \
        == "tensor_parallel_size 8, speculative decoding (ngram, 3 draft tokens)"
    assert flags_text({"speculative_config": {"method": "eagle", "model": "h/EAGLE", "num_speculative_tokens": 3}}) \
        == "tensor_parallel_size 1, speculative decoding (eagle h/EAGLE, 3 draft tokens)"


def test_the_conditional_rate_is_found_from_vllms_acceptance_rate():
    from app.engine.specdecode import acceptance_from_rate

    for a, k in ((0.7, 3), (0.3, 1), (0.95, 5), (0.0, 2), (1.0, 2)):
        assert acceptance_from_rate(draft_acceptance_rate(a, k), k) == pytest.approx(a, abs=1e-6)
    assert acceptance_from_rate(0.97, 2) == pytest.approx(0.9800, abs=1e-3)  # (a + a²)/2 = 0.97


def test_the_cpu_build_serves_it_and_the_plan_says_what_vllm_warns(tiny_model):
    """vLLM 0.32's CPU platform serves --speculative-config (tests/e2e/test_specdecode_e2e.py);
    without libiomp preloaded it warns of a performance loss on x86: an info finding,
    which leaves the verdict alone."""
    from app.planner.gpus import cpu_device
    from app.planner.models import resolve_model
    from app.planner.plan import plan

    m = resolve_model(str(tiny_model))
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cfg = ServerConfig(model=str(tiny_model), max_num_seqs=8, distributed_executor_backend="uni", env=env,
                       speculative_config=NGRAM)
    p = plan(cfg, [cpu_device(24, 2)], m, use_calibration=False)
    assert p.verdict == "ok" and p.problems() == ["cpu_speculative_without_iomp"]
    assert "libiomp5.so" in p.findings[0].message
    base = plan(cfg.model_copy(update={"speculative_config": None}), [cpu_device(24, 2)], m, use_calibration=False)
    assert p.kv_cache_tokens == base.kv_cache_tokens  # ngram holds no KV
    preload = cfg.model_copy(update={"env": {**env, "LD_PRELOAD": "/usr/lib/libiomp5.so"}})
    assert plan(preload, [cpu_device(24, 2)], m, use_calibration=False).problems() == []


def test_plan_predicts_at_the_given_acceptance():
    """``vllm-dyno plan --spec-acceptance A`` (and ``plan(spec_acceptance=A)``): the
    prediction's acceptance, said in the text and the JSON."""
    from app.cli import main
    import contextlib
    import io

    lo = _plan(NGRAM, spec_acceptance=0.3)
    hi = _plan(NGRAM, spec_acceptance=0.9)
    assert lo.engine_limits().spec_acceptance == 0.3 and hi.as_dict()["speculative"]["acceptance"] == 0.9
    assert hi.curve.points[0].tpot_s < lo.curve.points[0].tpot_s
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "RTX 4090", "--max-model-len", "8192",
                     "--speculative-config", json.dumps(NGRAM), "--spec-acceptance", "0.5", "--levels", "1"])
    assert code == 0 and "accepted at 0.5 of the one before" in out.getvalue(), out.getvalue()


def test_the_windows_plan_predicts_at_the_sim_rigs_acceptance():
    """The window plans a sim rig with its profile's ``sim: {spec_acceptance}`` (what the
    sim will serve), else the default."""
    from widgets.plan_panel import PlanInputs, compute_plan

    cfg = ServerConfig(model="meta-llama/Llama-3.1-8B", max_model_len=8192, speculative_config=NGRAM)
    inp = PlanInputs(cfg, "sim", "RTX 4090", 1, [], 512, 128, (1,), None, None, 0.4)
    assert compute_plan(inp).engine_limits().spec_acceptance == 0.4
    inp.spec_acceptance = None
    assert compute_plan(inp).engine_limits().spec_acceptance == DEFAULT_ACCEPTANCE
