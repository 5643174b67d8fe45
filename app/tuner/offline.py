"""A hidden "true rig" without HTTP: what the simulated rig serves with ``--sim-perturb
SEED``, measured by the step-level engine directly (issue 18, item 8).

Each configuration's capacity search runs on :func:`app.planner.predict.predict_ramp`
with the true parameters of the sim (:func:`app.sim.perturb.true_params_of`: the
planner's defaults × the seed's factors) and, given one, the sim's truth on top (what
``--sim-truth`` steps with: an object whose ``apply`` gives the plan under it; this
package never imports the truth's module) — the scheduler, step times, level shape and
statistics of the sim's own engine, minus the HTTP stack and the wall clock. The
benchmark computes the exhaustive grid with it (the HTTP sim on 2 cores is too slow for
one), and tests run whole tunes on it in seconds. The tuner does not see the factors:
it gets :class:`app.tuner.tune.Measurement` objects, as from a launch.

Start-up time (rig s): the sim's own load time for the configuration
(:func:`app.sim.model_adapter.plan_rig`) plus its profiling and CUDA-graph capture
(app/sim/server.py: 2 + 0.5·TP s, and 8 s unless eager).

A configuration's *true* users (the grid's figure, what a pick is judged on:
:meth:`OfflineRig.true_capacity`) are the mean of :func:`repeats_for` searches, each
with fresh request lengths: a single search at a p99 SLO is noisy (whether two prefills
collided in the tail), and a mean of n whole-user searches moves in steps of 1/n user —
enough searches that one such step is ≤ :data:`TRUTH_STEP` of the figure (issue 35
item 3), so that a 5 % goal is judged on a finer truth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from app.config import ServerConfig
from app.loadgen.capacity import Capacity
from app.loadgen.spec import CapacitySearch, RampSpec
from app.planner.models import resolve_model
from app.planner.plan import Plan, build_step_model, check
from app.planner.predict import PredictedRamp, predict_ramp
from app.sim import model_adapter as ma
from app.sim.perturb import true_params_of
from app.tuner.model import step_model
from app.run.controller import RecordSpec
from app.tuner.tune import Measurement, TuneSpec


#: the share of a true figure that one step of its mean (1 user ÷ searches) may be
TRUTH_STEP = 0.02
#: the most searches a true figure is the mean of (CapacitySearch.repeat's bound): below
#: 1 ÷ (TRUTH_STEP × MAX_REPEATS) = 2.5 users the step stays coarser than TRUTH_STEP
MAX_REPEATS = 20
#: searches added first, before the mean so far decides how many more (OfflineRig.true_capacity)
PROBE_REPEATS = 4


def repeats_for(users: float, least: int = 1) -> int:
    """Searches to average for a true capacity of about ``users`` (a single search's):
    enough that 1 user ÷ searches ≤ :data:`TRUTH_STEP` × users, at least ``least``, at
    most :data:`MAX_REPEATS`."""
    return int(min(MAX_REPEATS, max(least, math.ceil(1.0 / (TRUTH_STEP * max(users, 1e-9)) - 1e-9))))


@dataclass(frozen=True)
class GridEntry:
    """One configuration's true capacity on the offline rig: ``users`` the mean of
    ``searches`` capacity searches (users at the SLO), ``users_low``/``users_high`` the
    range of theirs, ``output_tps`` (output tokens/s at the capacity level, the last
    search's), ``rig_seconds`` the first search's levels (rig s: what one launch's
    search costs a grid tool, start-up excluded)."""

    users: float
    users_low: float
    users_high: float
    output_tps: float | None
    searches: int
    rig_seconds: float


class RigTruth(Protocol):
    """A simulated rig's truth as the offline rig steps with it (app.profiles.truth's
    ``Truth``, which this package never imports nor reads): the plan → the plan under it."""

    def apply(self, p: Plan) -> Plan: ...


class OfflineRig:
    """The true rig of ``spec``'s cards with perturbation ``seed`` (0: the planner's own
    defaults) and ``truth`` (None: none) on top, measured offline: it answers with
    measurements only. ``launches`` counts :meth:`measure` calls."""

    def __init__(self, spec: TuneSpec, seed: int = 0, truth: RigTruth | None = None) -> None:
        self.spec, self.seed = spec, seed
        self._truth = truth
        self.cards = spec.hardware.planner_cards()
        self.workload = spec.workload()
        self.launches = 0

    def search(self, cfg: ServerConfig, ramp: RampSpec | None = None) -> tuple[PredictedRamp | None, float]:
        """The capacity search ``ramp`` (default: the tune's, from 1 user) on the true
        rig: (the engine's ramp, its levels' rig seconds); (None, 0) when ``cfg`` has no
        KV cache."""
        p = check(cfg, self.cards[:cfg.world_size], resolve_model(cfg.model), self.workload, self.spec.vllm_version,
                  rig=self.spec.hardware.rig_layout())
        if step_model(p, None) is None:
            return None, 0.0
        p = replace(p, perf=build_step_model(p, true_params_of(p, self.seed)))
        if self._truth is not None:
            p = self._truth.apply(p)
        assert p.perf is not None  # built just above
        spec = ramp or self.workload.search_spec()
        assert spec is not None  # a tune has an SLO, so its workload a search
        pred = predict_ramp(p.perf, p.engine_limits(), spec)
        return pred, sum(s.t_end - s.t_start for s in pred.steps)

    def true_capacity(self, cfg: ServerConfig, least: int = 1) -> GridEntry | None:
        """``cfg``'s true users at the SLO: one search, then, where one user is more than
        :data:`TRUTH_STEP` of its answer, the mean of :func:`repeats_for` searches (at
        least ``least``: the first and the others started at its answer, fewer levels to probe); None when ``cfg`` has no KV cache or no search answer. Raises
        :class:`app.sim.model_adapter.Refusal` as the sim refuses the configuration."""
        first, rig_s = self.search(cfg)
        if first is None or first.capacity is None:
            return None
        cap: Capacity = first.capacity
        runs = [cap.users]
        base = self.workload.search_spec()
        assert base is not None and base.search is not None  # a tune has an SLO, so a search
        stage = 0
        while len(runs) < (n := repeats_for(sum(runs) / len(runs), least)):
            # more searches started at the answer so far, with fresh lengths: a first stage of at
            # most PROBE_REPEATS, then the rest of what the mean so far asks for (a first search
            # that said 2 users of a true 3.6 asks 20; the mean of 5 says 14)
            more = n - len(runs) if stage else min(PROBE_REPEATS, n - len(runs))
            stage += 1
            ramp = base.model_copy(update={"seed": base.seed + 7919 * stage, "search": CapacitySearch(**{
                **base.search.model_dump(), "repeat": more, "start": float(max(1, math.floor(sum(runs) / len(runs))))})})
            again, _ = self.search(cfg, ramp)
            assert again is not None and again.capacity is not None  # the same configuration answered above
            runs += list(again.capacity.repeat_users or [again.capacity.users])
            cap = again.capacity
        return GridEntry(sum(runs) / len(runs), min(runs), max(runs), cap.output_tps, len(runs), rig_s)

    def startup_seconds(self, cfg: ServerConfig) -> float:
        hw = self.spec.hardware
        rig = hw.rig_layout()
        plan = ma.plan_rig(cfg, hw.gpu, hw.count, rig.hosts if rig else 1, hw.link if rig else None)
        tp = cfg.tensor_parallel_size or 1
        return plan.load_s + 2.0 + 0.5 * tp + (0.0 if cfg.enforce_eager else 8.0)

    def measure(self, cfg: ServerConfig, ramp: RampSpec, record: RecordSpec,
                check_abort: Callable[[], None]) -> Measurement:
        """One "launch": the search on the true rig (``record`` is not stored: nothing ran)."""
        self.launches += 1
        check_abort()
        try:
            pred, rig_s = self.search(cfg, ramp)
        except ma.Refusal as r:
            return Measurement(status="launch_failed", error=r.text)
        if pred is None or pred.capacity is None:
            return Measurement(status="launch_failed", error="no memory left for the KV cache")
        return Measurement(status="done", rig_seconds=rig_s + self.startup_seconds(cfg), capacity=pred.capacity,
                           steps=pred.steps)
