"""Multi-turn conversations and shared-prefix workloads (issue 20, items 2 and 3): the
request building (seeded, deterministic), the per-turn statistics, the CLI forms, and
the step-level engine's prefix cache — pure Python, no server."""
from __future__ import annotations

import json

import numpy as np
import pytest

from app.engine.scheduler import BLOCK, Request, Scheduler, block_hashes
from app.loadgen.prompts import TURN_OVERHEAD_TOKENS, RequestFactory, SharedPrefixes
from app.loadgen.records import RequestRecord
from app.loadgen.spec import RampSpec, SharedPrefix, parse_multi_turn, parse_shared_prefix, spec_to_wall
from app.loadgen.stats import compute_step_stats, to_rig_time


# ---------------------------------------------------------------------------- spec and CLI forms
def test_cli_forms_parse_and_bad_ones_say_how_to_write_them():
    mt = parse_multi_turn("4:2.5")
    assert (mt.turns, mt.think_s) == (4, 2.5)
    assert parse_multi_turn("3").think_s == 0
    sp = parse_shared_prefix("1024:0.5:4")
    assert (sp.tokens, sp.fraction, sp.count) == (1024, 0.5, 4)
    assert parse_shared_prefix("256:1").count == 1
    for bad in ("0", "x", "4:-1", "4:1:2"):
        with pytest.raises(ValueError, match="TURNS\\[:THINK_S\\]"):
            parse_multi_turn(bad)
    for bad in ("1024", "1024:0", "1024:1.5", "0:0.5", "1024:0.5:0", "a:b"):
        with pytest.raises(ValueError, match="TOKENS:FRACTION"):
            parse_shared_prefix(bad)


def test_multi_turn_needs_closed_loop_users_and_synthetic_prompts(tmp_path):
    with pytest.raises(ValueError, match="closed-loop users"):
        RampSpec(mode="rate", levels=[1.0], multi_turn={"turns": 3})
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\n')
    with pytest.raises(ValueError, match="prompts_file"):
        RampSpec(levels=[1], prompts_file=f, shared_prefix={"tokens": 64, "fraction": 0.5})


def test_turn_count_range_follows_the_ramp_length_rule_and_the_shape_says_it():
    s = RampSpec(levels=[1], multi_turn={"turns": 4, "think_s": 2}, shared_prefix={"tokens": 512, "fraction": 0.5})
    assert s.turns_range() == (3, 5)
    assert RampSpec(levels=[1], length_spread=0, multi_turn={"turns": 4}).turns_range() == (4, 4)
    assert "conversations of 3–5 turns, think 2 s" in s.shape and "50% start with one of 1 shared prefix" in s.shape
    # against a sim k× faster, the think time is rig seconds too
    assert spec_to_wall(s, 10).multi_turn.think_s == pytest.approx(0.2)


def test_ramp_cli_builds_the_workload_fields():
    import argparse

    from app.cli.ramp import register, spec_from_args

    p = argparse.ArgumentParser()
    register(p.add_subparsers())
    a = p.parse_args(["ramp", "--levels", "2", "--multi-turn", "3:1", "--shared-prefix", "256:0.25:2"])
    s = spec_from_args(a)
    assert s.multi_turn.turns == 3 and s.multi_turn.think_s == 1
    assert (s.shared_prefix.tokens, s.shared_prefix.fraction, s.shared_prefix.count) == (256, 0.25, 2)


# ---------------------------------------------------------------------------- shared prefixes
def _prompt(body: bytes) -> str:
    d = json.loads(body)
    return d["prompt"] if "prompt" in d else d["messages"][-1]["content"]


def test_shared_prefix_requests_are_seeded_and_share_exactly_their_prefix():
    spec = RampSpec(levels=[1], prompt_tokens=64, shared_prefix={"tokens": 200, "fraction": 0.5, "count": 3}, seed=7)
    fa, fb = RequestFactory(spec, "m"), RequestFactory(spec, "m")
    ra = [fa.next() for _ in range(400)]
    rb = [fb.next() for _ in range(400)]
    assert ra == rb  # deterministic for a seed
    texts = fa.prefixes.texts
    assert len(texts) == 3 and len(set(texts)) == 3 and all(len(t.split()) == 200 for t in texts)
    with_prefix = [next((j for j, t in enumerate(texts) if _prompt(b).startswith(t + "\n\n")), None) for b, _, _ in ra]
    n = sum(1 for j in with_prefix if j is not None)
    assert 0.4 < n / 400 < 0.6  # the fraction
    assert {j for j in with_prefix if j is not None} == {0, 1, 2}  # every prefix is used
    for (body, est, _), j in zip(ra, with_prefix):  # the estimate counts the prefix
        unique = _prompt(body).split("\n\n")[-1]
        assert est == len(unique.split()) + (200 if j is not None else 0)
    # the unique part is fresh per request (no prefix shared beyond the shared one)
    uniques = [_prompt(b).split("\n\n")[-1] for b, _, _ in ra]
    assert len({u.split()[0:8].__repr__() for u in uniques}) > 390
    # the lengths are drawn as without the prefix (the planner predicts with the same sampler)
    plain = RequestFactory(spec.model_copy(update={"shared_prefix": None}), "m")
    assert [json.loads(b)["max_tokens"] for b, _, _ in ra[:50]] == [plain.next()[2] for _ in range(50)]


def test_shared_prefix_choice_is_its_own_seeded_stream():
    sp = SharedPrefix(tokens=32, fraction=0.25, count=4)
    a, b = SharedPrefixes(sp, 3), SharedPrefixes(sp, 3)
    seq = [a.next() for _ in range(1000)]
    assert seq == [b.next() for _ in range(1000)]
    assert 0.2 < sum(x is not None for x in seq) / 1000 < 0.3
    assert SharedPrefixes(sp, 4).texts != a.texts
    # the model's tokens per word scale the words so the prefix is about `tokens` of its tokens
    assert len(SharedPrefixes(sp, 3, tokens_per_word=2.0).texts[0].split()) == 16


# ---------------------------------------------------------------------------- conversations
def _turns(spec: RampSpec, n: int, reply_tokens: int = 10, mml: int | None = None):
    """n turns of one user, each answered with a fixed reply; (conv, body, est) each turn."""
    f = RequestFactory(spec, "m", max_model_len=mml)
    conv, out = None, []
    for i in range(n):
        conv, body, est, mt = f.next_turn(conv)
        out.append((conv, json.loads(body), est, conv.turn))
        conv.reply(f" reply{i} " + "x " * (reply_tokens - 1), est + 3, reply_tokens, est)
    return f, out


def test_chat_conversation_sends_its_history_with_the_replies_received():
    spec = RampSpec(levels=[1], endpoint="/v1/chat/completions", prompt_tokens=20, length_spread=0,
                    multi_turn={"turns": 3}, seed=1)
    f, out = _turns(spec, 7)
    assert [t for *_, t in out] == [1, 2, 3, 1, 2, 3, 1]  # K = 3 turns, then a new conversation
    m3 = out[2][1]["messages"]
    assert [m["role"] for m in m3] == ["user", "assistant", "user", "assistant", "user"]
    assert m3[1]["content"].startswith(" reply0") and m3[3]["content"].startswith(" reply1")
    assert out[3][1]["messages"][0]["content"] != m3[0]["content"]  # a new conversation, a new first message
    # the estimate: the history's tokens as the server counted them (+3 prompt, +10 reply) + the new message
    assert out[0][2] == 20 and out[1][2] == (20 + 3) + 10 + 20
    # deterministic for a seed
    assert [b for _, b, _, _ in out] == [b for _, b, _, _ in _turns(spec, 7)[1]]


def test_completions_conversation_is_the_growing_transcript():
    spec = RampSpec(levels=[1], prompt_tokens=8, length_spread=0, multi_turn={"turns": 3},
                    shared_prefix={"tokens": 40, "fraction": 1.0})
    _, out = _turns(spec, 3)
    p1, p2, p3 = (b["prompt"] for _, b, _, _ in out)
    assert p2.startswith(p1 + " reply0") and p3.startswith(p2 + " reply1")
    prefix = RequestFactory(spec, "m").prefixes.texts[0]
    assert p1.startswith(prefix + "\n\n")  # turn 1 opens with the shared prefix …
    assert p3.count(prefix) == 1  # … and later turns carry it only in the history


def test_turn_counts_are_drawn_around_turns_seeded():
    spec = RampSpec(levels=[1], multi_turn={"turns": 4}, seed=5)
    f = RequestFactory(spec, "m")
    ks = [f.new_conversation().turns for _ in range(300)]
    assert set(ks) == {3, 4, 5} and abs(np.mean(ks) - 4) < 0.2
    g = RequestFactory(spec, "m")
    assert ks == [g.new_conversation().turns for _ in range(300)]


def test_history_is_bounded_by_max_model_len_a_new_conversation_starts():
    spec = RampSpec(levels=[1], prompt_tokens=100, output_tokens=50, length_spread=0, multi_turn={"turns": 10})
    f, out = _turns(spec, 6, reply_tokens=50, mml=400)
    turns = [t for *_, t in out]
    # turn 1: 100; turn 2: 103 + 50 + 100 = 253 (+16 + 50 ≤ 400); turn 3 would be 406 + 100 > 400 → cut
    assert turns == [1, 2, 1, 2, 1, 2]
    assert f.cut_conversations == 2
    for _, _, est, _ in out:
        assert est + TURN_OVERHEAD_TOKENS + 50 <= 400


def test_per_turn_ttft_in_the_level_stats_and_in_rig_time():
    recs = []
    for i in range(30):
        turn = 1 + i % 3
        recs.append(RequestRecord(level_idx=0, level=4, t_start=1.0 + i * 0.1, ttft=0.3 / turn, e2e=1.0,
                                  output_tokens=2, chunk_offsets=np.array([0.3 / turn, 1.0], np.float32), turn=turn))
    recs.append(RequestRecord(level_idx=0, level=4, t_start=1.0, ttft=None, status="timeout", turn=2))
    st = compute_step_stats(recs, idx=0, level=4, mode="concurrency", t_start=0, t_end=10, window_start=0,
                            window_end=10)
    assert [(t.turn, t.n) for t in st.turns] == [(1, 10), (2, 10), (3, 10)]
    assert st.turns[0].ttft_p50 == pytest.approx(0.3) and st.turns[2].ttft_p99 == pytest.approx(0.1)
    rig = to_rig_time(st, 10.0)
    assert rig.turns[0].ttft_p50 == pytest.approx(3.0)
    d = st.model_dump(mode="json")
    assert d["turns"][1] == {"turn": 2, "n": 10, "ttft_p50": pytest.approx(0.15), "ttft_p99": pytest.approx(0.15)}
    # a ramp without conversations has none
    plain = [RequestRecord(level_idx=0, level=1, t_start=1.0, ttft=0.1, e2e=0.2)]
    assert compute_step_stats(plain, idx=0, level=1, mode="concurrency", t_start=0, t_end=2, window_start=0,
                              window_end=2).turns == []
    # the record's turn travels through the pipe form
    assert RequestRecord.from_tuple(recs[1].to_tuple()).turn == 2


# ---------------------------------------------------------------------------- the engine's prefix cache
def flat_step(b, ctx, n, pctx):
    return 0.010 + 1e-4 * n  # 10 ms a step + 0.1 ms per prefill token


class Sink:
    def __init__(self):
        self.first = None

    def on_token(self, r, t):
        if self.first is None:
            self.first = t

    def on_finish(self, r, t):
        pass


def _run_one(s: Scheduler, toks: list, out: int, t: float) -> tuple[Request, float]:
    sink = Sink()
    r = Request(f"r{t}", len(toks), out, t, None, sink, block_hashes=block_hashes(toks + [f"o{i}" for i in range(out)]))
    s.add(r)
    while s.has_work:
        st = s.schedule(t)
        t += st.dt
        s.complete(st, t)
    return r, sink.first - r.arrival


def test_block_hashes_are_chained_full_blocks():
    a = block_hashes(list(range(40)))
    assert len(a) == 2  # 40 tokens: 2 full blocks of 16, the partial one is not hashed
    b = block_hashes([99] + list(range(1, 40)))
    assert a[0] != b[0] and a[1] != b[1]  # a block's identity includes every token before it
    assert block_hashes(list(range(48)))[:2] == a


def test_a_shared_prefix_skips_the_cached_blocks_prefill_and_counts_tokens():
    prefix = [f"p{i}" for i in range(200)]
    s = Scheduler(1000, 8, 512, flat_step, enable_prefix_caching=True)
    r1, ttft1 = _run_one(s, prefix + ["a"] * 30, 4, 0.0)
    r2, ttft2 = _run_one(s, prefix + ["b"] * 30, 4, 10.0)
    assert r1.cached_tokens == 0 and r2.cached_tokens == 192  # 12 full blocks of the 200-token prefix
    assert (s.prefix_queries, s.prefix_hits) == (460, 192)
    assert ttft2 < ttft1 - 192 * 1e-4 * 0.9
    # the same prompt again: hits all but the last token's block (vLLM recomputes the last token)
    r3, _ = _run_one(s, prefix + ["a"] * 30, 4, 20.0)
    assert r3.cached_tokens == (230 - 1) // BLOCK * BLOCK
    assert s.free_blocks == s.num_blocks  # everything returned: cached blocks are free (evictable)


def test_caching_off_no_hits_and_the_output_blocks_are_cached_for_the_next_turn():
    prefix = [f"p{i}" for i in range(64)]
    off = Scheduler(1000, 8, 512, flat_step, enable_prefix_caching=False)
    _run_one(off, prefix, 40, 0.0)
    r, _ = _run_one(off, prefix, 40, 10.0)
    assert (off.prefix_queries, off.prefix_hits, r.cached_tokens) == (0, 0, 0)
    on = Scheduler(1000, 8, 512, flat_step, enable_prefix_caching=True)
    _run_one(on, prefix, 40, 0.0)
    # the next turn: the prompt, the 40 generated tokens, a new message
    r2, _ = _run_one(on, prefix + [f"o{i}" for i in range(40)] + ["n"] * 20, 4, 10.0)
    assert r2.cached_tokens == 96  # 64 prompt + 32 of the 39 output tokens whose KV was computed: 6 full blocks


def test_the_cache_is_bounded_by_the_kv_blocks_and_evicts_the_least_recently_freed():
    s = Scheduler(20, 4, 512, flat_step, enable_prefix_caching=True)  # 20 blocks = 320 tokens
    a = [f"a{i}" for i in range(160)]
    b = [f"b{i}" for i in range(160)]
    _run_one(s, a, 1, 0.0)  # 10 blocks cached (a's 160 tokens)
    _run_one(s, b, 1, 10.0)  # 10 more: the pool is full of cached free blocks
    assert len(s.cache) == 20 and s.free_blocks == 20
    c = [f"c{i}" for i in range(80)]
    _run_one(s, c, 1, 20.0)  # 5 new blocks: evicts a's (freed first) — its last blocks first
    r, _ = _run_one(s, a, 1, 30.0)
    assert r.cached_tokens == 80  # a's first 5 blocks survived, the last 5 went
    r, _ = _run_one(s, b, 1, 40.0)
    assert r.cached_tokens < 160
    assert sum(1 for v in s.cache.values() if v) == 0 and s.free_blocks == 20


def test_a_block_shared_by_running_requests_is_one_block_freed_once():
    """Two requests running together on one cached prefix hold its blocks once (vLLM's
    KVCacheBlock.ref_cnt): the pool's use counts them once, and when both have finished
    every block is free again — not more (a double free made a sim's KV cache grow with
    every shared-prefix level, and POST /reset_prefix_cache saw -3776 blocks held)."""
    prefix = [f"p{i}" for i in range(160)]  # 10 full blocks
    s = Scheduler(100, 8, 4096, flat_step, enable_prefix_caching=True)
    _run_one(s, prefix + ["x"] * 8, 1, 0.0)  # caches the prefix
    assert s.free_blocks == 100
    sinks = [Sink(), Sink()]
    reqs = [Request(f"s{i}", 168, 32, 10.0, None, sinks[i], block_hashes=block_hashes(prefix + [f"y{i}"] * 8))
            for i in range(2)]
    for r in reqs:
        s.add(r)
    t = 10.0
    st = s.schedule(t)
    assert all(r.cached_tokens == 160 for r in reqs)
    used = s.num_blocks - s.free_blocks
    assert used == 10 + 2 * 1, used  # the shared prefix once, each its own last (partial) block
    while s.has_work:
        t += st.dt
        s.complete(st, t)
        st = s.schedule(t) if s.has_work else None
    assert s.free_blocks == s.num_blocks
    assert s.reset_prefix_cache() and not s.cache and not s.free_cached
    r, _ = _run_one(s, prefix + ["x"] * 8, 1, 100.0)
    assert r.cached_tokens == 0  # forgotten


def test_the_prefix_cache_reset_is_refused_while_a_request_holds_blocks():
    s = Scheduler(100, 8, 4096, flat_step, enable_prefix_caching=True)
    r = Request("r", 64, 8, 0.0, None, Sink(), block_hashes=block_hashes([f"p{i}" for i in range(72)]))
    s.add(r)
    s.schedule(0.0)
    assert s.reset_prefix_cache() is False  # vLLM: "Failed to reset prefix cache because some blocks (N) are not freed yet"


# ---------------------------------------------------------------------------- the planner's prediction
def _predict(spec: RampSpec, caching: bool):
    from app.config import ServerConfig
    from app.planner.predict import EngineLimits, predict_ramp
    from app.sim import model_adapter as ma

    sp = ma.plan_rig(ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=4096, max_num_seqs=32),
                     "RTX 4090", 1)
    lim = EngineLimits(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens, enable_prefix_caching=caching,
                       max_model_len=sp.max_model_len)
    return predict_ramp(ma.StepModel(sp).model, lim, spec)


def test_the_prediction_weighs_prefix_caching_for_a_shared_prefix_ramp():
    spec = RampSpec(levels=[4], step_seconds=30, prompt_tokens=64, output_tokens=16,
                    shared_prefix={"tokens": 1024, "fraction": 1.0, "count": 2})
    on, off = _predict(spec, True).steps[0], _predict(spec, False).steps[0]
    assert on.ttft_p50 < 0.6 * off.ttft_p50 and on.output_tps > off.output_tps, (on.ttft_p50, off.ttft_p50)
    # a ramp without shared prefixes predicts the same either way (nothing to share)
    plain = RampSpec(levels=[4], step_seconds=30, prompt_tokens=64, output_tokens=16)
    assert _predict(plain, True).steps[0].ttft_p50 == _predict(plain, False).steps[0].ttft_p50


def test_the_prediction_of_a_multi_turn_ramp_has_turns_and_thinking_users():
    spec = RampSpec(levels=[4], step_seconds=60, prompt_tokens=256, output_tokens=16, length_spread=0,
                    multi_turn={"turns": 3, "think_s": 1.0})
    pr_on, pr_off = _predict(spec, True), _predict(spec, False)
    on = {t.turn: t for t in pr_on.steps[0].turns}
    off = {t.turn: t for t in pr_off.steps[0].turns}
    assert set(on) == {1, 2, 3}
    assert on[3].ttft_p50 < 0.7 * off[3].ttft_p50  # the history is cached
    assert off[3].ttft_p50 > off[1].ttft_p50  # without the cache a later turn prefills its whole history
    # turn k's prompt: k messages and k − 1 replies
    p = {r.turn: r.prompt_tokens for r in pr_on.records}
    assert (p[1], p[2], p[3]) == (256, 256 + 16 + 256, 2 * (256 + 16) + 256)
    # thinking holds no request: fewer requests than 4 users sending back to back
    busy = _predict(spec.model_copy(update={"multi_turn": spec.multi_turn.model_copy(update={"think_s": 0})}), True)
    assert len(pr_on.records) < 0.8 * len(busy.records)


def test_the_sims_tokens_count_as_its_usage_and_a_next_turn_repeats_the_last_one():
    from app.sim.http_api import CHAT_MESSAGE_OVERHEAD, WORDS, count_tokens, prompt_tokens

    msgs = [{"role": "user", "content": "Hello, the rig!"}]
    toks = prompt_tokens(msgs)
    assert len(toks) == 1 + CHAT_MESSAGE_OVERHEAD + CHAT_MESSAGE_OVERHEAD + count_tokens("Hello, the rig!")
    reply = "".join(" " + WORDS[i % len(WORDS)] for i in range(5))  # what the sim streams
    nxt = prompt_tokens(msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "more"}])
    assert nxt[:len(toks) + 5] == toks + list(WORDS[:5])  # the prompt, then the generated tokens
    assert prompt_tokens("a b, c") == ["a", "b", ",", "c"] and prompt_tokens([5, 6]) == [5, 6]


def test_the_plans_workload_keeps_both_workloads_from_a_ramp_to_its_search():
    from app.loadgen.spec import SLO
    from app.planner.plan import Workload

    spec = RampSpec(levels=[1, 2], multi_turn={"turns": 4, "think_s": 1.5},
                    shared_prefix={"tokens": 512, "fraction": 0.5, "count": 3}, slo=SLO(ttft_p99=1.0))
    w = Workload.from_ramp(spec)
    assert w.requests.multi_turn == spec.multi_turn and w.requests.shared_prefix == spec.shared_prefix
    for s in (w.ramp_spec([1, 2]), w.search_spec()):
        assert s.multi_turn == spec.multi_turn and s.shared_prefix == spec.shared_prefix
