"""Ramp safety stops, from the user's Settings (:class:`app.settings.SafetyLimits`).

The run controller applies them to every ramp, whichever front end started it (the
window's Ramp, the Tune tab, ``run``, ``ramp``, ``tune``): a caller that gives no limits
gets the user's Settings (:func:`resolve_safety`), one that gives its own (``ramp
--max-failure-rate``) gets those, and only :data:`NO_SAFETY`, given explicitly, runs a
ramp without them.

- :func:`apply_safety`: the failure-rate limit becomes the ramp's ``max_failure_rate``
  (the load generator stops a level whose failures pass it); safety off → 1.0 (never).
- :func:`thermal_stop_reason`: checked every :data:`CHECK_INTERVAL_S` while a ramp runs;
  a GPU within ``thermal_margin_c`` °C of its slowdown temperature (NVML
  ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``, sampled as ``temp_slowdown_c``) stops the
  ramp, saying why.
"""
from __future__ import annotations

from app.loadgen.spec import RampSpec
from app.settings import SafetyLimits, load_settings
from app.telemetry import names
from app.telemetry.series import SeriesBank

#: seconds between two thermal checks of a running ramp
CHECK_INTERVAL_S = 0.5


class NoSafety:
    """The type of :data:`NO_SAFETY`."""

    def __repr__(self) -> str:
        return "NO_SAFETY"


#: a caller's explicit opt-out of the safety stops: no thermal stop, and the ramp spec's own
#: ``max_failure_rate`` (benchmarks and tests that measure a failing server on purpose)
NO_SAFETY = NoSafety()


def resolve_safety(safety: SafetyLimits | NoSafety | None) -> SafetyLimits | None:
    """The limits a ramp runs with: ``None`` (the caller gave none) → the user's Settings,
    read now (a change in Settings applies from the next ramp); a SafetyLimits → those;
    :data:`NO_SAFETY` → None (no limits). Raises TypeError for anything else."""
    if isinstance(safety, NoSafety):
        return None
    if safety is None:
        return load_settings().safety
    if not isinstance(safety, SafetyLimits):
        raise TypeError(f"safety={safety!r}: give SafetyLimits, None (the user's Settings) or NO_SAFETY")
    return safety


def apply_safety(spec: RampSpec, safety: SafetyLimits | None) -> RampSpec:
    """``spec`` (a RampSpec) with the failure-rate limit of ``safety`` (SafetyLimits, as
    :func:`resolve_safety` gives it; None = leave the spec's own limit): enabled →
    ``max_failure_rate`` = the setting's fraction; disabled → 1.0."""
    if safety is None:
        return spec
    rate = safety.max_failure_rate if safety.enabled else 1.0
    return spec if spec.max_failure_rate == rate else spec.model_copy(update={"max_failure_rate": rate})


def thermal_stop_reason(bank: SeriesBank, margin_c: float) -> str | None:
    """The sentence to stop the ramp with, or None while every GPU is cool enough.

    ``bank``: a :class:`app.telemetry.series.SeriesBank` holding ``gpuN`` sources with
    ``temp_gpu_c`` and ``temp_slowdown_c`` (°C); ``margin_c``: °C below the slowdown
    temperature at which to stop. Cards without a reading or a threshold are skipped
    (NaN is "no reading")."""
    for src, name in bank.keys():
        if name != names.TEMP_GPU_C:
            continue
        cur, slow = bank.last(src, name), bank.last(src, names.TEMP_SLOWDOWN_C)
        if cur is None or slow is None or cur[1] != cur[1] or slow[1] != slow[1]:
            continue
        if cur[1] >= slow[1] - margin_c:
            return (f"safety stop: {src.replace('gpu', 'GPU ')} reached {cur[1]:.0f} °C, within "
                    f"{margin_c:g} °C of its slowdown temperature {slow[1]:.0f} °C")
    return None
