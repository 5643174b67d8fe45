"""The planner against the real CPU vLLM (shared ``vllm_server``): predicted KV cache
tokens vs the logged figure, and calibration on a live measured ramp (fit on half the
levels, predict the other half, report the error per level — run with -s). The ramp is the
session's ``measured_ramp`` (tests/e2e/conftest.py), the one the knee test judges."""
from __future__ import annotations

from app.planner.calibrate import MeasuredLevel, calibrate_and_save, hardware_fingerprint, level_errors, load_calibration
from app.planner.accuracy import compare_launch, compare_ramp
from app.planner.cards import cards_for
from app.planner.models import resolve_model
from app.planner.plan import Workload, plan
from tests.e2e.conftest import KNEE_OUTPUT as OUTPUT, KNEE_PROMPT as PROMPT


def cpu_plan(server, **kw):
    cards = cards_for(cpu_build=True)
    return plan(server.config, cards, resolve_model(server.config.model), Workload.of(PROMPT, OUTPUT, (1, 2, 4, 8, 16)),
                vllm_version=server.parser.facts.version, **kw)


def test_predicted_kv_tokens_match_the_log(vllm_server):
    f = vllm_server.parser.facts
    p = cpu_plan(vllm_server, use_calibration=False)
    assert f.kv_cache_tokens, "the CPU build logged no KV cache size"
    assert abs(p.kv_cache_tokens - f.kv_cache_tokens) <= 0.02 * f.kv_cache_tokens
    cmp = {c.metric: c for c in compare_launch(p, f)}
    assert abs(cmp["kv_cache_tokens"].error_pct) <= 2.0
    if "max_concurrency" in cmp:
        assert abs(cmp["max_concurrency"].error_pct) <= 2.0
    print(f"\nKV cache tokens: predicted {p.kv_cache_tokens:,}, logged {f.kv_cache_tokens:,}")


def test_calibration_on_a_live_ramp(vllm_server, measured_ramp, capsys):
    """Fit on the session's measured ramp (tests/e2e/conftest.py: the one the knee test
    judges, 10 s a level), levels 1, 4 and 16; the other levels are predicted."""
    res = measured_ramp[1][-1]
    measured = [MeasuredLevel(int(s.level), s.output_tps, s.ttft_mean) for s in res.steps if s.n_ok]
    assert len(measured) == 5
    p = cpu_plan(vllm_server, use_calibration=False)
    cap, _ = p.concurrency_for(PROMPT, OUTPUT)
    assert cap == 8
    train = [m for m in measured if m.concurrency in (1, 4, 16)]
    params, path = calibrate_and_save(p.perf, p.cards, train, PROMPT, OUTPUT, cap)
    before = level_errors(p.perf, measured, PROMPT, OUTPUT, cap)
    after = compare_ramp(cpu_plan(vllm_server), measured, PROMPT, OUTPUT)  # reuses the saved calibration
    assert load_calibration(hardware_fingerprint(p.cards)) == params and path.is_file()
    with capsys.disabled():
        print(f"\nlive CPU ramp ({PROMPT} in / {OUTPUT} out, max_num_seqs 8), fit on 1/4/16 → {params}")
        for b, a in zip(before, after):
            tag = "fit" if b.concurrency in (1, 4, 16) else "predicted"
            print(f"  c={b.concurrency:>2} measured {b.measured_tps:6.0f} tok/s (TTFT {(b.measured_ttft_s or 0) * 1e3:6.0f} ms)"
                  f"  default {b.tps_error_pct:+6.1f} %  calibrated {a.predicted_tps:6.0f} ({a.tps_error_pct:+6.1f} %, "
                  f"TTFT {a.ttft_error_pct or 0:+6.1f} %) [{tag}]")
    # the sim's scheduler, stepping with the fitted parameters, against the same levels
    from app.sim import model_adapter as ma
    from app.engine.offline import sim_level

    sp = ma.plan_rig(vllm_server.config, p.cards[0], 1)
    sm = ma.StepModel(sp, params=params)
    sim_err = {}
    for m in measured:
        got = sim_level(sp, sm, m.concurrency, PROMPT, OUTPUT, 20.0, 4.0)
        sim_err[m.concurrency] = 100 * (got.throughput - m.output_tps) / m.output_tps
    with capsys.disabled():
        print("  sim (calibrated), tok/s error per level: " + ", ".join(
            f"c={c} {e:+.1f} % [{'fit' if c in (1, 4, 16) else 'predicted'}]" for c, e in sim_err.items()))
    assert all(abs(e) < 1000 for e in sim_err.values())
    # Other helpers load this 2-core machine at the same time, so the held-out errors are
    # reported, not asserted; the fit itself must beat the defaults on its own levels.
    fit_err = lambda errs: sum(abs(e.tps_error_pct) for e in errs if e.concurrency in (1, 4, 16))
    assert fit_err(after) < fit_err(before)
    assert all(abs(e.tps_error_pct) < 1000 for e in after)  # finite, sane
