"""Open-loop traffic (issue 20, item 5): the arrival rule (gamma burstiness as
``vllm bench serve --burstiness``, vllm/benchmarks/serve.py ``get_request``, vLLM 0.32.0),
the achieved vs offered rate of a rate level, and the cap's delayed / held requests —
against a scripted streaming server and the simulated rig over real HTTP."""
from __future__ import annotations

import itertools
import math
import random
import statistics

import numpy as np
import pytest
from pydantic import ValidationError

from app.cli.common import level_table
from app.history import levels_csv
from app.loadgen.arrivals import SHORT_FRACTION, arrival_gap, arrival_times, level_rng
from app.loadgen.records import RequestRecord
from app.loadgen.spec import RampSpec
from app.loadgen.stats import compute_step_stats, rate_note, to_rig_time
from app.planner.predict import EngineLimits, predict_ramp
from app.profiles.io import read_profile, write_profile
from app.profiles.model import Profile
from app.report import run_report
from app.sim import model_adapter as ma
from app.store import RunStore
from tests.integration.test_sim_server import CFG


def _gaps(rate: float, b: float, n: int = 40000, seed: int = 3) -> list[float]:
    rng = level_rng(seed, 0)
    return [arrival_gap(rng, rate, b) for _ in range(n)]


@pytest.mark.parametrize("rate,b", [(2.0, 1.0), (10.0, 0.25), (0.5, 0.5), (4.0, 4.0), (50.0, 16.0)])
def test_gap_mean_is_one_over_rate_and_cv_one_over_sqrt_burstiness(rate, b):
    """Gamma(shape b, scale 1/(rate·b)): mean 1/rate, CV 1/sqrt(b) — within 3 % / 5 %
    over 40 000 seeded draws (the sampling error of the CV of b = 0.25 is about 1 %)."""
    g = _gaps(rate, b)
    mean = statistics.fmean(g)
    cv = statistics.pstdev(g) / mean
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert cv == pytest.approx(1 / math.sqrt(b), rel=0.05)


def test_burstiness_1_is_the_poisson_stream_of_before():
    """A burstiness of 1 draws the very gaps the Poisson levels drew (expovariate on the
    level's stream): recorded ramps stay reproducible."""
    old = random.Random(7 * 1000003 + 2)
    want = np.cumsum([old.expovariate(3.0) for _ in range(50)])
    it = arrival_times(3.0, 1.0, seed=7, idx=2)
    got = [next(it) for _ in range(50)]
    assert np.allclose(got, want, rtol=1e-12)


def test_arrivals_are_seeded_per_level():
    a = arrival_times(5.0, 0.5, seed=1, idx=0)
    b = arrival_times(5.0, 0.5, seed=1, idx=0)
    c = arrival_times(5.0, 0.5, seed=1, idx=1)
    xa, xb, xc = ([next(x) for _ in range(20)] for x in (a, b, c))
    assert xa == xb and xa != xc and all(y > x for x, y in zip(xa, xa[1:]))


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_bad_rate_or_burstiness_names_it(bad):
    with pytest.raises(ValueError, match="burstiness"):
        arrival_gap(random.Random(0), 1.0, bad)
    with pytest.raises(ValueError, match="rate"):
        arrival_gap(random.Random(0), bad, 1.0)


def test_spec_burstiness_validation():
    RampSpec(mode="rate", levels=[1.0], burstiness=0.3)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValidationError, match="burstiness"):
            RampSpec(mode="rate", levels=[1.0], burstiness=bad)
    with pytest.raises(ValidationError, match="burstiness 2: it shapes request-rate arrivals"):
        RampSpec(levels=[1.0], burstiness=2)


def _rec(t: float, e2e: float = 0.1, ok: bool = True) -> RequestRecord:
    return RequestRecord(level_idx=0, level=4.0, t_start=t, ttft=0.01, e2e=e2e, prompt_tokens=8, output_tokens=2,
                         status="ok" if ok else "http_500", chunk_offsets=np.array([0.01, e2e], dtype=np.float32))


def _stats(recs, arrivals, level=4.0, send_end=10.0):
    return compute_step_stats(recs, idx=0, level=level, mode="rate", t_start=0.0, t_end=10.5, window_start=0.0,
                              window_end=10.0, arrivals=arrivals, send_end=send_end)


def test_open_loop_figures_and_why_a_level_is_short():
    sched = [i * 0.25 for i in range(40)]  # 4 req/s offered, 40 drawn in the 10 s window
    # every arrival sent on time: achieved = offered, nothing short
    st = _stats([_rec(t) for t in sched], [(t, t, False) for t in sched])
    assert (st.offered_rps, st.achieved_rps, st.n_scheduled, st.n_delayed, st.n_held, st.rate_short) == \
        (4.0, 4.0, 40, 0, 0, None)
    assert st.rate_note is None
    # the cap was full: 10 waited, 8 of them never went out — the server did not keep up
    arr = [(t, None if i >= 32 else t + (0.5 if i >= 30 else 0), i >= 30) for i, t in enumerate(sched)]
    st = _stats([_rec(a[1]) for a in arr if a[1] is not None and a[1] <= 10], arr)
    assert st.rate_short == "server" and (st.n_delayed, st.n_held) == (10, 8) and st.achieved_rps < 3.3
    assert "max_concurrency cap was full (delayed 10 requests, held back 8)" in st.rate_note
    # the cap idle and fewer sent than drawn: the client fell behind
    st = _stats([_rec(t) for t in sched[:30]], [(t, t, False) for t in sched])
    assert st.rate_short == "client" and "load generator did not keep up" in st.rate_note
    # all drawn were sent, the draw itself was low (28 of the 40 expected)
    st = _stats([_rec(t) for t in sched[:28]], [(t, t, False) for t in sched[:28]])
    assert st.rate_short == "draw" and "seeded draw gave 28 arrivals" in st.rate_note
    # sent as offered, completed far fewer (2 s requests: half of them end after the window)
    st = _stats([_rec(t, e2e=2.0 if i % 2 else 0.1) for i, t in enumerate(sched)], [(t, t, False) for t in sched])
    assert st.achieved_rps == 4.0 and st.rps < SHORT_FRACTION * 4.0
    assert st.rate_short is None  # 2 s requests without a warm-up: the pipeline filling, not a backlog
    # a backlog: each request waits longer than the one before (e2e 0.1 s + half its send time)
    st = _stats([_rec(t, e2e=0.1 + 0.5 * t) for t in sched], [(t, t, False) for t in sched])
    assert st.rate_short == "server" and "but completed" in rate_note(st.model_dump())
    # a count-limited level: the achieved rate is over the time it sent, not its drain
    st = _stats([_rec(t) for t in sched[:20]], [(t, t, False) for t in sched[:20]], send_end=5.0)
    assert st.achieved_rps == pytest.approx(20 / 5.0) and st.rate_short is None
    # a closed-loop level has none of it
    cl = compute_step_stats([_rec(t) for t in sched], idx=0, level=4, mode="concurrency", t_start=0, t_end=10,
                            window_start=0, window_end=10)
    assert cl.offered_rps is None and cl.achieved_rps is None and cl.rate_short is None
    # rig time (a sim k× faster): the rates ÷ k, the counts stay
    rig = to_rig_time(st, 10.0)
    assert rig.offered_rps == pytest.approx(0.4) and rig.achieved_rps == pytest.approx(0.4) and rig.n_scheduled == 20
    assert SHORT_FRACTION == 0.95


def _rig():
    sp = ma.plan_rig(CFG, "RTX 4090", 8)  # the sim tests' rig: Llama-3-70B AWQ, TP 8, 8× RTX 4090
    return ma.StepModel(sp).model, EngineLimits(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens)


def test_the_planner_predicts_rate_levels_with_the_same_arrivals():
    """The offline engine runs a rate level on the load generator's arrivals: what it
    sends in the window is what the rule draws (no cap); with a cap of one request in
    flight the arrivals wait and the level is short — the server's side."""
    model, lim = _rig()
    spec = RampSpec(mode="rate", levels=[0.5, 2.0], step_seconds=60.0, warmup_seconds=5.0, prompt_tokens=512,
                    output_tokens=64, burstiness=0.5, seed=3)
    pr = predict_ramp(model, lim, spec)
    for st in pr.steps:
        drawn = [t for t in itertools.takewhile(lambda t: t <= st.window_end,
                                                arrival_times(st.level, 0.5, 3, st.idx)) if t >= st.window_start]
        assert st.mode == "rate" and st.offered_rps == st.level and st.n_scheduled == len(drawn) == st.n_measured
        assert st.n_delayed == st.n_held == 0
    capped = predict_ramp(model, lim, spec.model_copy(update={"max_concurrency": 1}))
    st = capped.steps[1]
    print(f"\ncap 1 at 2 req/s: sent {st.achieved_rps:.2f}/s, delayed {st.n_delayed}, held {st.n_held}")
    assert st.rate_short == "server" and st.n_delayed > 0 and st.n_held > 0 and st.achieved_rps < 1.5


def open_loop_spec(url: str, **kw) -> RampSpec:
    base = dict(url=url, model="scripted", mode="rate", step_seconds=2.0, prompt_tokens=8, output_tokens=10,
                length_spread=0)
    base.update(kw)
    return RampSpec(**base)


def test_a_profiles_rate_ramp_round_trips(tmp_path):
    """A profile's ramp keeps its open-loop fields through YAML (mode, rates, burstiness,
    the cap), and `vllm-dyno run --rate … --burstiness …` overrides build a rate ramp."""
    p = Profile(name="open", engine="sim", server={"model": "Llama-3-70B"},
                ramp={"mode": "rate", "levels": [0.5, 1, 2], "burstiness": 0.5, "max_concurrency": 32,
                      "step_seconds": 30})
    write_profile(tmp_path / "open.yaml", p)
    text = (tmp_path / "open.yaml").read_text()
    assert "burstiness: 0.5" in text and "mode: rate" in text
    q = read_profile(tmp_path / "open.yaml")
    assert (q.ramp.mode, q.ramp.levels, q.ramp.burstiness, q.ramp.max_concurrency) == ("rate", [0.5, 1, 2], 0.5, 32)
    closed = Profile(name="c", engine="sim", server={"model": "Llama-3-70B"}, ramp={"max_level": 8})
    spec = closed.ramp_spec("http://127.0.0.1:1", None, mode="rate", levels=[1.0, 4.0], max_level=None, search=None,
                            burstiness=2.0)
    assert (spec.mode, spec.levels, spec.burstiness) == ("rate", [1.0, 4.0], 2.0)


def test_the_run_store_csv_and_report_keep_the_open_loop_figures(tmp_path):
    """A rate level in the real SQLite run store: `runs show`'s table (sent/s and the
    reason it is short), the levels CSV and the HTML report carry the achieved rate."""
    sched = [i * 0.25 for i in range(40)]
    arr = [(t, None if i >= 32 else t, i >= 30) for i, t in enumerate(sched)]
    st = _stats([_rec(a[1]) for a in arr if a[1] is not None], arr)
    store = RunStore(tmp_path / "runs.db")
    rid = store.create_run("open loop", "sim", spec=RampSpec(mode="rate", levels=[4.0]).model_dump(mode="json"))
    store.add_level(rid, st)
    store.finish_run(rid, "done")
    (lv,) = store.levels(rid)
    assert (lv["offered_rps"], lv["achieved_rps"], lv["n_delayed"], lv["n_held"], lv["rate_short"]) == \
        (4.0, st.achieved_rps, 10, 8, "server")
    table = level_table([lv])
    assert "sent/s" in table and f"{st.achieved_rps:.2f}!" in table and "held back 8" in table
    head, row = levels_csv(store, rid).splitlines()[:2]
    assert head.endswith("offered_rps,achieved_rps,n_scheduled,n_delayed,n_held,rate_short")
    assert row.endswith(f"4.0,{st.achieved_rps},40,10,8,server")
    html = run_report(store, rid)
    assert "sent req/s" in html and "offered req/s" in html and f"{st.achieved_rps:.2f}" in html
