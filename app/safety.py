"""Ramp safety stops that watch live telemetry (the failure-rate stop is the load
generator's own ``max_failure_rate``).

:func:`thermal_stop_reason` is checked periodically while a ramp runs (the GUI's
session controller every 0.5 s): a GPU within ``margin_c`` °C of its slowdown
temperature (NVML ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``, sampled as
``temp_slowdown_c``) stops the ramp, saying why (issue 7, "Safety limits").
"""
from __future__ import annotations


def thermal_stop_reason(bank, margin_c: float) -> str | None:
    """The sentence to stop the ramp with, or None while every GPU is cool enough.

    ``bank``: a :class:`app.telemetry.series.SeriesBank` holding ``gpuN`` sources with
    ``temp_gpu_c`` and ``temp_slowdown_c`` (°C); ``margin_c``: °C below the slowdown
    temperature at which to stop. Cards without a reading or a threshold are skipped
    (NaN is "no reading")."""
    for src, name in bank.keys():
        if name != "temp_gpu_c":
            continue
        cur, slow = bank.last(src, name), bank.last(src, "temp_slowdown_c")
        if cur is None or slow is None or cur[1] != cur[1] or slow[1] != slow[1]:
            continue
        if cur[1] >= slow[1] - margin_c:
            return (f"safety stop: {src.replace('gpu', 'GPU ')} reached {cur[1]:.0f} °C, within "
                    f"{margin_c:g} °C of its slowdown temperature {slow[1]:.0f} °C")
    return None
