"""The thermal safety stop reads the live telemetry bank (real SeriesBank, samples as
the GPU sampler delivers them)."""
from __future__ import annotations

from app.safety import thermal_stop_reason
from app.telemetry.series import Sample, SeriesBank


def test_thermal_stop_within_margin_only():
    bank = SeriesBank()
    bank([Sample(1.0, "gpu0", "temp_gpu_c", 80.0), Sample(1.0, "gpu0", "temp_slowdown_c", 90.0),
          Sample(1.0, "gpu1", "temp_gpu_c", float("nan")), Sample(1.0, "gpu1", "temp_slowdown_c", 90.0)])
    assert thermal_stop_reason(bank, 3.0) is None
    bank([Sample(2.0, "gpu0", "temp_gpu_c", 87.0)])
    reason = thermal_stop_reason(bank, 3.0)
    assert reason == "safety stop: GPU 0 reached 87 °C, within 3 °C of its slowdown temperature 90 °C"
    assert thermal_stop_reason(SeriesBank(), 3.0) is None
