"""app.tuner.report, shared by `vllm-dyno tune` and the Tune tab: a value is pruned only
when every configuration with it is (with the planner's reason), the Pareto front and
the SLO's boundary, the progress line's ETA, and the exports of a recommendation
(a `vllm serve` line and a --config file vLLM's option names accept, a profile that
loads)."""
from __future__ import annotations

import shlex

import pytest

from app.config import VLLM_OPTIONS, ServerConfig
from app.planner.versions import option_accepted
from app.profiles import ProfileLibrary
from app.profiles.model import Profile, SimRig
from app.sim.model_adapter import VLLM_RULES
from app.tuner import report
from app.tuner.space import TuneSpace, server_flags

AWQ70 = "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"


def _cand(key, tp, dp, pruned=None, measured=None, levels=(), predicted=None, tps=None, cards=8):
    server = {"model": AWQ70, "tensor_parallel_size": tp, "pipeline_parallel_size": 1, "data_parallel_size": dp,
              "kv_cache_dtype": "auto", "enforce_eager": False, "max_num_batched_tokens": 2048}
    return {"key": key, "server": server, "cards": cards, "checkpoint": "awq", "pruned_because": pruned,
            "measured_users": measured, "measured_low": measured, "measured_high": measured,
            "predicted_users": predicted, "predicted_tps": tps, "screen_users": predicted,
            "levels": [{"concurrency": n, "output_tps": t} for n, t in levels], "failed": None}


def test_a_value_is_pruned_only_when_every_configuration_with_it_is():
    fit = "weights_do_not_fit: the weights do not fit"
    cands = [_cand("TP8", 8, 1, predicted=20, tps=300), _cand("TP4 DP2", 4, 2, predicted=30, tps=400),
             _cand("TP1 DP8 a", 1, 8, pruned=fit), _cand("TP1 DP8 b", 1, 8, pruned=fit + " (b)"),
             _cand("TP2 DP4", 2, 4, pruned="heads: no")]
    st = report.value_status(cands)
    assert st["data_parallel_size"][1] is None and st["data_parallel_size"][2] is None
    assert st["data_parallel_size"][8].startswith("all 2 configurations pruned — weights_do_not_fit")
    assert st["data_parallel_size"][4] == "heads: no"  # one configuration: its reason as is
    assert st["tensor_parallel_size"][1].startswith("all 2 configurations pruned")
    assert list(st["tensor_parallel_size"]) == [1, 2, 4, 8]
    assert st["enforce_eager"] == {False: None} and st["checkpoint"] == {"awq": None}
    assert report.value_label("enforce_eager", True) == "off (eager)"
    order = [c["key"] for c in report.ordered_candidates({"candidates": cands})]
    assert order[:2] == ["TP4 DP2", "TP8"] and set(order[2:]) == {"TP1 DP8 a", "TP1 DP8 b", "TP2 DP4"}


def test_pareto_points_front_and_the_slo_boundary():
    res = {"slo": {"ttft_p99": 2.0, "tpot_p99": 0.05},
           "recommendation": {"key": "A", "users": 4, "output_tps": 160, "measured": True},
           "candidates": [_cand("A", 8, 1, measured=4, levels=[(1, 60), (2, 100), (4, 160), (8, 200)]),
                          _cand("B", 4, 2, predicted=3, tps=90),
                          _cand("C", 1, 8, pruned="no")]}
    pts = report.pareto_points(res)
    a = [p for p in pts if p.key == "A"]
    assert [(p.per_user, p.per_gpu, p.slo_met) for p in a] == [(60, 7.5, True), (50, 12.5, True), (40, 20, True),
                                                                (25, 25, False)]
    b = [p for p in pts if p.key == "B"]
    assert len(b) == 1 and not b[0].measured and b[0].per_user == 30 and b[0].per_gpu == pytest.approx(11.25)
    assert [p.users for p in report.pareto_front(pts)] == [4, 2, 1]  # the broken level 8 is not on it
    assert report.slo_per_user_floor(res) == pytest.approx(20.0)
    rp = report.recommended_point(res)
    assert (rp.per_user, rp.per_gpu) == (40, 20)
    assert report.slo_per_user_floor({"slo": {"ttft_p99": 1.0}}) is None


def test_the_progress_line_counts_launches_and_bounds_the_eta():
    clock = report.ProgressClock(max_launches=4, max_minutes=None, started=0.0)
    assert clock.text(5.0).startswith("no launch yet (≤ 4) · preparing · elapsed 0:05 · ETA after the first")
    run1 = {"n": 1, "key": "TP4", "status": "running", "wall_seconds": 0.0}
    clock.update({"phase": "measure", "launch_log": [run1]}, "launch 1", now=10.0)
    assert clock.text(40.0) == "launch 1 of ≤ 4 · measuring TP4 · elapsed 0:40 · ETA after the first launch"
    done1 = dict(run1, status="done", wall_seconds=60.0)
    run2 = {"n": 2, "key": "TP8", "status": "running", "wall_seconds": 0.0}
    clock.update({"phase": "measure", "launch_log": [done1, run2]}, "launch 2", now=70.0)
    # 3 launches left at 60 s each, 10 s into the second
    assert clock.eta(80.0) == pytest.approx(170.0)
    assert clock.text(80.0).endswith("ETA ≤ 2:50") and "launch 2 of ≤ 4 · measuring TP8" in clock.text(80.0)
    short = report.ProgressClock(max_launches=4, max_minutes=2, started=0.0)
    short.update({"phase": "measure", "launch_log": [done1, run2]}, "launch 2", now=70.0)
    assert short.eta(80.0) == pytest.approx(120 - 80 + 60)  # the minutes' budget, then the launch in flight


def test_the_exports_are_what_vllm_accepts_and_the_profile_loads(tmp_path):
    cfg = ServerConfig(model=AWQ70, served_model_name="llama70", tensor_parallel_size=4, data_parallel_size=2,
                       quantization="awq_marlin", kv_cache_dtype="fp8", enforce_eager=False, max_num_seqs=24,
                       max_num_batched_tokens=4096, gpu_memory_utilization=0.94, max_model_len=8192)
    server = server_flags(cfg)
    cmd = report.vllm_serve_command(server)
    argv = shlex.split(cmd)
    assert argv[:3] == ["vllm", "serve", AWQ70]
    flags = {s.flag: s for s in VLLM_OPTIONS.values()} | {"--no-" + s.key: s for s in VLLM_OPTIONS.values()}
    used = [a for a in argv[3:] if a.startswith("-")]
    assert "--no-enforce-eager" in used and "--data-parallel-size" in used
    assert all(a in flags and option_accepted(flags[a], VLLM_RULES) for a in used), used
    assert ServerConfig.from_command_line(cmd) == ServerConfig(**server)
    out = tmp_path / "c.yaml"
    report.export_config(str(out), server)
    assert "tensor-parallel-size: 4" in out.read_text()
    assert ServerConfig.from_vllm_config_yaml(out.read_text()) == ServerConfig(**server)
    with pytest.raises(OSError):
        report.export_config(str(tmp_path), server)  # a directory


#: the configuration a tune launched on a 4-card sim rig whose hidden true rig (seed 7, a
#: truth) sat in the form's extra options and the rig — what issue 37 saw dropped
TUNED_CFG = ServerConfig(model=AWQ70, served_model_name="llama70", tensor_parallel_size=2, data_parallel_size=2,
                         quantization="awq_marlin", kv_cache_dtype="auto", enforce_eager=False, max_num_seqs=14,
                         max_num_batched_tokens=2048, max_model_len=8192, gpus=[0, 1, 2, 3, 4, 5, 6, 7],
                         env={"NCCL_P2P_DISABLE": "1"}, extra_args=["--sim-perturb", "7", "--seed", "3"])


def _tuned(tmp_path):
    from app.loadgen.spec import SLO

    spec = report.build_spec(engine="sim", config=TUNED_CFG.model_copy(update={"tensor_parallel_size": 4,
                                                                                  "data_parallel_size": 1}),
                             hardware=report.HardwareFingerprint(gpu="RTX 4090", count=4), slo=SLO(ttft_p99=2.0,
                                                                                                    tpot_p99=0.1),
                             vllm_version=VLLM_RULES)
    rec = {"key": "TP2 PP1 DP2", "server": server_flags(TUNED_CFG),
           "config": TUNED_CFG.model_dump(mode="json", exclude_none=True), "users": 27.0, "users_low": 27.0,
           "users_high": 28.0, "output_tps": 910.0, "measured": True, "verified": True,
           "sentence": "4× RTX 4090 (sim) serves 27 concurrent users …"}
    res = {"tune_id": 5, "launches": 4, "objective": "users", "recommendation": rec}
    return spec, res


def test_save_as_profile_recreates_exactly_what_the_tune_measured(tmp_path):
    """Issue 37 item 5: the saved profile, loaded again, launches the configuration the tune
    measured — field by field over ServerConfig (extra options with the sim's hidden rig, the
    environment, the cards it used), the sim rig the tune ran on (its seed, truth and card
    count, not the base's 8) — with a name and a description from the result."""
    spec, res = _tuned(tmp_path)
    base = Profile(name="8x RTX 4090 demo", description="the demo rig", engine="sim",
                   sim=SimRig(gpu="RTX 4090", count=8), server={"model": AWQ70, "tensor-parallel-size": 8},
                   env={"OLD": "1"})
    rig = SimRig(gpu="RTX 4090", count=4, seed=11, perturb=7, truth={"terms": {"t_cpu_s": 1.2}})
    lib = ProfileLibrary(tmp_path / "profiles")
    path = report.save_as_profile(res, spec, engine="sim", sim=rig, base=base, library=lib)
    name = report.tuned_name(res, spec)
    assert name == "Meta-Llama-3.1-70B-Instruct-AWQ-INT4 · 4× RTX 4090 (sim) · TP2 PP1 DP2 · tuned 27 users"
    prof = lib.entry(name).profile
    assert path.endswith(".yaml")
    want = report.recommended_config(res["recommendation"], spec)
    got = prof.server_config(resolve=False)
    for field in ServerConfig.model_fields:
        w = getattr(want, field)
        if field == "gpus":
            w = w[:want.world_size]  # the cards it used
        assert getattr(got, field) == w, field
    assert got.extra_args == ["--sim-perturb", "7", "--seed", "3"] and got.env == {"NCCL_P2P_DISABLE": "1"}
    assert prof.engine == "sim"
    for field in SimRig.model_fields:
        assert getattr(prof.sim, field) == getattr(rig, field), field
    assert prof.sim.count == spec.hardware.count == 4
    assert prof.description != base.description and "27 users at the SLO (27–28)" in prof.description
    assert "Confirmed by a second launch" in prof.description and "max_num_seqs=14" in prof.description and "Tune 5" in prof.description
    assert prof.ramp.slo == spec.slo and prof.results is None
    # named by the user; an entry stored before "config" existed: the start's options with the flags
    report.save_as_profile(res, spec, engine="sim", sim=rig, base=base, library=lib, name="mine")
    assert lib.entry("mine").profile.server_config(resolve=False) == got
    old = {**res, "recommendation": {k: v for k, v in res["recommendation"].items() if k != "config"}}
    assert report.recommended_config(old["recommendation"], spec).extra_args == TUNED_CFG.extra_args
    # a configuration that named no cards (the sim's form) launched on what the rig has: so does the profile
    no_cards = {**res, "recommendation": {**res["recommendation"], "config": {
        **res["recommendation"]["config"], "gpus": None}}}
    assert report.tuned_profile(no_cards, spec, base=base.updated(gpus=8)).gpus is None
    with pytest.raises(ValueError):
        report.save_as_profile(res, spec, library=lib, name="bad/name")
    with pytest.raises(ValueError, match="no recommendation"):
        report.tuned_profile({"recommendation": None}, spec)


def test_verify_searches_from_what_the_tune_measured_as_the_tune_did(tmp_path):
    from app.tuner.tune import launch_search

    spec, res = _tuned(tmp_path)
    ramp = report.verify_ramp(res, spec)
    assert ramp.search is not None and ramp.search.start == 27 and ramp.search.resolution == spec.resolution
    assert ramp.requests_per_level == spec.requests_per_level and ramp.slo == spec.slo and ramp.levels == []
    # every field as the tune's own launches searched (workload, seed, warm-up, lengths)
    assert ramp == launch_search(spec, spec.workload(), 27.6)


def test_build_spec_names_the_bad_input():
    from app.loadgen.spec import SLO

    args, hw, version = report.sim_target(SimRig(gpu="RTX 4090", count=8, time_scale=10))
    assert args[:4] == ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "8"] and hw.count == 8 and version == VLLM_RULES
    cfg = ServerConfig(model=AWQ70, quantization="awq_marlin")
    spec = report.build_spec(engine="sim", config=cfg, hardware=hw, slo=SLO(tpot_p99=0.1),
                             space={"tp": [8, 4], "kv_cache_dtype": None}, max_launches=2, max_minutes=None)
    assert spec.space == TuneSpace(tp=[4, 8]) and spec.max_launches == 2 and spec.max_minutes is None
    with pytest.raises(ValueError, match="needs an SLO"):
        report.build_spec(engine="sim", config=cfg, hardware=hw, slo=SLO())
    with pytest.raises(ValueError, match="max_launches"):
        report.build_spec(engine="sim", config=cfg, hardware=hw, slo=SLO(tpot_p99=0.1), max_launches=0)
    with pytest.raises(ValueError, match="kv_cache_dtype fp4"):
        report.build_spec(engine="sim", config=cfg, hardware=hw, slo=SLO(tpot_p99=0.1),
                          space={"kv_cache_dtype": ["fp4"]})
    assert report.workload_from_ramp(None) == (512, 128, 0.25, 0)
    assert report.workload_from_ramp(None, 100, 50, fixed_lengths=True, seed=3) == (100, 50, 0.0, 3)
