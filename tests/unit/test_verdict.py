"""The verdict (issue 17, item 3): one object and one sentence for every finished ramp —
users at the SLO, the rig, the flags, output tok/s, J/token, $ per M tokens, what limits
it (read from the level that broke the SLO and from /metrics and NVML) and what to try
next; stored with the run and printed by `ramp`, `run` and `runs show`."""
from __future__ import annotations

import pytest

from app.loadgen.capacity import Capacity, answer_text, capacity_of
from app.loadgen.spec import SLO, CapacitySearch, RampSpec
from app.loadgen.stats import StepStats, slo_breaches
from app.loadgen.server_stats import ServerStats, explain
from app.run.verdict import (INDICATIVE_NOTE, LevelObservation, Tried, Verdict, against_tune, build_verdict,
                              is_indicative, model_label, observe, verdict_sentence)
from app.settings import Pricing
from app.telemetry.derived import cost_per_mtok
from app.telemetry.series import SeriesBank


def step(idx: int, level: float, ttft: float, tpot: float, tps: float, n: int = 120, fail: float = 0.0,
         slo: SLO | None = None) -> StepStats:
    st = StepStats(idx=idx, level=level, t_start=10 * idx, t_end=10 * idx + 10, window_start=10 * idx,
                   window_end=10 * idx + 10, window_s=10, n_measured=n, n_ok=n, output_tps=tps, ttft_p99=ttft,
                   tpot_p99=tpot, e2e_p99=ttft + 128 * tpot, failure_rate=fail,
                   failures={"http_500": int(n * fail)} if fail else {})
    slo = slo or SLO(ttft_p99=2.0, tpot_p99=0.1)
    st.slo_broken = slo_breaches(st, slo)
    return st


SLO2 = SLO(ttft_p99=2.0, tpot_p99=0.1)
CFG = {"tensor_parallel_size": 4, "max_num_seqs": 32, "quantization": "awq", "max_model_len": 4096}


def verdict_for(steps, obs=None, config=CFG, gpus=8, plan=None, slo=SLO2, **kw):
    cap = capacity_of(steps, [], slo, CapacitySearch(), "concurrency")
    return build_verdict(cap, steps, rig="8× RTX 4090 (sim)", model="Llama-3-70B", gpus=gpus, config=config,
                         observation=obs, plan=plan, mean_tokens=640, **kw)


def test_sentence_has_every_part():
    steps = [step(0, 8, 0.5, 0.04, 200), step(1, 16, 1.2, 0.07, 380), step(2, 32, 3.5, 0.09, 420)]
    v = verdict_for(steps, j_per_token=0.9, pricing=Pricing(gpu_hour=0.5, kwh=0.3))
    assert v.users == 16 and v.output_tps == 380 and v.limited_by == "ttft"
    usd = 8 * 0.5 / (380 * 3600) * 1e6 + 0.9 * 1e6 / 3.6e6 * 0.3
    assert v.cost_per_mtok == pytest.approx(usd)
    s = v.sentence
    assert s.startswith("8× RTX 4090 (sim) serves 16 concurrent users of Llama-3-70B at TTFT p99 ≤ 2 s and "
                        "TPOT p99 ≤ 100 ms — 380 output tok/s, 0.9 J/token, $")
    assert "with tensor_parallel_size 4, quantization awq, max_num_seqs 32, max_model_len 4096" in s
    assert "Limited by time to first token (TTFT): TTFT p99 3.5 s at 32 users" in s
    assert "Next: TTFT-bound: raise max_num_batched_tokens" in s  # no server figures: not told which
    # no power readings, no prices: those parts are left out, not shown as 0
    bare = verdict_for(steps)
    assert bare.j_per_token is None and bare.cost_per_mtok is None
    assert "J/token" not in bare.sentence and "$" not in bare.sentence and "380 output tok/s" in bare.sentence
    attached = verdict_for(steps, config=None)  # an attached server: its flags are unknown
    assert attached.flags == {} and "— 380 output tok/s (" in attached.sentence and "—." not in attached.sentence


def test_limits_read_from_the_level_that_broke_it():
    steps = [step(0, 16, 1.0, 0.05, 300), step(1, 32, 2.6, 0.08, 330)]
    kv = verdict_for(steps, LevelObservation(running=30, waiting=2, kv_usage_max=0.99, preemptions=14))
    assert kv.limited_by == "kv_cache" and "99% full" in kv.limit and "preempted 14" in kv.limit
    assert kv.next_fix == {"kv_cache_dtype": "fp8"}
    seqs = verdict_for(steps, LevelObservation(running=32, waiting=9, kv_usage_max=0.6),
                       plan={"kv_cache_tokens": 30000, "effective": {"max_num_seqs": 32}})
    assert seqs.limited_by == "max_num_seqs" and seqs.next_fix == {"max_num_seqs": 46}  # 30000 tokens / 640 a request
    assert "max_num_seqs is the limit: raise it to 46" in seqs.sentence
    hot = verdict_for(steps, LevelObservation(running=20, waiting=0, throttle=("thermal (software)",)))
    assert hot.limited_by == "throttling" and "thermal (software)" in hot.limit
    slow = [step(0, 16, 1.0, 0.05, 300), step(1, 32, 1.5, 0.15, 310)]
    tp = verdict_for(slow, LevelObservation(running=20, waiting=0))
    assert tp.limited_by == "tpot" and tp.next_fix == {"tensor_parallel_size": 8}
    tp8 = verdict_for(slow, config={**CFG, "tensor_parallel_size": 8})
    assert tp8.next_fix is None and "decode-bound" in tp8.next_try  # no more cards to spread over
    failing = [step(0, 16, 1.0, 0.05, 300), step(1, 32, 1.0, 0.05, 300, fail=0.3)]
    f = verdict_for(failing, slo=SLO(ttft_p99=2.0, failure_rate=0.05))
    assert f.limited_by == "failures" and "30% of the requests failed at 32 users (http_500 36)" in f.limit
    top = verdict_for([step(0, 16, 1.0, 0.05, 300), step(1, 32, 1.5, 0.06, 330)])
    assert top.users == 32 and top.limited_by == "max_level"
    none = verdict_for([step(0, 1, 2.5, 0.05, 30)])
    assert none.users == 0 and "serves no level" in none.sentence


def test_no_slo_says_so():
    steps = [step(0, 1, 0.1, 0.01, 50, slo=SLO()), step(1, 2, 0.2, 0.01, 90, slo=SLO())]
    v = verdict_for(steps, slo=SLO(), has_slo=False)
    assert v.users is None and "peaks at 90 output tok/s at 2 users" in v.sentence and "no SLO" in v.sentence


def test_cost_and_labels():
    assert cost_per_mtok(None, 8, None, Pricing(gpu_hour=1.0)) == (None, None)
    assert cost_per_mtok(1000, 2, None, Pricing(gpu_hour=1.8))[0] == pytest.approx(2 * 1.8 / 3.6e6 * 1e6)
    assert cost_per_mtok(1000, 2, 3.6, Pricing(kwh=0.5)) == (None, pytest.approx(0.5))
    assert model_label("meta-llama/Llama-3-70B") == "meta-llama/Llama-3-70B"
    assert model_label("/models/Qwen2.5-7B/") == "Qwen2.5-7B"


def test_observe_reads_the_window_from_the_bank():
    bank = SeriesBank()
    k = 10.0  # a sim 10× faster: the rig window 100–200 s is 10–20 s of wall time
    bank([(t, "metrics", "running", 30.0) for t in range(5, 25)])
    bank([(t, "metrics", "waiting", 4.0 if 10 <= t <= 20 else 0.0) for t in range(5, 25)])
    bank([(t, "metrics", "kv_cache_usage_max", 0.5 + t / 100) for t in range(5, 25)])
    bank([(t, "metrics", "preemptions_total", float(max(0, t - 12))) for t in range(5, 25)])
    bank([(12.0, "gpu0", "throttle_reasons", float(0x001 | 0x020)), (30.0, "gpu1", "throttle_reasons", 4.0)])
    st = step(0, 32, 3.0, 0.05, 300).model_copy(update={"window_start": 100.0, "window_end": 200.0})
    o = observe(bank, st, k)
    assert o.running == 30 and o.waiting == 4 and o.kv_usage_max == pytest.approx(0.7)
    assert o.preemptions == 8 and o.throttle == ("thermal (software)",)  # idle is not a limit; gpu1 was later




@pytest.mark.parametrize("queue_s, cause, other", [(0.5, "prefill", "queueing"), (2.6, "queueing", "prefill")])
def test_the_ttft_limit_and_the_client_server_note_are_one_diagnosis(queue_s, cause, other):
    """Issue 37 item 4: the verdict said "limited by queueing (TTFT)" while the note on the
    same level said "TTFT is mostly prefill, not queueing". Both now read
    app.loadgen.server_stats.ttft_cause of the level that broke the SLO."""
    steps = [step(0, 8, 0.5, 0.04, 200), step(1, 16, 3.5, 0.07, 380)]
    steps[1].server = ServerStats(scrape_start=10, scrape_end=20, ttft_mean=3.0, ttft_p99=3.4, queue_mean=queue_s, queue_p99=queue_s * 1.2)
    v = verdict_for(steps)
    notes = explain(steps[1])
    assert v.limited_by == "ttft" and f"mostly {cause}" in v.limit, v.limit
    assert other not in v.sentence.split("Limited by", 1)[1], v.sentence
    note = next(n for n in notes if n.startswith(("queueing:", "prefill:")))
    assert note.startswith(f"{cause}:"), notes
    assert {"prefill": "prefill-bound", "queueing": "queue-bound"}[cause] in v.next_try


def test_a_next_step_the_tune_measured_or_predicted_worse_is_not_proposed():
    """Issue 37 item 4: a tune recommended TP 2 and its verdict said "Next: tensor_parallel_size
    4", which the tune itself had predicted worse (19 vs 27 users)."""
    slow = [step(0, 27, 1.0, 0.05, 300), step(1, 28, 1.5, 0.15, 310)]
    v = verdict_for(slow, config={**CFG, "tensor_parallel_size": 2}, gpus=4)
    assert v.next_fix == {"tensor_parallel_size": 4} and "Next: decode-bound" in v.sentence
    for measured in (False, True):
        w = against_tune(v, Tried(19, measured, True))
        how = "measured" if measured else "predicted"
        assert w.next_fix is None and "Next: decode-bound" not in w.sentence
        assert f"Next: not tensor_parallel_size 4: the tune {how} it no better (19 users against 27)" in w.sentence
    refused = against_tune(v, Tried(None, False, True, "the weights do not fit"))
    assert "cannot run here (the weights do not fit)" in refused.sentence and refused.next_fix is None
    better = against_tune(v, Tried(31, False, False))
    assert better.next_fix == v.next_fix and "predicted 31 users there but did not measure it" in better.sentence
    assert against_tune(v, None) is v


def test_a_fixed_ramps_short_levels_make_an_indicative_answer_written_one_way():
    """Issue 37 item 1: the exploratory ramp / ``ramp --levels`` verdict says its p99 is
    indicative; a capacity search's is not; the Results head, History's cell and the CLI
    write the answer with one function."""
    slo = SLO(ttft_p99=2.0)
    few = Capacity(users=4, users_low=4, users_high=8, requests=28, few_requests=True)
    enough = Capacity(users=4, users_low=4, users_high=8, requests=120, few_requests=False)
    fixed = RampSpec(url="http://x", levels=[1, 2, 4, 8], slo=slo)
    assert is_indicative(fixed, few) and is_indicative(fixed, enough)  # the start-up burst counted
    settled = fixed.model_copy(update={"settle": True})
    assert is_indicative(settled, few) and not is_indicative(settled, enough)
    search = RampSpec(url="http://x", search=CapacitySearch(), requests_per_level=100, slo=slo)
    assert not is_indicative(search, few)
    v = Verdict(users=4, users_low=4, users_high=8, rig="8× RTX 4090 (sim)", model="m", slo={"ttft_p99": 2.0},
                indicative=True)
    assert verdict_sentence(v).endswith(INDICATIVE_NOTE + ".")
    assert answer_text(4, indicative=True) == "≈4 users at your SLO (indicative)"
    assert answer_text(19) == "19 users at your SLO" and answer_text(1) == "1 user at your SLO"
    assert answer_text(19, cell=True) == "19" and answer_text(4, indicative=True, cell=True) == "≈4 (indicative)"
    assert answer_text(None) == "No SLO set" and answer_text(None, cell=True) == "–"
