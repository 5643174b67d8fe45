"""Reading and writing profile files: safe YAML, migration, unknown keys, atomic writes.

Reading never executes anything and never blocks on a bad file:

- YAML is parsed by the project's one loader, :func:`app.fileio.load_yaml` (a
  ``yaml.SafeLoader``: tags such as ``!!python/object`` are refused), with
  :data:`PROFILE_YAML_LIMITS`: at most :data:`MAX_PROFILE_BYTES` (a larger file is
  refused unread), 64 levels of nesting, integers of at most 40 characters, no duplicate
  key, and no anchors or aliases at all (a profile never needs them, so a "billion
  laughs" file is refused at its first ``&``);
- older ``schema_version`` files are migrated (:func:`migrate`);
- unknown keys are dropped with a warning (returned, and logged);
- a bad value raises :class:`ProfileError` naming the file, the key and the reason.

Writing (:func:`write_atomic`) goes to a temporary file in the same directory,
``fsync``, then ``os.replace`` — a crash mid-save leaves the old file intact.
"""
from __future__ import annotations

import logging
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from app.config import ServerConfig
from app.fileio import YamlError, YamlLimits, load_yaml
from app.fileio import read_text_limited as read_text_bounded
from app.fileio import write_atomic  # noqa: F401  (re-exported: profiles are written with it)
from app.hosts.spec import hosts_secret_problem
from app.profiles.model import SCHEMA_VERSION, Profile

log = logging.getLogger(__name__)

#: profiles are small (a few KiB); anything above this is not a profile
MAX_PROFILE_BYTES = 1 << 20
#: what a profile file may be (app.fileio.YamlLimits); no anchors or aliases
PROFILE_YAML_LIMITS = YamlLimits(max_bytes=MAX_PROFILE_BYTES, max_aliases=0)


class ProfileError(ValueError):
    """A profile that cannot be read: ``file`` (path or label), ``key`` (dotted path,
    None for the whole file) and ``reason``; ``str()`` says all three and the fix."""

    def __init__(self, file: str, key: str | None, reason: str) -> None:
        self.file, self.key, self.reason = str(file), key, reason
        super().__init__(f"{self.file}: " + (f"{key}: " if key else "") + reason)


def safe_yaml(text: str, label: str) -> Any:
    """Parse profile YAML text within :data:`PROFILE_YAML_LIMITS` (see the module
    docstring). Raises :class:`ProfileError` naming ``label``, the key and the reason."""
    try:
        return load_yaml(text, PROFILE_YAML_LIMITS)
    except YamlError as e:
        raise ProfileError(label, e.key, e.located) from None


def read_text_limited(path: Path) -> str:
    """Read a UTF-8 file of at most :data:`MAX_PROFILE_BYTES` (a larger one unread).
    Raises :class:`ProfileError` naming the file."""
    try:
        return read_text_bounded(path, MAX_PROFILE_BYTES)
    except YamlError as e:
        raise ProfileError(str(path), None, e.located) from None
    except OSError as e:
        raise ProfileError(str(path), None, f"cannot read: {e.strerror or e}") from None


# ---------------------------------------------------------------------- migration
def migrate(data: dict[str, Any], warnings: list[str] | None = None) -> dict[str, Any]:
    """Bring a profile mapping to :data:`SCHEMA_VERSION`.

    v0 (files written before ``schema_version`` existed; no such key): the server
    settings were a ServerConfig dump under ``config:`` (underscore names, with
    ``gpus``, ``env``, ``extra_args`` and ``port`` inside), the SLO was top-level
    ``slo:``, the hardware a string ``"8x RTX 4090"``. v1 moves them to ``server:``
    (vLLM option names), top-level ``env``/``gpus``, ``ramp.slo`` and a
    ``hardware`` mapping. Raises ValueError for a version newer than this app's.
    """
    warnings = warnings if warnings is not None else []
    v = data.get("schema_version", 0)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"schema_version {v!r} is not a whole number")
    if v > SCHEMA_VERSION:
        raise ValueError(f"schema_version {v} is newer than this vLLM Dyno understands ({SCHEMA_VERSION}); "
                         "update vLLM Dyno")
    d = dict(data)
    if v == 0:
        cfg = d.pop("config", None)
        if isinstance(cfg, dict) and "server" not in d:
            cfg = dict(cfg)
            if cfg.pop("port", None) is not None:
                warnings.append("config.port dropped: the port is chosen at launch")
            d.setdefault("env", cfg.pop("env", None) or {})
            gpus = cfg.pop("gpus", None)
            if gpus is not None:
                d.setdefault("gpus", gpus)
            cfg.pop("host", None)
            sc = ServerConfig(**cfg)  # raises ValidationError → reported by the caller
            server = sc.to_vllm_config()
            if "host" in server and server["host"] == "127.0.0.1":
                server.pop("host")
            d["server"] = server
        slo = d.pop("slo", None)
        if slo is not None:
            ramp = dict(d.get("ramp") or {})
            ramp.setdefault("slo", slo)
            d["ramp"] = ramp
        hw = d.get("hardware")
        if isinstance(hw, str):
            m = re.match(r"^\s*(\d+)\s*[x×]\s*(.+?)\s*$", hw)
            d["hardware"] = {"gpu": m.group(2), "count": int(m.group(1))} if m else {"gpu": hw.strip(), "count": 1}
        d["schema_version"] = 1
        warnings.append("migrated from schema_version 0 to 1")
    return d


# ---------------------------------------------------------------------- unknown keys
def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in typing.get_args(annotation):
        m = _model_of(a)
        if m is not None:
            return m
    return None


def drop_unknown(data: dict[str, Any], model: type[BaseModel], prefix: str, warnings: list[str]) -> dict[str, Any]:
    """``data`` without the keys ``model`` (and its nested models) does not know; one
    warning per dropped key, named by its dotted path."""
    out = {}
    fields = model.model_fields
    for k, v in data.items():
        if k not in fields:
            warnings.append(f"unknown key {prefix}{k} dropped")
            continue
        sub = _model_of(fields[k].annotation)
        if sub is not None and isinstance(v, dict):
            v = drop_unknown(v, sub, f"{prefix}{k}.", warnings)
        elif sub is not None and isinstance(v, list) and typing.get_origin(fields[k].annotation) is list:
            v = [drop_unknown(x, sub, f"{prefix}{k}[{i}].", warnings) if isinstance(x, dict) else x
                 for i, x in enumerate(v)]
        out[k] = v
    return out


# ---------------------------------------------------------------------- parse
def _error_key(err: dict[str, Any]) -> str | None:
    loc = [str(x) for x in err.get("loc", ()) if not str(x).startswith("function-")]
    return ".".join(loc) or None


def profile_from_data(data: Any, label: str, warnings: list[str] | None = None) -> Profile:
    """Validate a parsed mapping into a Profile (migrating, dropping unknown keys).

    ``label`` names the source in errors. Raises :class:`ProfileError`.
    """
    warnings = warnings if warnings is not None else []
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ProfileError(label, None, f"the file is {kind}, not a mapping of profile keys "
                                        "(name:, server:, …)")
    try:
        data = migrate(data, warnings)
    except ValidationError as e:
        err = e.errors()[0]
        raise ProfileError(label, f"config.{_error_key(err)}", err["msg"]) from None
    except ValueError as e:
        raise ProfileError(label, "schema_version", str(e)) from None
    secret = hosts_secret_problem(data.get("hosts"))  # refused, not dropped as unknown (issue 21)
    if secret:
        raise ProfileError(label, *secret)
    data = drop_unknown(data, Profile, "", warnings)
    srv = data.get("server")
    if isinstance(srv, dict) and any(str(k).lstrip("-").replace("_", "-") == "port" for k in srv):
        warnings.append("server.port dropped: the port is chosen at launch")
    try:
        prof = Profile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = _error_key(err)
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        # model-level errors carry their key in the message ("server.x: …")
        if (key is None or msg.startswith(f"{key}.")) and ": " in msg \
                and msg.split(": ", 1)[0].replace(".", "").replace("-", "").isidentifier():
            key, msg = msg.split(": ", 1)
        if err.get("input") is not None and err["type"] not in ("value_error", "missing") and key:
            msg += f" (got {err['input']!r:.60})"
        raise ProfileError(label, key, msg) from None
    for w in warnings:
        log.warning("%s: %s", label, w)
    return prof


def parse_profile(text: str, label: str = "<profile>", warnings: list[str] | None = None) -> Profile:
    """Parse profile YAML text. Raises :class:`ProfileError` naming ``label``."""
    return profile_from_data(safe_yaml(text, label), label, warnings)


def read_profile(path: str | Path, warnings: list[str] | None = None) -> Profile:
    """Read a profile file. Raises :class:`ProfileError` naming the file."""
    p = Path(path)
    return parse_profile(read_text_limited(p), str(p), warnings)


def dump_profile(profile: Profile) -> str:
    """The profile as YAML text (``yaml.safe_dump``, keys in schema order)."""
    return yaml.safe_dump(profile.to_data(), sort_keys=False, allow_unicode=True, width=100)


# ---------------------------------------------------------------------- write
def write_profile(path: str | Path, profile: Profile) -> None:
    """Write ``profile`` to ``path`` atomically (see :func:`write_atomic`)."""
    write_atomic(path, dump_profile(profile))
