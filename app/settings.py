"""User settings (``settings.yaml`` in the data directory), validated by pydantic.

This file is the one settings store. The GUI also keeps ``gui.ini`` (Qt QSettings, in
the same directory), but only for window geometry/state, which is purely presentation;
every real setting, including the last profile opened, lives here.

File format: a YAML mapping with ``schema_version`` (:data:`SCHEMA_VERSION`) and the
fields of :class:`Settings`.

- v0: files written before ``schema_version`` existed (no such key). Same fields; the
  last profile lived in ``gui.ini``. Loading upgrades them: ``last_profile`` is taken
  from ``gui.ini`` beside the file when the file has none, and the file is rewritten
  with ``schema_version: 1`` (only when every key was valid, so nothing is lost).
- v1: current.

Loading never raises for a broken file. The file is read by the project's one YAML
loader (:func:`app.fileio.read_yaml`: size, nesting, alias-expansion and integer limits,
duplicate keys refused); a file it refuses gives the defaults with a warning naming the
file, the key and the reason. One bad key (wrong type, out of range,
unknown) is dropped and its default used; every valid key is kept. Each drop is
logged as a warning and listed in :attr:`SettingsLoad.dropped` (key, bad value, why,
fix). A file that cannot be read at all gives defaults. A file from a newer vLLM Dyno
(``schema_version`` above ours) loads the keys this version knows and says so; saving
over it keeps the keys this version does not know and its version number.
:func:`load_settings` returns just the :class:`Settings` (problems in
``Settings.load_error``, one per line); :func:`load_settings_report` returns the full report.

Writes are atomic (:func:`app.fileio.write_atomic`: temporary file + ``os.replace``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.fileio import read_yaml, write_atomic
from app.paths import settings_path

log = logging.getLogger(__name__)

#: the ``schema_version`` this app writes; :data:`_UPGRADES` ``[v]`` brings a mapping from v to v+1
SCHEMA_VERSION = 1
#: the GUI's presentation-only QSettings file (window geometry/state), beside ``settings.yaml``
GUI_INI = "gui.ini"


#: the failure-rate limit of a ramp (a fraction of a level's finished requests, 0–1): the
#: Settings' default and every ramp's that does not set its own (RampSpec, ``ramp``) — one value
DEFAULT_MAX_FAILURE_RATE = 0.2


class SafetyLimits(BaseModel):
    """Ramp safety stops (on by default), applied by the run controller to every ramp
    (app.run.safety): ``thermal_margin_c`` °C below a card's slowdown temperature stops
    the ramp; ``max_failure_rate`` (a fraction 0–1 of a level's finished requests) stops
    the level and the ramp; ``enabled`` False: neither."""

    enabled: bool = True
    thermal_margin_c: float = Field(3.0, ge=0)
    max_failure_rate: float = Field(DEFAULT_MAX_FAILURE_RATE, gt=0, le=1)


class Pricing(BaseModel):
    """What the user pays, for $ per million output tokens (the verdict, Compare):
    ``gpu_hour`` per GPU-hour (rented cards, or the cards' amortisation) and/or ``kwh``
    per kWh of electricity (owned cards; applied to the measured GPU energy);
    ``currency`` only labels the figures. Unset parts are left out; none set → no cost."""

    model_config = ConfigDict(frozen=True)
    gpu_hour: float | None = Field(None, description="price per GPU-hour")
    kwh: float | None = Field(None, description="electricity price per kWh")
    currency: str = "$"

    @field_validator("gpu_hour", "kwh")
    @classmethod
    def _price(cls, v: float | None, info) -> float | None:
        if v is not None and not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"price {info.field_name}={v}: give a price ≥ 0 (or leave it unset)")
        return v


class Settings(BaseModel):
    """vLLM interpreter (None → auto), telemetry rates (Hz), safety limits, prices (the
    verdict's $ per M tokens), the last profile opened in the GUI (a profile name; None
    → the demo profile)."""

    model_config = ConfigDict(extra="ignore")

    vllm_python: str | None = None
    gpu_sample_hz: float = Field(4.0, gt=0, le=50)
    metrics_scrape_hz: float = Field(2.0, gt=0, le=20)
    safety: SafetyLimits = Field(default_factory=SafetyLimits)
    pricing: Pricing = Field(default_factory=Pricing)
    last_profile: str | None = None
    load_error: str | None = Field(None, exclude=True)


@dataclass
class SettingsLoad:
    """What :func:`load_settings_report` read.

    ``settings``: the result (valid keys kept, the rest defaults). ``dropped``: one
    message per dropped key (its dotted name, the bad value, why, the fix). ``notes``:
    file-level problems (unreadable file, newer schema). ``file_version``: the file's
    ``schema_version`` (0 for a file without one; None when there was no file).
    ``upgraded``: the file was brought from an older version (in memory; on disk too
    when ``rewritten``).
    """

    settings: Settings
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    file_version: int | None = None
    upgraded: bool = False
    rewritten: bool = False

    @property
    def messages(self) -> list[str]:
        """Everything worth showing the user: the dropped keys, then the file notes."""
        return [*self.dropped, *self.notes]


# ---------------------------------------------------------------------- upgrades
def _gui_ini_last_profile(ini: Path) -> str | None:
    """``last_profile`` from a QSettings INI file ([General] section), or None.

    Best effort: only a plain value (no Qt escapes or ``@Type(...)`` encodings)."""
    try:
        lines = ini.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    section = "General"
    for raw in lines:
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "General" and line.startswith("last_profile="):
            v = line.split("=", 1)[1].strip()
            if len(v) >= 2 and v[0] == v[-1] == '"':
                v = v[1:-1]
            if v and "\\" not in v and not v.startswith("@"):
                return v
    return None


def _upgrade_0_to_1(data: dict[str, Any], path: Path) -> None:
    """v0 → v1: the last profile moves from ``gui.ini`` into the settings file."""
    if not data.get("last_profile"):
        last = _gui_ini_last_profile(path.parent / GUI_INI)
        if last:
            data["last_profile"] = last


_UPGRADES: list[Callable[[dict[str, Any], Path], None]] = [_upgrade_0_to_1]
assert len(_UPGRADES) == SCHEMA_VERSION


# ---------------------------------------------------------------------- validation
def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _unknown_keys(model: type[BaseModel], data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of keys in ``data`` that ``model`` (and its nested models) lacks."""
    out = []
    for k, v in data.items():
        f = model.model_fields.get(k) if isinstance(k, str) else None
        if f is None or k == "load_error":
            out.append(f"{prefix}{k}")
            continue
        sub = f.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(v, dict):
            out.extend(_unknown_keys(sub, v, f"{prefix}{k}."))
    return out


def _pop_path(data: dict[str, Any], loc: tuple) -> tuple[bool, Any]:
    """Remove ``data[loc[0]][loc[1]]…``; returns (removed, value)."""
    d: Any = data
    for k in loc[:-1]:
        if not isinstance(d, dict) or k not in d:
            return False, None
        d = d[k]
    if not isinstance(d, dict) or not loc or loc[-1] not in d:
        return False, None
    return True, d.pop(loc[-1])


def _default_of(loc: tuple) -> Any:
    model: Any = Settings
    default: Any = None
    for k in loc:
        f = model.model_fields.get(k) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if f is None:
            return None
        model = f.annotation
        default = f.get_default(call_default_factory=True)
    return default.model_dump() if isinstance(default, BaseModel) else default


def _validate(data: dict[str, Any], name: str, newer: bool) -> tuple[Settings, list[str], list[str]]:
    """Build Settings from ``data``, dropping bad keys one by one.

    Returns (settings, dropped messages, unknown keys ignored because the file is newer)."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    dropped: list[str] = []
    ignored: list[str] = []
    for key in _unknown_keys(Settings, data):
        loc = tuple(key.split("."))
        _, value = _pop_path(data, loc)
        if newer:
            ignored.append(key)
        else:
            dropped.append(f"{name}: unknown key {key!r} (value {_short(value)}) dropped; remove it or check "
                           "its spelling")
    for _ in range(64):  # one pass per bad key at most
        try:
            return Settings.model_validate(data), dropped, ignored
        except ValidationError as e:
            removed_any = False
            for err in e.errors():
                # the longest prefix of the error's location that is a key in the file
                # (a union member's tag can follow the key itself)
                loc, ok, value = tuple(err["loc"]), False, None
                for n in range(len(loc), 0, -1):
                    ok, value = _pop_path(data, loc[:n])
                    if ok:
                        loc = loc[:n]
                        break
                if not ok:
                    continue
                removed_any = True
                key = ".".join(str(p) for p in loc)
                dropped.append(f"{name}: {key} = {_short(value)} dropped ({err['msg']}); using the default "
                               f"{_short(_default_of(loc))}. Fix: set a valid value (Settings dialog, or "
                               f"edit {name}) or delete the line")
            if not removed_any:
                break
    dropped.append(f"{name}: the settings could not be validated; using defaults (fix or delete the file)")
    return Settings(), dropped, ignored


# ---------------------------------------------------------------------- load / save
def _read_mapping(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; raises OSError or ValueError (YamlError: the loader's limits)."""
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError("the file is not a mapping of setting: value")
    return data


def load_settings_report(path: Path | None = None, *, upgrade_file: bool = True) -> SettingsLoad:
    """Read settings and say what was dropped, upgraded or ignored (never raises).

    A missing file gives defaults (the ``last_profile`` of a v0 ``gui.ini`` beside it
    is still taken). ``upgrade_file``: rewrite an older file in the current format when
    every key in it was valid (atomic; a failed write is only logged).
    """
    path = Path(path or settings_path())
    name = path.name
    report = SettingsLoad(Settings())
    exists = path.exists()
    try:
        data = _read_mapping(path) if exists else {}
    except (ValueError, OSError) as e:  # YamlError names the key, the line and the reason
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        msg = f"{path}: {why}; using the default settings (fix or delete the file)"
        log.warning("settings: %s", msg)
        report.notes.append(msg)
        report.settings = Settings(load_error=msg)
        return report

    version: Any = data.pop("schema_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        report.dropped.append(f"{name}: schema_version = {_short(version)} dropped (not a whole number ≥ 0); "
                              f"read as version {SCHEMA_VERSION}. Fix: set schema_version: {SCHEMA_VERSION}")
        version = SCHEMA_VERSION
    report.file_version = version if exists else None
    newer = version > SCHEMA_VERSION
    if version < SCHEMA_VERSION:
        for step in _UPGRADES[version:]:
            step(data, path)
        report.upgraded = exists

    settings, dropped, ignored = _validate(data, name, newer)
    report.dropped.extend(dropped)
    if newer:
        extra = f"; ignored the keys it does not know: {', '.join(ignored)}" if ignored else ""
        report.notes.append(f"{path} was written by a newer vLLM Dyno (settings schema {version}; this version "
                            f"knows {SCHEMA_VERSION}): loaded the settings it knows{extra}. Upgrade vLLM Dyno "
                            "to use the others; saving keeps them")
    for m in report.messages:
        log.warning("settings: %s", m)
    if report.messages:
        settings.load_error = "\n".join(report.messages)
    report.settings = settings

    if report.upgraded and upgrade_file and not report.dropped:
        try:
            save_settings(settings, path)
            report.rewritten = True
            log.info("settings: upgraded %s from schema %d to %d", path, version, SCHEMA_VERSION)
        except OSError as e:
            log.warning("settings: could not rewrite %s in the current format: %s", path, e)
    return report


def load_settings(path: Path | None = None) -> Settings:
    """Read settings (see :func:`load_settings_report`); problems in ``load_error``."""
    return load_settings_report(path).settings


def save_settings(s: Settings, path: Path | None = None) -> None:
    """Write atomically: a crash mid-save leaves the previous file intact.

    Over a file from a newer vLLM Dyno, its unknown keys and version are kept."""
    path = Path(path or settings_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, **s.model_dump(exclude={"load_error"})}
    try:
        old = _read_mapping(path) if path.exists() else {}
    except (ValueError, OSError):
        old = {}
    v = old.get("schema_version")
    if isinstance(v, int) and not isinstance(v, bool) and v > SCHEMA_VERSION:
        out["schema_version"] = v
        for k, val in old.items():
            if k not in out:
                out[k] = val
            elif isinstance(val, dict) and isinstance(out[k], dict):
                out[k] = {**{kk: vv for kk, vv in val.items() if kk not in out[k]}, **out[k]}
    write_atomic(path, yaml.safe_dump(out, sort_keys=False))
