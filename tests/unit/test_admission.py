"""Admission control (issue 38, item 3): vLLM's queue limits and ``--max-num-active-seqs``,
the rule (app.engine.admission), the engine's and the planner's use of it, and how a
level counts the refusals (apart from failures, bounded by ``--slo-rejection-rate``).

Every vLLM rule here is vLLM 0.32.0's (file:line in app/engine/admission.py):
``check_admission`` vllm/v1/engine/async_llm.py:316–374, the limits
vllm/config/scheduler.py:69/92/105 and :335–342, the errors vllm/exceptions.py:156–183,
the body vllm/entrypoints/serve/exception_handling/error_response.py:37–40, the counter
vllm/v1/metrics/loggers.py:47/845–858, the active cap vllm/v1/core/sched/scheduler.py:132/923.
"""
from __future__ import annotations

import email.utils
import time

import pytest
from pydantic import ValidationError

from app.config import VLLM_OPTIONS, ServerConfig
from app.engine.admission import ADMISSION_REASONS, REJECTED_MESSAGES, REJECTED_TYPE, AdmissionLimits
from app.engine.offline import run_level
from app.engine.scheduler import Scheduler
from app.loadgen.capacity import level_met, met_probability
from app.loadgen.client import retry_after_s
from app.loadgen.records import REJECTED_STATUS, STATUS_REJECTED, RequestRecord
from app.loadgen.spec import SLO, RampSpec, spec_to_wall
from app.loadgen.workload import MultiTurn
from app.loadgen.stats import compute_step_stats
from app.metrics import BY_NAME, CLI, CSV, REPORT, RESULTS, STORE
from app.planner.diagnose import diagnose_text
from app.planner.predict import EngineLimits, predict_ramp
from app.planner.versions import option_accepted
from app.sim import model_adapter as ma
from tests.integration.test_sim_server import CFG


def test_the_refusal_is_vllms_check_admission():
    """Requests: refused when current + n > max (so a cap of 4 holds 4); prompt tokens:
    refused once the backlog has reached the cap (the new prompt is not added); the
    request cap is judged first; no limit, no refusal."""
    gate = AdmissionLimits(max_num_queued_reqs=4, max_num_queued_tokens=1000)
    assert gate.refusal(3, 0) is None and gate.refusal(4, 0) == "max_num_queued_reqs"
    assert gate.refusal(3, 0, n=2) == "max_num_queued_reqs"
    assert gate.refusal(0, 999) is None and gate.refusal(0, 1000) == "max_num_queued_tokens"
    assert gate.refusal(4, 5000) == "max_num_queued_reqs"  # the request cap first (async_llm.py:343 before :362)
    assert AdmissionLimits().refusal(10**6, 10**9) is None and not AdmissionLimits().active
    assert AdmissionLimits(max_num_queued_reqs=0).refusal(0, 0) == "max_num_queued_reqs"  # ge=0: refuse all
    # vLLM's answer: 503, its phrase as the type, the message of each error class, one counter label per reason
    assert REJECTED_STATUS == 503 and REJECTED_TYPE == "Service Unavailable"
    assert ADMISSION_REASONS == ("max_num_queued_reqs", "max_num_queued_tokens") == tuple(REJECTED_MESSAGES)
    assert REJECTED_MESSAGES["max_num_queued_reqs"].startswith("The engine is currently busy")
    assert REJECTED_MESSAGES["max_num_queued_tokens"].startswith("The engine has reached its prefill token backlog")


def test_the_options_are_declared_with_their_versions():
    """One ServerConfig field each, in the versions that take them (0.29: the queue limits,
    PR #49445; 0.31: --max-num-active-seqs, PR #56758); a combination vLLM refuses is
    refused with the fix."""
    assert [VLLM_OPTIONS[f].flag for f in ("max_num_queued_reqs", "max_num_queued_tokens", "max_num_active_seqs")] \
        == ["--max-num-queued-reqs", "--max-num-queued-tokens", "--max-num-active-seqs"]
    q, a = VLLM_OPTIONS["max_num_queued_reqs"], VLLM_OPTIONS["max_num_active_seqs"]
    assert not option_accepted(q, "0.28.1") and option_accepted(q, "0.29.0") and option_accepted(q, "0.32.0")
    assert not option_accepted(a, "0.30.2") and option_accepted(a, "0.31.0")
    argv = ServerConfig(model="m", max_num_queued_reqs=8, max_num_queued_tokens=4096, max_num_active_seqs=4,
                        max_num_seqs=16).to_argv("/py", "serve")
    for flag, v in (("--max-num-queued-reqs", "8"), ("--max-num-queued-tokens", "4096"), ("--max-num-active-seqs", "4")):
        assert argv[argv.index(flag) + 1] == v
    with pytest.raises(ValidationError, match="lower max_num_active_seqs to at most 16"):
        ServerConfig(model="m", max_num_seqs=16, max_num_active_seqs=17)


def test_more_active_seqs_than_the_default_max_num_seqs_is_refused_as_vllm_does():
    """With max_num_seqs left at its default the planner judges the combination against the
    default (the sim refuses it with vLLM's text), and vLLM's own refusal in a log maps
    to the same problem with the fix."""
    cfg = CFG.model_copy(update={"max_num_seqs": None, "max_num_active_seqs": 5000})
    with pytest.raises(ma.Refusal, match=r"max_num_active_seqs \(5000\) cannot be greater than max_num_seqs \(\d+\)"):
        ma.plan_rig(cfg, "RTX 4090", 8)
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
           "  Value error, max_num_active_seqs (300) cannot be greater than max_num_seqs (256). "
           "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n")
    d = diagnose_text(log)
    assert d.problem == "active_seqs_above_num_seqs" and d.fix == {"max_num_active_seqs": 256}


def _steps(limit: int | None):
    """A scheduler with 64 seats, ``limit`` active, and the largest running batch it stepped."""
    seen = [0]
    box: list[Scheduler] = []

    def step_time(decode_batch, decode_ctx, prefill_tokens, prefill_attention=0.0):
        seen[0] = max(seen[0], len(box[0].running))
        return 0.01 + 1e-5 * prefill_tokens

    def make():
        box.clear()
        box.append(Scheduler(4096, 64, 2048, step_time, max_num_active_seqs=limit))
        return box[0]
    return make, seen


def test_max_num_active_seqs_caps_the_running_batch_below_max_num_seqs():
    make, seen = _steps(5)
    run = run_level(make, 20, lambda: (64, 32), step_s=5.0)
    assert seen[0] == 5 and run.flights
    make, seen = _steps(None)
    run_level(make, 20, lambda: (64, 32), step_s=5.0)
    assert seen[0] == 20  # max_num_seqs 64: all 20 users run together


def _in_engine_at(flights, t):
    return sum(1 for f in flights if f.rejected is None and f.req.arrival <= t
               and (not f.tokens or f.tokens[-1] > t or f.req.finish_reason is None))


def test_a_queue_cap_bounds_the_requests_in_the_engine_and_refusals_are_sent_again():
    """12 users against max_num_queued_reqs 3: never more than 3 requests handed to the
    engine, the rest refused at once; a refused user sends the same request again after
    its wait; refusals are not counted against the level's quota."""
    make, _ = _steps(None)
    gate = AdmissionLimits(max_num_queued_reqs=3)
    run = run_level(make, 12, lambda: (64, 32), step_s=20.0, quota=40, request_overhead_s=0.002, admission=gate,
                    retry_wait=lambda u: 0.5)
    admitted = [f for f in run.flights if f.rejected is None]
    refused = [f for f in run.flights if f.rejected is not None]
    assert refused and all(f.rejected == "max_num_queued_reqs" and not f.tokens for f in refused)
    assert max(_in_engine_at(admitted, f.req.arrival) for f in admitted) == 3
    for f in refused:  # the same request again, 0.5 s later, by the same user
        later = [g for g in run.flights if g.user == f.user and g.sent > f.sent]
        if later:
            assert later[0].sent == pytest.approx(f.sent + 0.5) and later[0].req.prompt_len == f.req.prompt_len
    counted = [f for f in admitted if f.sent >= run.warmup_end]
    assert run.reason == "count" and len(counted) == 40  # the quota counts admitted requests only
    # a token cap: the prompts of requests still in prefill
    run = run_level(make, 12, lambda: (500, 8), step_s=5.0, admission=AdmissionLimits(max_num_queued_tokens=1000))
    assert any(f.rejected == "max_num_queued_tokens" for f in run.flights)


def _rec(i, status="ok", ttft=0.1):
    ok = status == "ok"
    return RequestRecord(level_idx=0, level=8, t_start=1.0 + i * 0.01, ttft=ttft if ok else None,
                         e2e=0.5 if ok else 0.0, output_tokens=10 if ok else 0, status=status)


def test_rejections_are_counted_apart_from_failures():
    """A level's rejections are ``rejected`` (an int) and ``rejection_rate`` (÷ attempts),
    never in ``failures`` nor ``failure_rate`` (÷ the admitted); --slo-rejection-rate
    breaks a level above it."""
    recs = [_rec(i) for i in range(12)] + [_rec(20 + i, STATUS_REJECTED) for i in range(6)] \
        + [_rec(40 + i, "http_500") for i in range(2)]
    st = compute_step_stats(recs, idx=0, level=8, mode="concurrency", t_start=0, t_end=10, window_start=0,
                            window_end=10, slo=SLO(ttft_p99=1.0, rejection_rate=0.25, failure_rate=0.2))
    assert st.n_measured == 20 and st.n_ok == 12 and st.rejected == 6 and isinstance(st.rejected, int)
    assert st.failures == {"http_500": 2} and st.failure_rate == pytest.approx(2 / 14)
    assert st.rejection_rate == pytest.approx(0.3)
    assert st.slo_broken == ["rejection_rate 30.0% > 25.0%"] and not level_met(st, SLO(ttft_p99=1.0, failure_rate=0.2,
                                                                                      rejection_rate=0.25))
    loose = SLO(ttft_p99=1.0, rejection_rate=0.5, failure_rate=0.2)
    assert level_met(compute_step_stats(recs, idx=0, level=8, mode="concurrency", t_start=0, t_end=10, window_start=0,
                                        window_end=10, slo=loose), loose)
    dump = st.model_dump(mode="json")
    assert dump["rejected"] == 6 and "rejected" not in dump["failures"]
    # the bootstrap judges the same two rates: failed ÷ admitted, rejected ÷ all
    assert met_probability(recs, SLO(rejection_rate=0.9, failure_rate=0.9)) == 1.0
    assert met_probability(recs, SLO(rejection_rate=0.01, failure_rate=0.5)) < 0.01  # 0.7^20 resamples refuse none
    only_rejected = [_rec(i) for i in range(10)] + [_rec(20 + i, STATUS_REJECTED) for i in range(10)]
    assert met_probability(only_rejected, SLO(failure_rate=0.01)) == 1.0  # a rejection is no failure


def test_the_rejected_figures_are_in_every_view():
    """Declared once in the metric vocabulary: ``rejected`` in every table, the CSV and the
    store; the fraction in the GUI, the report, the CSV and the store."""
    assert BY_NAME["rejected"].views == frozenset({RESULTS, CLI, CSV, REPORT, STORE})
    assert BY_NAME["rejected"].sql == "INTEGER"
    assert {RESULTS, REPORT, CSV, STORE} <= BY_NAME["rejection_rate"].views


def test_a_refused_user_waits_retry_after_else_its_think_time_else_one_second():
    assert retry_after_s("3") == 3.0 and retry_after_s(None) is None and retry_after_s("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after_s(later) <= 31
    assert RampSpec(levels=[1]).retry_wait_s == 1.0
    talk = RampSpec(levels=[1], multi_turn=MultiTurn(turns=3, think_s=4.0))
    assert talk.retry_wait_s == 4.0
    assert spec_to_wall(RampSpec(levels=[1]), 10.0).retry_wait_s == pytest.approx(0.1)  # rig s → the sim's wall s


def test_the_planner_models_a_queue_cap():
    """128 users on the sim tests' rig (max_num_seqs 64): without a cap every request queues
    in the engine; with max_num_queued_reqs 8 at most 8 are in it, the TTFT falls, the
    rest are refused — counted as rejected, none failed — and a rejection bound makes the
    level broken for the capacity search."""
    sp = ma.plan_rig(CFG, "RTX 4090", 8)
    model = ma.StepModel(sp).model
    free = EngineLimits(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens)
    capped = EngineLimits(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens,
                          admission=AdmissionLimits(max_num_queued_reqs=8))
    spec = RampSpec(levels=[4, 128], step_seconds=60.0, warmup_seconds=10.0, prompt_tokens=1024, output_tokens=64,
                    slo=SLO(ttft_p99=30.0, rejection_rate=0.1))
    a, b = predict_ramp(model, free, spec), predict_ramp(model, capped, spec)
    print(f"\n128 users: TTFT p99 {a.steps[1].ttft_p99:.2f} s uncapped, {b.steps[1].ttft_p99:.2f} s with a cap of 8 "
          f"({b.steps[1].rejected} rejected, {b.steps[1].rejection_rate:.0%})")
    assert a.steps[1].rejected == 0 and b.steps[0].rejected == 0  # 4 users fit under the cap
    assert b.steps[1].rejected > 0 and b.steps[1].failure_rate == 0.0 and not b.steps[1].failures
    assert b.steps[1].ttft_p99 < 0.6 * a.steps[1].ttft_p99
    assert any("rejection_rate" in m for m in b.steps[1].slo_broken)
    assert not level_met(b.steps[1], spec.slo) and level_met(b.steps[0], spec.slo)
