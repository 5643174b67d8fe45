"""The tuner's model of the rig: predicted users at the SLO per candidate, and the
factors fitted to what was measured (issue 18, items 2–3).

A candidate's step-time parameters are its own defaults
(:func:`app.engine.steptime.default_params` for its cards, TP and quantization) × one
factor per term (:data:`FIT_NAMES`), the same factors for every candidate: what a
measurement teaches about the rig (its bandwidth and compute efficiency, its CPU
overheads, its all-reduce) carries over to the other splits and flags. The factors are
fitted to every measured candidate at once (:func:`app.planner.calibrate.fit_factors`,
a pull towards 1 for what the measurements do not determine).

Prediction, two stages (units: users, output tokens/s):

1. :func:`screen` — the analytic steady state (:func:`app.engine.steptime.predict_level`):
   the largest concurrency whose mean TTFT, TPOT and e2e stay within the SLO's bounds;
   microseconds, used only to choose which candidates the engine predicts;
2. :func:`predict` — the step-level engine running the capacity search itself
   (:func:`app.planner.predict.predict_ramp` of the workload's search spec: the same
   levels, request floor, settling and p99s as the measurement), 0.1–0.5 s each; the
   :data:`SCREEN_TOP` best screened candidates (and every measured one) get it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from app.engine.steptime import CurvePoint, StepTimeModel, predict_level
from app.loadgen.spec import SLO
from app.planner.calibrate import FIT_DEFAULT, MeasuredLevel, MeasuredSet, apply_factors, fit_factors
from app.planner.plan import Plan, Workload, build_step_model
from app.planner.predict import predict_ramp

#: the step-time terms the tuner fits (app.engine.steptime.PerfParams): the defaults of a
#: single calibration plus the all-reduce, which decides between tensor-parallel splits,
#: and the per-layer launch cost of eager mode (CUDA graphs off)
FIT_NAMES = (*FIT_DEFAULT, "allreduce_alpha_s", "link_gbs", "t_launch_layer_s")
#: how many screened candidates the step-level engine predicts in each round
SCREEN_TOP = 16


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted capacity: ``users`` at the SLO (the engine's search, or
    the screen's estimate when ``engine`` is False), ``output_tps`` at that level,
    ``users_low``/``users_high`` the engine search's interval."""

    users: float
    output_tps: float | None
    users_low: float | None = None
    users_high: float | None = None
    engine: bool = True


def step_model(p: Plan, factors: dict[str, float] | None) -> StepTimeModel | None:
    """The candidate's step-time model with its default parameters × ``factors`` (None:
    the plan has no step model — no KV cache or an invalid partition)."""
    if p.partition_error is not None or not p.ranks or any(r.kv_tokens <= 0 for r in p.ranks):
        return None
    m = build_step_model(p)
    if factors:
        m = m.with_params(apply_factors(m.params, factors, source="tuner: defaults × fitted factors"))
    return m


def _meets(pt: CurvePoint, slo: SLO) -> bool:
    return ((slo.ttft_p99 is None or pt.ttft_s <= slo.ttft_p99) and (slo.tpot_p99 is None or pt.tpot_s <= slo.tpot_p99)
            and (slo.e2e_p99 is None or pt.e2e_s <= slo.e2e_p99))


def screen(p: Plan, factors: dict[str, float] | None, w: Workload) -> float:
    """Users at ``w.slo`` by the analytic steady state (means against the p99 bounds):
    the largest N (1 … 8192, bisected) whose per-engine level meets them; 0 when even
    one user does not. Only for ranking which candidates to predict properly."""
    m, slo = step_model(p, factors), w.slo
    if m is None or slo is None:
        return 0.0
    cap, _ = p.concurrency_for(w.prompt_tokens, w.output_tokens)
    dp = p.dp

    def ok(n: int) -> bool:
        return _meets(predict_level(m, max(1, round(n / dp)), w.prompt_tokens, w.output_tokens, max(1, cap)), slo)

    if not ok(1):
        return 0.0
    lo, hi = 1, 2
    while hi <= 8192 and ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return float(lo)


def predict(p: Plan, factors: dict[str, float] | None, w: Workload) -> Prediction | None:
    """The engine's answer to the workload's capacity search on this candidate (None
    without an SLO or a step model)."""
    m = step_model(p, factors)
    spec = w.search_spec()
    if m is None or spec is None:
        return None
    cap = predict_ramp(m, p.engine_limits(), spec).capacity
    if cap is None:
        return None
    return Prediction(cap.users, cap.output_tps, cap.users_low, cap.users_high, True)


def measured_set(p: Plan, levels: Sequence[MeasuredLevel], w: Workload) -> MeasuredSet | None:
    """A measured candidate as :func:`app.planner.calibrate.fit_factors` takes it: its
    default step model, its measured levels, the workload and its per-engine capacity."""
    m = step_model(p, None)
    if m is None or not levels:
        return None
    cap, _ = p.concurrency_for(w.prompt_tokens, w.output_tokens)
    return MeasuredSet(m, tuple(levels), w.prompt_tokens, w.output_tokens, max(1, cap), p.dp)


#: the fit's weights: output tokens/s (1) and TPOT means — the steady state the analytic
#: model holds — but not the TTFT means: under closed-loop load they are queueing (prefills
#: colliding, DP replicas unevenly loaded), which the step-level engine models and the
#: analytic one does not; fitted to them, t_request_s took up the queueing (×50 on a 4×
#: RTX 5090 sim) and every prediction fell by half. The prior holds what they leave open.
TPOT_WEIGHT = 1.0
TTFT_WEIGHT = 0.0
PRIOR = 0.05


def fit(sets: Sequence[MeasuredSet]) -> dict[str, float]:
    """The factors that fit every measured candidate (empty: nothing measured yet)."""
    sets = [s for s in sets if s is not None]
    if sum(len(s.levels) for s in sets) < 2:
        return {}
    return fit_factors(sets, FIT_NAMES, prior_weight=PRIOR, ttft_weight=TTFT_WEIGHT, tpot_weight=TPOT_WEIGHT)


def residual(pairs: Sequence[tuple[float, float]]) -> float:
    """The model's residual: the geometric mean of measured ÷ predicted users over
    ``pairs`` (1.0 without any), within 0.1–10 (the CPU build's default parameters,
    fitted on one 2-core machine, were 16× off on another's load)."""
    logs = [math.log(m / p) for m, p in pairs if m > 0 and p > 0]
    if not logs:
        return 1.0
    return float(min(10.0, max(0.1, math.exp(sum(logs) / len(logs)))))


def snap_users(x: float) -> float:
    """Users as a search reports them: whole users (at least 0)."""
    return float(max(0, math.floor(x + 1e-9)))
