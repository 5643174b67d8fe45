"""What the tuner searches changes the simulated rig as the planner models it (issue 18
item 7): CUDA graphs on/off (``--enforce-eager``), the KV cache dtype, pipeline
parallel — in the planner's prediction and in the sim's step model and memory; and the
hidden "true rig" of ``--sim-perturb`` (app.sim.perturb). Rig time, no processes."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.engine.steptime import T_LAUNCH_LAYER_S, default_params
from app.planner.gpus import lookup_gpu
from app.planner.models import resolve_model
from app.planner.plan import Workload, build_step_model, plan
from app.sim import model_adapter as ma
from app.sim.perturb import (ETA_MAX, ETA_MEM_DEFAULT_MAX, FACTOR_RANGE, PERTURBED, factors, true_params,
                              true_params_of)

QWEN7 = "Qwen/Qwen2.5-7B-Instruct"  # 28 layers, 4 KV heads of 128, bf16


def rig_plan(cfg: ServerConfig, count: int = 1, gpu: str = "RTX 4090", workload: Workload | None = None, **kw):
    return plan(cfg, [lookup_gpu(gpu)] * count, resolve_model(cfg.model), workload, vllm_version=ma.VLLM_RULES,
                use_calibration=False, **kw)


# ------------------------------------------------------------------ CUDA graphs on/off
def test_eager_steps_pay_the_launch_cost_per_layer_in_the_plan_and_the_sim():
    """--enforce-eager: every step pays t_launch_layer_s per layer (28 × 40 µs on
    Qwen2.5-7B), in the planner's step model and the sim's alike; the predicted TPOT at
    one user grows by about that and its output tok/s drops. Memory: no CUDA graphs in
    the headroom, the same KV cache (graphs come out of 1 − utilization)."""
    graphs, eager = ServerConfig(model=QWEN7, max_model_len=4096), ServerConfig(model=QWEN7, max_model_len=4096,
                                                                                enforce_eager=True)
    w = Workload.of(256, 128, (1,), length_spread=0.0)
    pg, pe = rig_plan(graphs, workload=w), rig_plan(eager, workload=w)
    extra = 28 * T_LAUNCH_LAYER_S
    assert pe.perf.step_time_decode(1, 300) - pg.perf.step_time_decode(1, 300) == pytest.approx(extra)
    assert pe.perf.step_time(0, 0, 2048, 2048 * 1024) - pg.perf.step_time(0, 0, 2048, 2048 * 1024) == \
        pytest.approx(extra)
    sg, se = ma.plan_rig(graphs, "RTX 4090", 1), ma.plan_rig(eager, "RTX 4090", 1)
    for args in ((1, 300.0, 0, 0.0), (16, 16 * 400.0, 256, 256 * 128.0)):
        assert ma.StepModel(se).step_time(*args) - ma.StepModel(sg).step_time(*args) == pytest.approx(extra)
        assert ma.StepModel(se).step_time(*args) == pytest.approx(pe.perf.step_time(*args))
    g1, e1 = pg.curve.points[0], pe.curve.points[0]
    assert e1.tpot_p99_s - g1.tpot_p99_s == pytest.approx(extra, rel=0.05)
    assert e1.output_tps < 0.97 * g1.output_tps
    assert sg.cuda_graph_bytes > 0 and se.cuda_graph_bytes == 0
    assert se.used_bytes_per_rank[0] == pytest.approx(sg.used_bytes_per_rank[0] - sg.cuda_graph_bytes)
    assert se.kv_tokens == sg.kv_tokens


def test_the_cpu_build_has_no_cuda_graphs_to_lose():
    from app.planner.gpus import cpu_device  # deferred: only this test plans the CPU build

    assert default_params(cpu_device(16.0, 2), 1).t_launch_layer_s == 0.0


# ------------------------------------------------------------------ KV cache dtype
def test_fp8_kv_cache_doubles_the_kv_tokens_and_reads_half_the_kv_bytes():
    """--kv-cache-dtype fp8: one byte per element instead of bf16's two — twice the
    KV tokens in the same memory, and a decode step reads half the KV bytes (at batch
    32 with 2000 tokens of context on Qwen2.5-7B: 32·2000·57,344 B less ÷ 2 at η_mem ·
    1008 GB/s)."""
    auto, fp8 = ServerConfig(model=QWEN7, max_model_len=4096), ServerConfig(model=QWEN7, max_model_len=4096,
                                                                           kv_cache_dtype="fp8")
    sa, sf = ma.plan_rig(auto, "RTX 4090", 1), ma.plan_rig(fp8, "RTX 4090", 1)
    assert sa.kv_bytes_per_token == 2 * sf.kv_bytes_per_token == 2 * 28 * 2 * 4 * 128 * 2 // 2
    assert sf.num_blocks == pytest.approx(2 * sa.num_blocks, abs=1)
    ma_, mf = ma.StepModel(sa), ma.StepModel(sf)
    p = ma_.params
    saved = 32 * 2000 * (sa.kv_bytes_per_token - sf.kv_bytes_per_token) / (p.eta_mem * 1008e9)
    assert ma_.step_time_decode(32, 2000) - mf.step_time_decode(32, 2000) == pytest.approx(saved, rel=1e-6)
    # the planner steps with the same model: the predicted TPOT at a long context drops
    w = Workload.of(2000, 256, (16,), length_spread=0.0)
    pa, pf = rig_plan(auto, workload=w), rig_plan(fp8, workload=w)
    assert pa.perf.step_time_decode(32, 2000) - pf.perf.step_time_decode(32, 2000) == pytest.approx(saved, rel=1e-6)
    assert pf.kv_cache_tokens == pytest.approx(2 * pa.kv_cache_tokens, abs=16)
    assert pf.curve.points[0].tpot_s < pa.curve.points[0].tpot_s


# ------------------------------------------------------------------ pipeline parallel
def test_pipeline_stages_step_one_after_another_in_the_sim():
    """PP 2 on two cards: the sim's step model is the planner's, two stages of 14
    layers each, their times added plus the activations' send between them."""
    cfg = ServerConfig(model=QWEN7, max_model_len=4096, pipeline_parallel_size=2)
    sp = ma.plan_rig(cfg, "RTX 4090", 2)
    m = ma.StepModel(sp).model
    assert sp.pp == 2 and [st.layers for st in m.stages] == [14, 14]
    # vLLM 0.32 schedules asynchronously on one card but not with pipeline parallelism on the V1 model runner
    # (vllm/config/vllm.py): compare with the one card scheduling synchronously, as each stage does
    one = ma.StepModel(ma.plan_rig(ServerConfig(model=QWEN7, max_model_len=4096, extra_args=["--no-async-scheduling"]),
                                   "RTX 4090", 1)).model
    assert sp.num_blocks > 1.8 * ma.plan_rig(ServerConfig(model=QWEN7, max_model_len=4096), "RTX 4090", 1).num_blocks
    # each stage reads half the weights: the step is about one card's, plus a send
    assert m.step_time_decode(8, 500) == pytest.approx(one.step_time_decode(8, 500), rel=0.1)
    assert m.step_time_decode(8, 500) == pytest.approx(build_step_model(rig_plan(cfg, 2)).step_time_decode(8, 500))


# ------------------------------------------------------------------ the true rig
def test_factors_are_seeded_within_range_and_seed_zero_is_none():
    assert factors(7) == factors(7) and factors(7) != factors(8)
    lo, hi = FACTOR_RANGE
    for seed in range(1, 200):
        f = factors(seed)
        assert set(f) == set(PERTURBED)
        assert all(lo <= v <= hi for v in f.values()), (seed, f)
        assert f["eta_mem"] <= ETA_MAX / ETA_MEM_DEFAULT_MAX
    spread = [factors(s)["t_cpu_s"] for s in range(1, 200)]
    assert min(spread) < 0.7 and max(spread) > 1.5  # the whole range is drawn
    assert set(factors(0).values()) == {1.0}
    p = default_params(lookup_gpu("RTX 4090"), 1)
    assert true_params(p, 0) is p
    with pytest.raises(ValueError, match="--sim-perturb -1"):
        factors(-1)


def test_one_set_of_factors_for_every_configuration_of_the_rig():
    """true = default × factors on every configuration (card class, TP, quantization),
    so a calibration on one carries over to another; no efficiency exceeds 1."""
    seed = 5
    f = factors(seed)
    for gpu, tp, bits in (("RTX 4090", 1, None), ("RTX 4090", 8, 4), ("H100 SXM", 4, None), ("RTX 5090", 2, 4)):
        d = default_params(lookup_gpu(gpu), tp, bits)
        t = true_params(d, seed)
        for name in PERTURBED:
            assert getattr(t, name) == pytest.approx(getattr(d, name) * f[name]), (gpu, tp, name)
        assert t.eta_mem <= 1.0 and "perturbed (seed 5)" in t.source
    # a plan's true parameters: its configuration's defaults (however it was planned) × the factors
    cfg = ServerConfig(model="meta-llama/Meta-Llama-3-70B-Instruct-AWQ", tensor_parallel_size=8, max_model_len=4096)
    d = default_params(lookup_gpu("RTX 4090"), 8, 4)
    for params in (None, true_params(d, 9)):
        assert true_params_of(rig_plan(cfg, 8, params=params), seed) == true_params(d, seed)


# ------------------------------------------------------------------ the rig's options, declared once
HOT = ["--sim-cooling", "2", "--sim-ambient-c", "45"]


def test_every_rig_option_is_the_sim_servers_and_travels_in_its_argv():
    """SimRig's declaration (SIM_RIG_OPTIONS) is the sim server's options: each flag is one
    of its parser's, and a rig's argv parses back to the rig's values there."""
    from app.profiles.model import SIM_RIG_OPTIONS, SimRig
    from app.sim.server import build_parser as sim_parser

    flags = {s for act in sim_parser()._actions for s in act.option_strings}
    assert {o.flag for o in SIM_RIG_OPTIONS.values()} <= flags
    rig = SimRig(gpu="RTX 5090", count=4, hosts=2, link="ib-hdr200", time_scale=10, seed=3, perturb=7,
                 spec_acceptance=0.6, cooling="poor", ambient_c=45)
    a = sim_parser().parse_args(["--model", "m", *rig.argv()])
    assert (a.sim_gpu, a.sim_gpu_count, a.sim_hosts, a.sim_link, a.sim_time_scale, a.sim_seed, a.sim_perturb,
            a.sim_spec_acceptance, a.sim_cooling, a.sim_ambient_c) == (
        "RTX 5090", 4, 2, "ib-hdr200", 10.0, 3, 7, 0.6, "poor", 45.0)
    assert SimRig(cooling=2).cooling == "2" and SimRig(cooling="Poor").cooling == "poor"


@pytest.mark.parametrize("block,words", [("cooling: arctic", "sim.cooling.*cooling preset"),
                                         ("cooling: 0.1", "sim.cooling.*between 0.2 and 5"),
                                         ("ambient_c: 99", "sim.ambient_c.*°C ≥ 0 and ≤ 60"),
                                         ("ambient_c: hot", "sim.ambient_c.*not a temperature")])
def test_a_profiles_bad_rig_value_is_named(block, words):
    from app.profiles.io import ProfileError, parse_profile

    with pytest.raises((ProfileError, ValueError), match=words):
        parse_profile(f"name: t\nengine: sim\nserver: {{model: m}}\nsim: {{gpu: RTX 4090, count: 2, {block}}}\n")


def test_every_front_end_takes_the_rigs_cooling_and_ambient(tmp_path, dyno_home, capsys):
    """``serve --engine sim``, ``run`` (over a profile's sim: block), ``tune`` and a
    profile's ``sim:`` block all reach the sim server with --sim-cooling and
    --sim-ambient-c; ``run`` refuses them on a profile of another engine."""
    from app.cli import build_parser
    from app.cli.common import BadInput, profile_for_launch, sim_args_from
    from app.cli.tune import spec_from_args
    from app.profiles.io import parse_profile
    from app.run.controller import LaunchTarget

    p = build_parser()
    a = p.parse_args(["serve", "--model", "m", "--engine", "sim", "--sim-gpu", "RTX 4090", *HOT])
    assert sim_args_from(a) == ["--sim-gpu", "RTX 4090", *HOT[:3], "45.0"]
    prof = parse_profile("name: t\nengine: sim\nserver: {model: m}\nsim: {gpu: RTX 4090, count: 2, cooling: 2, "
                         "ambient_c: 45}\n")
    assert LaunchTarget.from_profile(prof).sim_args[-4:] == [*HOT[:3], "45.0"]
    f = tmp_path / "p.yaml"
    f.write_text("name: t\nengine: sim\nserver: {model: Qwen/Qwen2.5-7B-Instruct}\nsim: {gpu: RTX 4090, count: 2, "
                 "seed: 4}\n")
    a = p.parse_args(["run", str(f), *HOT])
    run_prof = profile_for_launch(a)[0]
    assert (run_prof.sim.cooling, run_prof.sim.ambient_c, run_prof.sim.seed, run_prof.sim.count) == ("2", 45.0, 4, 2)
    a = p.parse_args(["tune", str(f), *HOT, "--slo-ttft-p99", "2", "--dry-run"])
    assert spec_from_args(a).sim_args[-4:] == [*HOT[:3], "45.0"]
    a = p.parse_args(["tune", "--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count", "2", "--model",
                      "Qwen/Qwen2.5-7B-Instruct", *HOT, "--slo-ttft-p99", "2"])
    assert spec_from_args(a).sim_args[-4:] == [*HOT[:3], "45.0"]
    f.write_text("name: v\nengine: vllm\nserver: {model: m}\n")
    with pytest.raises(BadInput, match="--sim-cooling, --sim-ambient-c: options of the simulated rig"):
        profile_for_launch(p.parse_args(["run", str(f), *HOT]))
