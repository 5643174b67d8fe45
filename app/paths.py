"""Where vLLM Dyno keeps its state: one data directory.

``VLLM_DYNO_HOME`` overrides the whole directory (every test sets it); otherwise
platformdirs' per-user data dir for ``vllm-dyno``. Layout: ``settings.yaml``,
``profiles/``, ``runs.sqlite``, ``calibration/``.

Nothing here creates a folder unless asked (``data_dir(create=True)``): the writers make
the folders they write into (:func:`app.fileio.write_atomic`, :class:`app.store.RunStore`),
so a read-only home can still be read (issue 15 item 10).
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "vllm-dyno"


def data_dir(create: bool = False) -> Path:
    """Return the data directory (``VLLM_DYNO_HOME`` or the platform default); with
    ``create`` make it (raises OSError when it cannot be made)."""
    env = os.environ.get("VLLM_DYNO_HOME")
    p = Path(env).expanduser() if env else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


def settings_path() -> Path:
    return data_dir() / "settings.yaml"


def profiles_dir() -> Path:
    return data_dir() / "profiles"


def runs_db_path() -> Path:
    return data_dir() / "runs.sqlite"


def calibration_dir() -> Path:
    return data_dir() / "calibration"


def repo_root() -> Path:
    """The checkout root (used only for dev conveniences such as `.venv-vllm`)."""
    return Path(__file__).resolve().parent.parent


def hf_cache_dirs() -> list[Path]:
    """Where the Hugging Face hub cache may be (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        out.append(Path(os.environ["HF_HOME"]) / "hub")
    out.append(Path.home() / ".cache" / "huggingface" / "hub")
    return out
