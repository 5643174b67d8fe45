"""The process-starting half of tests/unit/test_open_loop.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import numpy as np
import pytest
from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from app.loadgen.stats import to_rig_time
from app.planner.predict import EngineLimits, predict_ramp
from app.sim import model_adapter as ma
from tests.loadgen_server import Script, ScriptedServer
from tests.integration.test_sim_server import CFG, sim_args, start, stop_and_check
from tests.unit.test_open_loop import open_loop_spec


def test_the_cap_delays_and_holds_back_arrivals():
    """20 req/s offered through a cap of one request in flight, each ~0.14 s: at most
    ~7 a second go out — the level is short, the server's side (the cap was full)."""
    with ScriptedServer(Script(ttft=0.05, itl=0.01)) as srv:
        res = run_ramp(open_loop_spec(srv.url, levels=[20.0], max_concurrency=1), timeout=60)
        assert srv.max_in_flight <= 1
    st = res.steps[0]
    assert res.status == "done", res.stop_reason
    assert st.offered_rps == 20.0 and st.achieved_rps < 10 and st.rate_short == "server"
    assert st.n_delayed > 10 and st.n_held > 5 and st.n_scheduled > 25, st
    assert "the server did not keep up" in st.rate_note


def test_gamma_burstiness_through_the_load_generator():
    """The generator sends what the rule draws: burstiness 0.25 (CV 2) vs 16 (CV 0.25)
    of 40 req/s — the gaps between sends of the level, as the client recorded them."""
    cvs = {}
    with ScriptedServer(Script(ttft=0.005, itl=0.002)) as srv:
        for b in (0.25, 16.0):
            res = run_ramp(open_loop_spec(srv.url, levels=[40.0], step_seconds=4.0, output_tokens=2, burstiness=b),
                           timeout=60)
            st = res.steps[0]
            t = np.sort([r.t_start for r in res.records])
            g = np.diff(t)
            cvs[b] = float(g.std() / g.mean())
            assert st.n_scheduled >= 80 and st.achieved_rps == pytest.approx(st.n_measured / st.window_s, rel=0.05)
    print(f"\nCV of the send gaps: burstiness 0.25 → {cvs[0.25]:.2f} (rule 2.0), 16 → {cvs[16.0]:.2f} (rule 0.25)")
    assert cvs[0.25] > 1.4 and cvs[16.0] < 0.5


def test_two_rate_levels_against_the_sim_achieve_what_is_offered():
    """The simulated rig over real HTTP (10× faster than the wall clock): 10 and 20 req/s
    (wall; 1 and 2 rig req/s) of short requests, burstiness 4 (CV 0.5: about ±7 % on the
    ~60–120 arrivals of a 6 s level): each level achieves its offered rate within 20 %,
    completes about as many as it sent, and is not marked short by the client or server.
    (Seed 0 draws 50 arrivals for the first level's window, 17 % under its 60: the level
    says "draw"; the planner's prediction of the same ramp draws the very same ones.)"""
    sup = start(CFG, sim_args(k=10.0))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())
        res = run_ramp(RampSpec(url=sup.url, mode="rate", levels=[10.0, 20.0], step_seconds=6.0, warmup_seconds=0.5,
                                prompt_tokens=64, output_tokens=16, burstiness=4.0), timeout=90)
    finally:
        stop_and_check(sup)
    assert res.status == "done", res.stop_reason
    # the planner predicts the same ramp (rig seconds, rig req/s) with the same arrivals
    sp = ma.plan_rig(CFG, "RTX 4090", 8)
    pred = predict_ramp(ma.StepModel(sp).model, EngineLimits(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens),
                        RampSpec(mode="rate", levels=[1.0, 2.0], step_seconds=60.0, warmup_seconds=5.0,
                                 prompt_tokens=64, output_tokens=16, burstiness=4.0))
    for st, p in zip(res.steps, pred.steps):
        rig = to_rig_time(st, 10.0)
        print(f"\nrig {p.level:g} req/s: measured sent {rig.achieved_rps:.3f}/s, TTFT p50 {rig.ttft_p50:.3f} s; "
              f"predicted sent {p.achieved_rps:.3f}/s ({p.n_scheduled} drawn), TTFT p50 {p.ttft_p50:.3f} s")
        assert abs(p.n_scheduled - st.n_scheduled) <= 1 and p.rate_short == st.rate_short
        assert p.achieved_rps == pytest.approx(rig.achieved_rps, rel=0.05)
    for st in res.steps:
        print(f"\nlevel {st.level:g} req/s: sent {st.achieved_rps:.2f}/s ({st.n_measured} of {st.n_scheduled} drawn), "
              f"completed {st.rps:.2f}/s, TTFT p50 {st.ttft_p50 * 1e3:.0f} ms")
        assert st.offered_rps == st.level
        assert st.achieved_rps == pytest.approx(st.level, rel=0.2)
        assert st.n_measured == st.n_scheduled and st.rate_short in (None, "draw")
        assert st.rps == pytest.approx(st.achieved_rps, rel=0.2)
