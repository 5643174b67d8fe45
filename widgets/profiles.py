"""Profiles as the GUI reads and writes them (YAML under the data dir's ``profiles/``).

Shape (shared/DESIGN.md, "Profile"): ``server:`` (the keys of a ``vllm serve --config``
file), ``env:``, ``gpus:``, ``engine:`` (vllm | sim | attach) with ``sim: {gpu, count}``
or ``attach: {url, model}``, and ``ramp:`` (RampSpec fields). The port is never stored.
Writes are atomic. The built-in demo profile (8× RTX 4090, simulated) needs no file.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from app.config import ServerConfig
from app.paths import profiles_dir

DEMO_NAME = "Demo: 8× RTX 4090 (simulated)"

DEMO: dict[str, Any] = {
    "schema_version": 1,
    "engine": "sim",
    "sim": {"gpu": "RTX 4090", "count": 8},
    "server": {"model": "meta-llama/Meta-Llama-3-70B-Instruct-AWQ", "tensor-parallel-size": 8,
               "max-model-len": 8192, "max-num-seqs": 64, "disable-custom-all-reduce": True},
    "env": {"NCCL_P2P_DISABLE": "1"},
    "ramp": {"levels": [1, 2, 4, 8, 16, 32, 64, 128], "step_seconds": 20, "warmup_seconds": 2,
             "prompt_tokens": 512, "output_tokens": 128, "slo": {}},
}


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
    if not s:
        raise ValueError(f"profile name {name!r}: use letters, digits, '.', '_' or '-'")
    return s


def list_profiles() -> list[str]:
    """The demo first, then saved profiles by name."""
    return [DEMO_NAME] + sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def load_profile(name: str) -> dict[str, Any]:
    """The profile mapping. Raises ValueError naming the file on a bad or missing file."""
    if name == DEMO_NAME:
        import copy

        return copy.deepcopy(DEMO)
    path = profiles_dir() / f"{_slug(name)}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"profile {path}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("server"), dict):
        raise ValueError(f"profile {path}: needs a 'server:' mapping with at least 'model:'")
    return data


def profile_config(data: dict[str, Any]) -> ServerConfig:
    """The ServerConfig of a profile (``server`` + ``env`` + ``gpus``)."""
    return ServerConfig.from_vllm_config(dict(data["server"]), env=dict(data.get("env") or {}),
                                         gpus=data.get("gpus"))


def save_profile(name: str, data: dict[str, Any]) -> Path:
    """Write atomically (temporary file + rename); returns the path."""
    path = profiles_dir() / f"{_slug(name)}.yaml"
    fd, tmp = tempfile.mkstemp(prefix=".profile-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(data, f, sort_keys=False, allow_unicode=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
