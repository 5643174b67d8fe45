"""Prediction vs reality: the plan against what the launch logged (app.server.logparse
CapacityFacts) and the predicted curve against a measured ramp. The results are plain
records (``as_dict``) for the run store."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from app.planner.calibrate import LevelError, MeasuredLevel, level_errors
from app.planner.plan import Plan


@dataclass(frozen=True)
class Comparison:
    """One figure: predicted and measured value in ``unit``; ``error_pct`` = (predicted −
    measured) / measured × 100, None when the log did not show the figure."""

    metric: str
    unit: str
    predicted: float
    measured: float | None
    error_pct: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cmp(metric: str, unit: str, pred: float, meas: float | None) -> Comparison:
    err = None if meas in (None, 0) else 100.0 * (pred - meas) / meas
    return Comparison(metric, unit, pred, meas, err)


def compare_launch(p: Plan, facts: Any) -> list[Comparison]:
    """Plan vs the startup log (``facts``: a CapacityFacts): weights per GPU
    (``Model loading took X GiB``, rank 0), available KV cache GiB, KV cache tokens and
    maximum concurrency. Figures the log lacks come back with ``measured=None``."""
    r0 = p.ranks[0]
    out = [
        _cmp("kv_cache_tokens", "tokens", float(p.kv_cache_tokens), facts.kv_cache_tokens),
        _cmp("available_kv_cache", "GiB", r0.kv_gib, facts.available_kv_cache_gib),
    ]
    if r0.gpu.kind != "cpu":
        out.append(_cmp("weights_per_gpu", "GiB", r0.weights_gib, facts.model_loading_gib))
    if facts.max_concurrency is not None and facts.max_concurrency_tokens_per_request:
        # the pool's blocks over one request's blocks in every KV cache group (app.engine.kvcache)
        pred = p.kv_layout.max_concurrency(p.kv_blocks, facts.max_concurrency_tokens_per_request,
                                           p.effective.in_flight_tokens)
        out.append(_cmp("max_concurrency", "requests", pred, facts.max_concurrency))
    return out


def compare_ramp(p: Plan, measured: Sequence[MeasuredLevel], prompt_tokens: int, output_tokens: int) -> list[LevelError]:
    """The plan's step-time model vs a measured closed-loop ramp, level by level.
    Raises ValueError when the plan has no performance model (it does not fit)."""
    if p.perf is None:
        raise ValueError("the plan has no performance model (the configuration does not fit); fix it first")
    cap, _ = p.concurrency_for(prompt_tokens, output_tokens)
    return level_errors(p.perf, measured, prompt_tokens, output_tokens, cap)
