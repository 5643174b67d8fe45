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
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Protocol

from app.config import ServerConfig
from app.loadgen.spec import RampSpec
from app.planner.models import resolve_model
from app.planner.plan import Plan, build_step_model, check
from app.planner.predict import PredictedRamp, predict_ramp
from app.sim import model_adapter as ma
from app.sim.perturb import true_params_of
from app.tuner.model import step_model
from app.run.controller import RecordSpec
from app.tuner.tune import Measurement, TuneSpec


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
