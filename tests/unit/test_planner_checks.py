"""Checks beyond the launch cases (tests/cases/launch/): version-dependent options and
defaults, CPU build, seed scenario capacity, fixes that must pass every check."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.planner.gpus import cpu_device, gpus_from_hardware, lookup_gpu
from app.planner.models import from_catalog
from app.planner.plan import Workload, apply_fix, fix_to_flags, plan


def seed(count: int, **kw):
    cfg = ServerConfig(model="Llama-3-70B", tensor_parallel_size=count, quantization="awq", max_model_len=8192, **kw)
    return plan(cfg, [lookup_gpu("RTX 5090")] * count, from_catalog("Llama-3-70B"), Workload.of(512, 128),
                vllm_version="0.32.0", use_calibration=False)


def test_seed_scenario_fits_and_notes_no_p2p():
    """GeForce cards without P2P: information, not a warning — NCCL and vLLM handle it
    themselves (tests/unit/test_planner_parallel.py has the sources)."""
    for n in (4, 8):
        p = seed(n)
        assert p.verdict == "ok" and p.problem is None and p.fix is None
        f = next(f for f in p.findings if f.problem == "no_p2p")
        assert f.verdict == "info" and f.fix is None
        assert p.ranks[0].weights_gib == pytest.approx(37.03 / n, rel=0.01)
        assert p.workload_concurrency == 256  # max_num_seqs, not KV, limits 512+128 requests
    p4 = seed(4)
    # docs/perf-model.md: ≈ 230k KV tokens free at TP4; 30 × 640 need 19k — no OOM at 30 users
    assert 200_000 < p4.kv_cache_tokens < 280_000
    fixed = seed(4, env={"NCCL_P2P_DISABLE": "1"}, disable_custom_all_reduce=True)
    assert fixed.verdict == "ok"
    assert "NCCL_P2P_DISABLE=1 changes nothing" in next(f for f in fixed.findings if f.problem == "no_p2p").message


def test_swap_space_refused_by_032_accepted_by_010():
    cfg = ServerConfig(model="Llama-3.1-8B-Instruct", extra_args=["--swap-space", "4"])
    gpus = [lookup_gpu("H100 SXM")]
    p = plan(cfg, gpus, from_catalog("Llama-3.1-8B-Instruct"), vllm_version="0.32.0", use_calibration=False)
    assert p.problem == "option_not_accepted" and p.fix == {"swap_space": None}
    assert apply_fix(cfg, p.fix).extra_args == []
    old = plan(cfg, gpus, from_catalog("Llama-3.1-8B-Instruct"), vllm_version="0.10.2", use_calibration=False)
    assert "option_not_accepted" not in old.problems()


def test_default_utilization_follows_version():
    cfg = ServerConfig(model="m")
    m = from_catalog("Qwen2.5-7B")
    assert plan(cfg, [lookup_gpu("RTX 4090")], m, vllm_version="0.10.2").effective.utilization == 0.9
    assert plan(cfg, [lookup_gpu("RTX 4090")], m).effective.utilization == 0.92  # newest known


def test_awq_bf16_only_refused_by_old_versions():
    cfg = ServerConfig(model="m", quantization="awq", dtype="bfloat16")
    m = from_catalog("Qwen2.5-7B-Instruct-AWQ")
    old = plan(cfg, [lookup_gpu("RTX 4090")], m, vllm_version="0.10.2", use_calibration=False)
    assert old.problem == "dtype_unsupported_by_quantization" and old.fix == {"dtype": "half"}
    assert plan(cfg, [lookup_gpu("RTX 4090")], m, vllm_version="0.32.0").verdict == "ok"


def test_max_model_len_over_model_limit_and_batched_tokens():
    m = from_catalog("Llama-3-8B")
    p = plan(ServerConfig(model="m", max_model_len=16384), [lookup_gpu("H100 SXM")], m)
    assert p.problem == "max_model_len_exceeds_model" and p.fix == {"max_model_len": 8192}
    p = plan(ServerConfig(model="m", max_num_seqs=4096), [lookup_gpu("RTX 4090")], m)
    assert "batched_tokens_below_num_seqs" in p.problems()
    f = next(f for f in p.findings if f.problem == "batched_tokens_below_num_seqs")
    assert f.fix == {"max_num_batched_tokens": 4096}


def test_weights_that_do_not_fit_get_more_cards_not_a_fake_fix():
    m = from_catalog("Llama-3-70B")  # bf16, 131 GiB
    cfg = ServerConfig(model="m")
    p = plan(cfg, gpus_from_hardware({"gpu": "H100 SXM", "count": 4}), m, use_calibration=False)
    f = p.primary
    assert p.problem == "weights_do_not_fit" and p.fix == f.alternatives[0][0]  # the fastest that fits
    assert {"tensor_parallel_size": 2} in [a for a, _ in f.alternatives]  # TP 2 fits too, ranked below
    assert plan(apply_fix(cfg, p.fix), p.gpus, m, use_calibration=False).verdict != "error"
    lone = plan(ServerConfig(model="m"), [lookup_gpu("RTX 4090")], m)
    assert lone.problem == "weights_do_not_fit" and lone.fix is None and lone.curve is None


def test_quantization_unknown_to_version():
    m = from_catalog("Llama-3-8B")
    p = plan(ServerConfig(model="m", quantization="gguf"), [lookup_gpu("RTX 4090")], m, vllm_version="0.33.0")
    assert p.problem == "quantization_unknown" and p.fix == {"quantization": None}


def test_graph_headroom_warning_at_high_utilization():
    # max_num_seqs 64: the sampler warm-up (64 × 128,256 × fp32 × 3 ≈ 0.09 GiB) fits the 0.24 GiB
    # headroom, the graphs (≈ 0.36 GiB) do not — a risk on the assumed graph size, a warning
    m = from_catalog("Llama-3-8B")
    p = plan(ServerConfig(model="m", gpu_memory_utilization=0.99, max_num_seqs=64), [lookup_gpu("RTX 4090")], m)
    assert p.verdict == "warn" and p.problem == "cuda_graph_oom_risk"
    assert p.fix is not None and p.fix["gpu_memory_utilization"] < 0.99
    eager = plan(ServerConfig(model="m", gpu_memory_utilization=0.99, max_num_seqs=64, enforce_eager=True),
                 [lookup_gpu("RTX 4090")], m)
    assert "cuda_graph_oom_risk" not in eager.problems()


def test_cpu_build_kv_tokens_from_kv_space(tiny_model):
    from app.planner.models import resolve_model

    cfg = ServerConfig(model=str(tiny_model), max_num_seqs=8, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    p = plan(cfg, [cpu_device(24, 2)], resolve_model(str(tiny_model)), use_calibration=False)
    assert p.verdict == "warn" and p.problems() == ["cpu_worker_busy_wait"]
    assert p.kv_cache_tokens == 1_048_576  # 1 GiB / 1,024 B per token (docs/vllm-facts.md)
    assert p.max_concurrency == pytest.approx(1_048_576 / 2048)


def test_cpu_build_default_executor_warns_and_the_fix_needs_both_settings(tiny_model):
    """The CPU build's separate Worker process busy-waits (docs/cli.md); the fix is the
    in-process executor, which takes the option AND the environment variable."""
    from app.planner.models import resolve_model

    m = resolve_model(str(tiny_model))
    cfg = ServerConfig(model=str(tiny_model), max_num_seqs=8, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    f = next(f for f in plan(cfg, [cpu_device(24, 2)], m, use_calibration=False).findings
             if f.problem == "cpu_worker_busy_wait")
    assert f.verdict == "warn" and "VLLM_ENABLE_V1_MULTIPROCESSING=0" in f.message
    fixed = apply_fix(cfg, f.fix)
    assert fixed.distributed_executor_backend == "uni" and fixed.extra_args == []
    assert "--distributed-executor-backend uni" in fixed.shell_command()
    assert fixed.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and fixed.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert plan(fixed, [cpu_device(24, 2)], m, use_calibration=False).verdict == "ok"
    # the option alone is not enough: the CPU platform turns uni back into mp
    half = apply_fix(cfg, {"distributed_executor_backend": "uni"})
    assert "cpu_worker_busy_wait" in plan(half, [cpu_device(24, 2)], m, use_calibration=False).problems()
    # GPUs: no such warning
    gpu = plan(ServerConfig(model="meta-llama/Meta-Llama-3-8B-Instruct"), [lookup_gpu("RTX 4090")],
               from_catalog("meta-llama/Meta-Llama-3-8B-Instruct"), use_calibration=False)
    assert "cpu_worker_busy_wait" not in gpu.problems()


def test_fix_to_flags():
    assert fix_to_flags({"env": {"NCCL_P2P_DISABLE": "1"}, "disable_custom_all_reduce": True}) == \
        "NCCL_P2P_DISABLE=1 --disable-custom-all-reduce"
    assert fix_to_flags({"max_model_len": 34736}) == "--max-model-len 34736"


def test_empty_gpu_list_is_a_clear_error():
    with pytest.raises(ValueError, match="--gpu"):
        plan(ServerConfig(model="m"), [], from_catalog("Llama-3-8B"))


def test_with_two_errors_each_gets_its_fix_and_none_points_past_the_model():
    """A max_model_len of 10 M on 8× RTX 4090 / 70B AWQ is over the model's 8,192 and over
    the KV cache: both errors, and the P2P warning, offer fixes (not "none" because another
    error remains), and the KV fix never offers more than the model supports."""
    m = from_catalog("Llama-3-70B")
    cfg = ServerConfig(model="Llama-3-70B", tensor_parallel_size=8, quantization="awq", max_model_len=10_000_000)
    p = plan(cfg, [lookup_gpu("RTX 4090")] * 8, m, use_calibration=False)
    fixes = {f.problem: f.fix for f in p.findings}
    assert fixes["max_model_len_exceeds_model"] == {"max_model_len": 8192}
    assert fixes["context_exceeds_kv_cache"] == {"max_model_len": 8192}
    assert fixes["no_p2p"] is None and next(f for f in p.findings if f.problem == "no_p2p").verdict == "info"
    assert plan(apply_fix(cfg, fixes["context_exceeds_kv_cache"]), p.gpus, m, use_calibration=False).verdict != "error"


def test_valid_parallel_sizes_are_the_planner_rule():
    """The form offers what the planner accepts (one rule, app.planner.checks)."""
    from app.planner.checks import tp_divides, valid_pp_sizes, valid_tp_sizes

    # Llama-3-70B: 64 heads, 8 KV heads, 80 layers
    assert valid_tp_sizes(8, 1, 64, 8) == [1, 2, 4, 8]
    assert valid_tp_sizes(8, 2, 64, 8) == [1, 2, 4]
    assert valid_tp_sizes(6, 1, 64, 8) == [1, 2, 4]  # 3, 5, 6 do not divide 64
    assert valid_tp_sizes(8, 1, 40, 2) == [1, 2, 4, 8]  # 5 divides the 40 heads, not the 2 KV heads
    assert valid_tp_sizes(4) == [1, 2, 3, 4] and valid_tp_sizes(0) == [1]
    assert tp_divides(8, 64, 4) and not tp_divides(3, 64, 8)
    assert valid_pp_sizes(8, 2, 80) == [1, 2, 3, 4] and valid_pp_sizes(8, 1, 2) == [1, 2]
    # data parallel: TP × PP × DP ≤ cards (vLLM's world_size_across_dp, vllm/config/parallel.py:623, 0.32.0)
    from app.planner.checks import valid_dp_sizes

    assert valid_dp_sizes(8, 2, 2) == [1, 2] and valid_dp_sizes(4, 4) == [1] and valid_dp_sizes(8) == list(range(1, 9))
    assert valid_dp_sizes(4, 8) == [1]  # a replica larger than the cards: DP 1 is still offered (the plan says why)
    assert valid_tp_sizes(4, 1 * 2, 64, 8) == [1, 2]  # PP 1 × DP 2 on 4 cards: no TP 4, no TP 8
