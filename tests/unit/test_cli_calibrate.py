"""`vllm-dyno calibrate RUN_ID` on runs it must refuse (each with the reason and the
fix), and on a recorded run of real cards whose levels follow a known parameter set:
the fit finds those parameters again, saves them, and the planner and the sim use them.
A real run store (SQLite file) in the test's own data directory."""
from __future__ import annotations

from dataclasses import replace

import pytest

from app.cli import main
from app.planner.calibrate import hardware_fingerprint, load_calibration
from app.engine.steptime import predict_level
from app.profiles.model import HardwareFingerprint
from app.profiles.library import ProfileLibrary
from app.store import RunStore


def _record(store, *, engine="vllm", hardware=True, mode="concurrency", prompt=512, output=128, levels=None):
    prof = ProfileLibrary().get("4x RTX 5090 Llama-3-70B AWQ")
    spec = {"mode": mode, "prompt_tokens": prompt, "output_tokens": output, "levels": [1, 4, 16]}
    rid = store.create_run(prof.name, engine, config={"profile": prof.to_data()}, spec=spec)
    for i, (lv, tps, ttft) in enumerate(levels or []):
        store.add_level(rid, {"idx": i, "level": lv, "mode": mode, "t_start": 0, "t_end": 1, "n_measured": 10,
                              "n_ok": 10, "output_tps": tps, "ttft_mean": ttft})
    hw = HardwareFingerprint(gpu="RTX 5090", count=4, memory_gib=31.8).model_dump() if hardware else None
    store.finish_run(rid, "done", summary={"hardware": hw})
    return rid, prof


@pytest.mark.parametrize("kw, words", [
    (dict(engine="sim"), "simulated rig"),
    (dict(hardware=False), "no hardware fingerprint"),
    (dict(mode="rate"), "rate ramp"),
    (dict(prompt=[100, 200]), "--prompt-tokens N"),
    (dict(levels=[(1, 40.0, 0.3)]), "at least 2"),
])
def test_refused_runs_say_why(kw, words, capsys):
    with RunStore() as store:
        rid, _ = _record(store, **kw)
    assert main(["calibrate", str(rid)]) == 2
    assert words in capsys.readouterr().err


def test_unknown_run(capsys):
    assert main(["calibrate", "4242"]) == 2
    assert "no run 4242" in capsys.readouterr().err


def test_fit_recovers_known_parameters_and_the_planner_and_sim_use_them(capsys):
    from app.run.profile_run import plan_profile

    with RunStore() as store:
        rid, prof = _record(store)
    hw = HardwareFingerprint(gpu="RTX 5090", count=4, memory_gib=31.8)
    plan = plan_profile(prof.model_copy(update={"hardware": hw}))
    truth = replace(plan.perf.params, eta_mem=0.82, eta_compute=0.35, t_cpu_s=0.004)
    cap, _ = plan.concurrency_for(512, 128)
    model = plan.perf.with_params(truth)
    levels = [(c, predict_level(model, c, 512, 128, cap).output_tps, predict_level(model, c, 512, 128, cap).ttft_s)
              for c in (1, 4, 16, 64)]
    with RunStore() as store:
        rid, _ = _record(store, levels=levels)
    assert main(["calibrate", str(rid)]) == 0
    out = capsys.readouterr().out
    assert "saved to" in out and "4x RTX 5090" in out
    saved = load_calibration(hardware_fingerprint(plan.cards))
    assert saved is not None and "calibrated" in saved.source
    refit = plan.perf.with_params(saved)
    for c, tps, _ in levels:  # the fitted model reproduces the levels it was fitted to
        assert predict_level(refit, c, 512, 128, cap).output_tps == pytest.approx(tps, rel=0.03)
    # the planner now predicts with it for these cards ...
    assert plan_profile(prof.model_copy(update={"hardware": hw})).perf.params == saved
    # ... and so does a sim started with --sim-calibrated on the same cards
    from app.sim import model_adapter as ma

    sp = ma.plan_rig(prof.server_config(), "RTX 5090", 4)
    assert ma.StepModel(sp, params=load_calibration(hardware_fingerprint(sp.plan.cards))).params == saved
