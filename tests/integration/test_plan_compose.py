"""One plan composition (issue 33, item 6): the window and ``vllm-dyno run`` plan a
profile alike — the same vLLM rules (the sim's pinned rules for a sim rig, whatever
vLLM is installed), the same calibration (none for the sim: its step times are its own
defaults) and the same prediction — through :func:`app.planner.plan.plan_for`.

Integration tier: the window's planning function lives in a Qt module
(``widgets.plan_panel``); nothing is shown.
"""
from __future__ import annotations

from app.engines import SIM_VLLM_RULES, Engine
from app.profiles.io import parse_profile
from app.run.profile_run import plan_profile
from widgets.plan_panel import PlanInputs, compute_plan

SIM_PROFILE = ("name: compose\nengine: sim\nsim: {gpu: RTX 4090, count: 2, spec_acceptance: 0.6}\n"
               "server: {model: Llama-3-8B, tensor_parallel_size: 2, max_model_len: 4096}\n"
               "ramp: {levels: [1, 4, 16], prompt_tokens: 256, output_tokens: 64, slo: {ttft_p99: 2.0}}\n")


def test_the_window_and_run_plan_a_sim_profile_alike() -> None:
    prof = parse_profile(SIM_PROFILE)
    assert prof.sim is not None
    installed = "0.33.0"  # the interpreter's vLLM: a sim rig's plan does not follow it
    run_plan = plan_profile(prof, installed)
    inp = PlanInputs(prof.server_config(), Engine.SIM, prof.sim.gpu, prof.sim.count, [], 256, 64, None, installed,
                     prof.ramp, prof.sim.spec_acceptance)
    window_plan = compute_plan(inp)
    assert run_plan is not None
    assert window_plan.as_dict() == run_plan.as_dict()
    assert run_plan.rules.version.startswith(SIM_VLLM_RULES)
    assert "calibrated" not in (run_plan.perf.params.source or "")
