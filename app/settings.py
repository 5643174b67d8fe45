"""User settings (``settings.yaml`` in the data directory), validated by pydantic.

Loading never raises for a broken file: :func:`load_settings` falls back to defaults
and records the problem in ``Settings.load_error`` so the GUI/CLI can show it.
Writes are atomic (temporary file + ``os.replace``).
"""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.fileio import write_atomic
from app.paths import settings_path


class SafetyLimits(BaseModel):
    """Ramp safety stops (on by default): °C below the slowdown threshold, failure rate 0..1."""

    enabled: bool = True
    thermal_margin_c: float = Field(3.0, ge=0)
    max_failure_rate: float = Field(0.2, gt=0, le=1)


class Settings(BaseModel):
    """vLLM interpreter (None → auto), telemetry rates (Hz), safety limits."""

    model_config = ConfigDict(extra="ignore")

    vllm_python: str | None = None
    gpu_sample_hz: float = Field(4.0, gt=0, le=50)
    metrics_scrape_hz: float = Field(2.0, gt=0, le=20)
    safety: SafetyLimits = Field(default_factory=SafetyLimits)
    last_profile: str | None = None
    load_error: str | None = Field(None, exclude=True)


def load_settings(path: Path | None = None) -> Settings:
    """Read settings; a missing file gives defaults, a broken one defaults + ``load_error``."""
    path = path or settings_path()
    if not path.exists():
        return Settings()
    try:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError("the file is not a mapping of setting: value")
        return Settings(**data)
    except (yaml.YAMLError, ValueError, ValidationError, OSError) as e:
        return Settings(load_error=f"{path}: {e}; using defaults (fix or delete the file)")


def save_settings(s: Settings, path: Path | None = None) -> None:
    """Write atomically: a crash mid-save leaves the previous file intact."""
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(s.model_dump(exclude={"load_error"}), sort_keys=False)
    write_atomic(path, text)
