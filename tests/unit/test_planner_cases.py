"""Every launch case of tests/cases/launch/: the planner's verdict/problem/fix on
hardware + model + server, and the diagnoser's problem/fix on the log."""
from __future__ import annotations

import pytest
import yaml

from app.config import ServerConfig
from app.planner.diagnose import diagnose
from app.planner.gpus import gpus_from_hardware
from app.planner.models import ModelArch
from app.planner.plan import apply_fix, plan
from tests.conftest import CASES

CASE_FILES = sorted((CASES / "launch").glob("*.yaml"))


def load(path):
    return yaml.safe_load(path.read_text())


def case_plan(c, **server_overrides):
    server = {**c["server"], **server_overrides}
    cfg = ServerConfig(model=c["id"], env=dict(c.get("env") or {}), **server)
    return cfg, plan(cfg, gpus_from_hardware(c["hardware"]), ModelArch.from_config(c["model"], c["id"]),
                     use_calibration=False)


def test_there_are_cases():
    assert len(CASE_FILES) >= 8


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.stem)
def test_plan_verdict_problem_fix(path):
    c = load(path)
    exp = c["expect"]["plan"]
    cfg, p = case_plan(c)
    assert p.verdict == exp["verdict"], [(f.problem, f.verdict, f.message) for f in p.findings]
    if "problem" in exp:
        assert p.problem == exp["problem"]
    if "fix" in exp:
        assert p.fix == exp["fix"]
    if "kv_bytes_per_token" in exp:
        assert p.kv_bytes_per_token == exp["kv_bytes_per_token"]
    # every offered fix removes its problem and adds no error; where its problem was the
    # only error (or a warning in a plan without errors), the fixed plan has no error at all
    errors = {f.problem for f in p.findings if f.verdict == "error"}
    for f in p.findings:
        if f.fix is not None:
            q = plan(apply_fix(cfg, f.fix), p.gpus, p.model, use_calibration=False)
            new = {g.problem for g in q.findings if g.verdict == "error"} - errors
            assert not new and f.problem not in q.problems(), (f.problem, f.fix, q.problems())
            if errors <= {f.problem}:
                assert q.verdict != "error", (f.problem, f.fix, q.problems())


@pytest.mark.parametrize("path", CASE_FILES, ids=lambda p: p.stem)
def test_diagnosis_problem_fix(path):
    c = load(path)
    exp = c["expect"]["diagnosis"]
    d = diagnose(c["log"].splitlines(), c.get("silent_for_s"))
    assert d is not None
    assert d.problem == exp["problem"]
    if "fix" in exp:
        assert d.fix == exp["fix"]
    assert d.evidence and all(line in c["log"] for line in d.evidence)
    assert d.problem in d.summary()


def test_tp_fix_skips_tp1_that_does_not_fit():
    """TP 1 divides the heads too, but 13B fp16 does not fit one 24 GB card."""
    c = load(CASES / "launch" / "tp-not-dividing-heads.yaml")
    _, p = case_plan(c, tensor_parallel_size=1)
    assert p.verdict == "error" and p.problem == "weights_do_not_fit"
    assert p.fix == {"tensor_parallel_size": 2}


def test_free_vram_fix_is_rounded_down():
    c = load(CASES / "launch" / "other-process-holds-vram.yaml")
    c["hardware"]["busy_gib"] = [16.3]  # (47.38 − 16.3) / 47.38 = 0.6559… → 0.65, never 0.66
    _, p = case_plan(c)
    assert p.fix == {"gpu_memory_utilization": 0.65}


def test_mixed_cards_each_stage_on_its_own_card():
    c = load(CASES / "launch" / "context-too-long-for-kv.yaml")
    _, p = case_plan(c)
    r0, r1 = p.ranks
    assert (r0.gpu.name, r0.total_gib, len(r0.layers)) == ("RTX 5070 Ti", 16.0, 16)
    assert (r1.gpu.name, r1.total_gib, len(r1.layers)) == ("RTX 5090", 32.0, 32)
    assert r0.kv_bytes_per_token == 98304 // 3 and r1.kv_bytes_per_token == 2 * 98304 // 3
    assert p.kv_cache_tokens == min(r0.kv_tokens, r1.kv_tokens)
    # the fix for the context: the largest max_model_len that fits, which then passes — one block short of
    # the pool, the null block vLLM holds back (vllm/v1/core/kv_cache_utils.py:2618–2640 @ 0.32.0)
    assert p.fix == {"max_model_len": p.kv_cache_tokens - p.effective.block_size} == {"max_model_len": p.fitting_model_len()}
