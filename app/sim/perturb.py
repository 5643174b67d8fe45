"""The hidden "true rig" of ``--sim-perturb SEED``: step-time parameters that differ from
the planner's by seeded factors, so that a tuner measuring the sim must calibrate instead
of reading its own model back.

Each term of :class:`app.engine.steptime.PerfParams` in :data:`PERTURBED` is multiplied
by its own factor, drawn once per seed uniformly in :data:`FACTOR_RANGE` (0.6–1.6×) and
the same for every configuration of the rig::

    true_params(default_params(config), seed) = default_params(config) × factors(seed)

so a calibration on one configuration of the rig transfers to another, as it would on
real cards. The efficiencies stay physical: η_mem's factor is drawn below 1 ÷ 0.75 (the
largest default η_mem, 16- and 8-bit weights: no default reaches 100 % of the peak
bandwidth), and a perturbed efficiency above 1 (only from a base above the defaults,
e.g. a calibration) is cut to 1. Times grow with their factor (``t_cpu_s`` × 1.4: 40 %
more CPU time a step); ``link_gbs`` is a bandwidth (× 1.4: a faster link).

Seed 0 is no perturbation: the parameters are returned unchanged. The simulated rig's
server steps with :func:`true_params` and does not show the result (``/sim/info`` says
``perturbed: true`` and the seed, never the parameters or factors); benchmarks import
this module to compute an offline grid under the same perturbation: plan each
configuration with ``params=true_params_of(plan, seed)`` (:func:`true_params_of`).
"""
from __future__ import annotations

import random
from dataclasses import replace

from app.engine.steptime import TERMS, PerfParams
from app.planner.plan import Plan, build_step_model

#: the PerfParams terms a true rig perturbs, in the order their factors are drawn
PERTURBED = TERMS
#: the factors' range (× the planner's value)
FACTOR_RANGE = (0.6, 1.6)
#: efficiencies (shares of a peak) cannot exceed this
ETA_MAX = 1.0
#: the largest default η_mem (app.engine.steptime.default_params): η_mem's factor stays below ETA_MAX ÷ this
ETA_MEM_DEFAULT_MAX = 0.75
_EFFICIENCIES = ("eta_mem", "eta_compute")


def factors(seed: int) -> dict[str, float]:
    """The true rig's factor per term of :data:`PERTURBED` for ``seed`` (all 1.0 for
    seed 0). Deterministic across processes and machines (a string-seeded
    ``random.Random``). Raises ValueError for a negative seed."""
    if seed < 0:
        raise ValueError(f"--sim-perturb {seed}: give a seed ≥ 1 (0: no perturbation)")
    if seed == 0:
        return {name: 1.0 for name in PERTURBED}
    rng = random.Random(f"vllm-dyno true rig {seed}")
    lo, hi = FACTOR_RANGE
    out = {}
    for name in PERTURBED:
        top = min(hi, ETA_MAX / ETA_MEM_DEFAULT_MAX) if name == "eta_mem" else hi
        out[name] = rng.uniform(lo, top)
    return out


def true_params(params: PerfParams, seed: int) -> PerfParams:
    """``params`` on the true rig of ``seed``: each term of :data:`PERTURBED` × its
    :func:`factors` (efficiencies at most :data:`ETA_MAX`); ``source`` says it is
    perturbed. Seed 0: ``params`` itself. Raises ValueError for a negative seed."""
    f = factors(seed)
    if seed == 0:
        return params
    changes: dict[str, float] = {name: getattr(params, name) * f[name] for name in PERTURBED}
    for name in _EFFICIENCIES:
        changes[name] = min(ETA_MAX, changes[name])
    return replace(params, **changes, source=f"{params.source}, perturbed (seed {seed})")


def true_params_of(plan: Plan, seed: int) -> PerfParams:
    """The parameters the simulated rig of ``seed`` steps with for the configuration of
    ``plan`` (a sim without ``--sim-calibrated`` or ``--sim-eta-…`` overrides): the
    planner's defaults for its cards, TP and quantization × :func:`factors`. Pass them
    as ``app.planner.plan.plan(…, params=…)`` to predict that rig offline."""
    return true_params(build_step_model(plan).params, seed)
