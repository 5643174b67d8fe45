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

import numpy as np

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


# ---------------------------------------------------------------------- where the model is unsure (issue 35 item 2)
#: the families of a configuration (with their names in words): what the model may get
#: wrong for a whole class of configurations at once (data parallel replicas sharing a
#: host, pipeline bubbles, all-reduce over PCIe for a layout, a quantization's kernels,
#: an FP8 KV cache's attention, CUDA graphs' padding) — each value untried is measured
#: before a configuration is refined within one. The kind of parallelism groups the
#: layouts: TP2 × DP4 measured low says something of TP4 × DP2, little of TP8
FAMILY_WORDS = {"parallelism": "kinds of parallelism (TP only, DP, PP, PP+DP)", "layout": "layouts (TP × PP × DP)",
                "quantization": "quantizations", "kv_cache_dtype": "KV-cache dtypes", "cuda_graphs": "CUDA graphs",
                "vary": "other options varied"}
FAMILY_DIMS = tuple(FAMILY_WORDS)
#: refinements within a family: max_num_batched_tokens (the options the user varies are a
#: family: the model does not know their effect, app.tuner.space — a launch must tell)
REFINE_DIMS = ("max_num_batched_tokens",)
#: the model's error for a family it has not seen measured, as a log factor (sd) before
#: two families are measured: the published comparisons miss the measured best by
#: 21–23 % in 2 of 9 (issue 35; app.planner.model_error's table) — about e^0.2
TAU_PRIOR = 0.20
#: at least this much, however well the measured families agree (a log factor, 10 %)
TAU_FLOOR = 0.10
#: at most this much (a factor of e; beyond it the model ranks nothing)
TAU_MAX = 1.0
#: a refinement's error (max_num_batched_tokens, a varied option): a log factor, 5 %
TAU_REFINE = 0.05
#: a measurement's own noise (log): the search's resolution (app.tuner.tune.TUNE_RESOLUTION)
NOISE = 0.05
#: the common factor's prior sd (log): wide — one launch determines it
TAU_COMMON = 1.0
#: how many sd above its corrected prediction a candidate may be (one-sided 90 %)
Z = 1.28


def families_of(server: dict, checkpoint: str, key: str = "") -> dict[str, str]:
    """A candidate's value in each of :data:`FAMILY_DIMS` and :data:`REFINE_DIMS`, from
    its ``server`` flags (app.tuner.space.server_flags) and checkpoint label; ``vary``: the
    key's parts after the standard ones (options the user varies), '' without."""
    tp = int(server.get("tensor_parallel_size") or 1)
    pp = int(server.get("pipeline_parallel_size") or 1)
    dp = int(server.get("data_parallel_size") or 1)
    parts = key.split(" · ")
    standard = sum(1 for x in parts if x.startswith(("TP", "kv ", "mnbt ")) or x in ("graphs", "eager")) + 1
    kind = "PP+DP" if pp > 1 and dp > 1 else "PP" if pp > 1 else "DP" if dp > 1 else "TP only"
    return {"parallelism": kind, "layout": f"TP{tp} PP{pp} DP{dp}", "quantization": checkpoint or "",
            "kv_cache_dtype": str(server.get("kv_cache_dtype") or "auto"),
            "cuda_graphs": "eager" if server.get("enforce_eager") else "graphs",
            "max_num_batched_tokens": str(server.get("max_num_batched_tokens") or ""),
            "vary": " · ".join(parts[standard:])}


def family_spread(logs: Sequence[float]) -> float:
    """The model's error for an unmeasured family (log sd), from the residuals
    ``logs`` = log(measured ÷ predicted users) of the measured candidates: with two or
    more, their root mean square deviation from their mean (what one common factor
    cannot explain); with one, its own size (a model that missed one configuration by
    e^x may miss another family by as much: one launch cannot tell a common miss from a
    family's); within :data:`TAU_PRIOR` (one) or :data:`TAU_FLOOR` (more) … :data:`TAU_MAX`;
    :data:`TAU_PRIOR` with none."""
    if not logs:
        return TAU_PRIOR
    if len(logs) == 1:
        return float(min(TAU_MAX, max(TAU_PRIOR, abs(logs[0]))))
    m = sum(logs) / len(logs)
    rms = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
    return float(min(TAU_MAX, max(TAU_FLOOR, rms)))


@dataclass(frozen=True)
class Correction:
    """What the measurements imply for a candidate: its prediction × e^``log_mean``, with
    ``log_sd`` the uncertainty of that (log)."""

    log_mean: float
    log_sd: float

    def optimistic(self, z: float = Z) -> float:
        """The factor at ``z`` sd above the mean."""
        return math.exp(self.log_mean + z * self.log_sd)


def corrections(measured: Sequence[tuple[dict[str, str], float]], others: Sequence[dict[str, str]],
                tau: float) -> list[Correction]:
    """The measurements' correction of the model for each of ``others`` (families as
    :func:`families_of`): a Bayesian linear model of the log residual
    y = log(measured ÷ predicted users) = c + Σ_dim δ[dim, value] + ε over ``measured``
    (families, y) — c a common factor (prior sd :data:`TAU_COMMON`), δ one per family
    value (prior sd ``tau``) or refinement value (:data:`TAU_REFINE`), ε the search's noise
    (:data:`NOISE`). The posterior mean and sd at each of ``others``: a family measured
    low pulls its untried siblings down (re-ranked by what was measured), an untried
    family keeps ``tau`` of uncertainty. Gaussian conjugate update (ridge regression):
    Σ = (XᵀX/σ² + P)⁻¹, μ = Σ Xᵀy/σ²."""
    feats: dict[tuple[str, str], int] = {}
    for fam in [f for f, _ in measured] + list(others):
        for d in (*FAMILY_DIMS, *REFINE_DIMS):
            feats.setdefault((d, fam.get(d, "")), len(feats) + 1)
    p = len(feats) + 1
    prior = np.empty(p)
    prior[0] = 1.0 / TAU_COMMON ** 2
    for (d, _), i in feats.items():
        prior[i] = 1.0 / (tau if d in FAMILY_DIMS else TAU_REFINE) ** 2

    def row(fam: dict[str, str]) -> np.ndarray:
        x = np.zeros(p)
        x[0] = 1.0
        for d in (*FAMILY_DIMS, *REFINE_DIMS):
            x[feats[(d, fam.get(d, ""))]] = 1.0
        return x

    a = np.diag(prior)
    b = np.zeros(p)
    for fam, y in measured:
        x = row(fam)
        a += np.outer(x, x) / NOISE ** 2
        b += x * y / NOISE ** 2
    cov = np.linalg.inv(a)
    mu = cov @ b
    out = []
    for fam in others:
        x = row(fam)
        out.append(Correction(float(x @ mu), float(math.sqrt(max(0.0, x @ cov @ x)))))
    return out


@dataclass(frozen=True)
class Option:
    """An unmeasured candidate as the launch rule sees it: ``families`` (:func:`families_of`),
    ``bound`` its optimistic score (its corrected prediction at :data:`Z` sd above; higher
    is better, None: it cannot be scored), ``rank`` the tie-breaks (higher first)."""

    key: str
    families: dict[str, str]
    bound: float | None
    rank: tuple = ()


def tried_families(launched: Sequence[dict[str, str]]) -> set[tuple[str, str]]:
    """The family values (:data:`FAMILY_DIMS`) of the configurations launched so far."""
    return {(d, v) for f in launched for d, v in f.items() if d in FAMILY_DIMS}


def pick_next(options: Sequence[Option], tried: set[tuple[str, str]], need: float) -> Option | None:
    """The launch rule once something is measured (issue 35 item 2): of the options whose
    bound beats ``need`` (the best measured score plus its spread: it could still win),
    one of a family value not launched yet (``tried``) first — the best of each untried
    family before refining within one — and of those the best by ``rank`` (its corrected
    prediction first: the bound only says whether it could win; ranked by the bound, a
    candidate differing in more families, so more uncertain, went before the likelier one
    differing in one: 0.79 of the best on an FP8-KV-cache truth); None when no bound beats
    ``need`` (stop on evidence)."""
    hopeful = [o for o in options if o.bound is not None and o.bound > need]
    if not hopeful:
        return None
    new = [o for o in hopeful if any((d, v) not in tried for d, v in o.families.items() if d in FAMILY_DIMS)]
    return max(new or hopeful, key=lambda o: (o.rank, o.bound))
