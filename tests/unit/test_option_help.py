"""The form's tooltip facts (issue 19, item 5): vLLM's defaults per version and cards —
the batch defaults of vllm/engine/arg_utils.py ``get_batch_defaults`` (checked in the
0.32.0 wheel: OPENAI_API_SERVER rows; the CPU build 128 sequences and 2,048 tokens per
rank of TP × PP) — and the planner's advice, both read from one Plan."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.planner.cards import cards_for
from app.planner.models import resolve_model
from app.planner.option_help import option_notes
from app.planner.plan import plan
from app.planner.versions import rules_for

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("gpu,seqs,mnbt", [("RTX 4090", 256, 2048), ("H100 SXM", 1024, 8192),
                                           ("A100 80GB SXM", 256, 2048), ("B200", 1024, 16384)])
def test_the_batch_defaults_follow_the_cards_memory(gpu, seqs, mnbt):
    cfg = ServerConfig(model=MODEL, max_model_len=8192)
    p = plan(cfg, cards_for(engine="sim", gpu=gpu, count=1), resolve_model(MODEL), None, "0.32.0",
             use_calibration=False, predict=False)
    n = option_notes(p)
    assert n["max_num_seqs"].default.startswith(f"{seqs:,} (vLLM 0.32.0, ")
    assert n["max_num_batched_tokens"].default.startswith(f"{mnbt:,} (vLLM 0.32.0, ")
    assert p.effective.max_num_seqs == seqs  # the planner sizes with the same default


def test_the_cpu_build_defaults_scale_with_its_ranks():
    r = rules_for("0.32.0+cpu")
    assert r.batch_defaults(64.0, "CPU", cpu_world=1) == (128, 2048)
    assert r.batch_defaults(64.0, "CPU", cpu_world=2) == (256, 4096)
    assert rules_for("0.11.0").batch_defaults(64.0, "CPU", cpu_world=1) == (256, 2048)  # no CPU row recorded
    cfg = ServerConfig(model=MODEL, max_model_len=4096, env={"VLLM_CPU_KVCACHE_SPACE": "8"})
    p = plan(cfg, cards_for(cpu_build=True, memory_gib=64.0), resolve_model(MODEL), None, "0.32.0",
             use_calibration=False, predict=False)
    assert p.effective.max_num_seqs == 128
    assert "the CPU build" in option_notes(p)["max_num_seqs"].default


def test_advice_names_the_fix_and_the_figures():
    cfg = ServerConfig(model=MODEL, gpu_memory_utilization=0.8)  # 131,072 tokens do not fit
    p = plan(cfg, cards_for(engine="sim", gpu="RTX 4090", count=1), resolve_model(MODEL), None, "0.32.0",
             use_calibration=False, predict=False)
    assert "context_exceeds_kv_cache" in p.problems()
    n = option_notes(p)
    fix = p.fix["max_model_len"]
    assert any(f"Fix: max_model_len {fix:,}." in a for a in n["max_model_len"].advice), n["max_model_len"].advice
    assert any("at 0.80 the KV cache holds" in a for a in n["gpu_memory_utilization"].advice)
    assert n["gpu_memory_utilization"].default == "0.92 (vLLM 0.32.0)"
    assert n["dtype"].default == "auto → bfloat16 for this model on these cards"
    turing = plan(cfg, cards_for(engine="sim", gpu="RTX 2080 Ti", count=1), resolve_model(MODEL), None, "0.32.0",
                  use_calibration=False, predict=False)
    assert option_notes(turing)["dtype"].default == "auto → float16 for this model on these cards"


@pytest.mark.parametrize("version,active,queued", [
    ("0.32.0", "max_num_seqs (256): every running slot is used (vLLM 0.32.0)", "no cap: every request is queued"),
    ("0.30.0", "not in vLLM 0.30.0 (from 0.31)", "no cap: every request is queued"),
    ("0.28.0", "not in vLLM 0.28.0 (from 0.31)", "not in vLLM 0.28.0 (from 0.29)")])
def test_admission_controls_default_to_no_cap_where_vllm_has_them(version, active, queued):
    """vLLM's SchedulerConfig leaves the three admission limits unset (vllm/config/scheduler.py
    @ 0.32.0): the form's tooltip says what that means, or that the plan's version lacks them."""
    p = plan(ServerConfig(model=MODEL, max_model_len=8192), cards_for(engine="sim", gpu="RTX 4090", count=1),
             resolve_model(MODEL), None, version, use_calibration=False, predict=False)
    n = option_notes(p)
    assert n["max_num_active_seqs"].default.startswith(active), n["max_num_active_seqs"].default
    assert n["max_num_queued_reqs"].default.startswith(queued) and n["max_num_queued_tokens"].default
