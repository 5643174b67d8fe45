"""What a profile may put into the server's environment, and which ``${VAR}`` it may expand.

Profiles are shared files, so their ``env:`` and their ``${VAR}`` references are
untrusted input (issue 15, items 1 and 2). This module is the one place that decides.

**Environment (``env:``).** A variable is *allowed* when its name is on the allowlist
(:data:`ALLOWED_PREFIXES`, :data:`ALLOWED_NAMES`: variables that configure vLLM, its
collective libraries, CUDA, the Hugging Face hub and the thread pools) and does not
look like one that loads code, redirects traffic or carries a secret
(:data:`_RISKY_NAME_RE`, :func:`app.config.is_secret_env_name`; e.g. ``NCCL_NET_PLUGIN`` loads a shared
library, ``CUDA_INJECTION64_PATH`` injects one into every CUDA process,
``VLLM_NCCL_SO_PATH`` picks the NCCL library, ``HF_ENDPOINT`` would send the user's
``HF_TOKEN`` to another host). Everything else — the dynamic loader's ``LD_*``,
macOS ``DYLD_*``, ``PYTHON*``, ``PATH``, ``PERL5LIB``, ``BASH_ENV``, ``ENV``, ``IFS``, and
any name not on the list — is *refused* unless the user confirms that exact value
(``--trust-env`` on the CLI, a dialog in the window): :func:`screen_env`.

The one exception: vLLM's CPU installation guide recommends ``LD_PRELOAD`` of tcmalloc
(and Intel OpenMP) for the CPU build. A *built-in* profile may carry ``LD_PRELOAD`` when
every entry is an existing allocator/OpenMP library (:func:`allocator_preload_problem`);
otherwise the key is dropped with a note.

The environment the user gives on the app's own command line (``--env``) or types in the
window's form is the user's own and is not screened.

**Variable expansion (``${NAME}``, ``${NAME:-default}`` in ``server:`` values).** Only the
project's own variables (``VLLM_DYNO_*``) and the path variables :data:`EXPANDABLE_NAMES`
are expanded; a name that looks like a secret (:func:`app.config.is_secret_env_name`) never is, even with
the project's prefix: :func:`expansion_problem`. So no secret can reach an argv, a model
hub request or the run store through a profile.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Mapping

from app.config import is_secret_env_name

#: name prefixes a profile may set: vLLM's own (vllm/envs.py), NCCL and Gloo (collective
#: communication), CUDA (device choice/order), Hugging Face hub and PyTorch settings
ALLOWED_PREFIXES = ("VLLM_", "NCCL_", "GLOO_", "CUDA_", "HF_", "TORCH_", "PYTORCH_CUDA_", "NVIDIA_TF32_")

#: exact names a profile may set: thread-pool sizes and tokenizer/transformers switches
ALLOWED_NAMES = frozenset({
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    "TRANSFORMERS_OFFLINE",
})

#: parts of an allowlisted name (split on ``_``) that make it name a file, a folder or a
#: settings source: what it points to is read, written or loaded by the server, so a
#: shared file may not choose it. E.g. ``VLLM_LOGGING_CONFIG_PATH`` (vLLM hands the file
#: to ``logging.config.dictConfig``, whose ``"()"`` key calls any Python function:
#: vllm/logger.py, _configure_vllm_root_logger), ``NCCL_DEBUG_FILE`` (a file NCCL
#: writes), ``VLLM_CONFIG_ROOT``, ``VLLM_RPC_BASE_PATH``, ``HF_HOME``/``HF_HUB_CACHE``
#: (where models are loaded from), ``CUDA_CACHE_PATH``, ``VLLM_TORCH_PROFILER_DIR``.
RISKY_NAME_PARTS = frozenset({
    "PATH", "PATHS", "FILE", "FILES", "DIR", "DIRS", "FOLDER", "ROOT", "HOME", "CACHE", "CONFIG", "LOCATION",
})

#: allowlisted prefixes that still load code, read a file of settings, redirect traffic or
#: point at a cache of compiled code: refused like an unlisted name
_RISKY_NAME_RE = re.compile(
    r"PLUGIN|INJECTION|PRELOAD|LIBRARY|_LIB(?:_|$)|_SO(?:_|$)|CONF_FILE|MODULES|EXTENSIONS|ENDPOINT|_URL$|_URI$"
    r"|PROXY|CACHE_ROOT|CACHE_DIR"
)

#: parts of a variable name that mark a secret (split on ``_``; a part ending in TOKEN,
#: KEY or SECRET, e.g. ``HF_TOKEN``, ``VLLM_API_KEY``, ``OPENAI_APIKEY``)
#: path variables a profile's ``${…}`` may use, besides ``VLLM_DYNO_*``
EXPANDABLE_NAMES = frozenset({
    "HOME", "TMPDIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "HF_HOME",
    "HF_HUB_CACHE",
})

#: libraries vLLM's CPU guide preloads (tcmalloc, Intel OpenMP) and common allocators
_ALLOCATOR_RE = re.compile(r"^lib(?:tcmalloc(?:_minimal)?|jemalloc|mimalloc|iomp5)\.so(?:\.\d+)*$")

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_problem(name: str) -> str | None:
    """Why a profile may not set ``name`` (None: it may). The reason names the kind."""
    up = name.upper()
    if is_secret_env_name(name):
        return "looks like a secret: set it in the environment you launch from, never in a shared file"
    if up.startswith(("LD_", "DYLD_")):
        return "a dynamic-loader variable: it loads code into the server"
    if up.startswith("PYTHON"):
        return "a Python interpreter variable: it loads or runs code in the server"
    if up in ("PATH", "PERL5LIB", "PERLLIB", "RUBYLIB", "NODE_OPTIONS", "BASH_ENV", "ENV", "IFS", "SHELLOPTS",
              "CDPATH", "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "MALLOC_CONF", "TMPDIR", "HOME"):
        return "chooses which programs, libraries or shell start-up files run"
    if up.startswith("VLLM_DYNO_"):
        return "vLLM Dyno's own variable (e.g. the cleanup owner marker): set by the app, never by a profile"
    allowed = up in ALLOWED_NAMES or up.startswith(ALLOWED_PREFIXES)
    if allowed and RISKY_NAME_PARTS & set(up.split("_")):
        return "names a file, a folder or a settings source that the server reads, writes or loads"
    if allowed and _RISKY_NAME_RE.search(up):
        return "loads code, reads a settings file, points at compiled code or sends traffic elsewhere"
    if not allowed:
        return "not a variable that configures vLLM (allowed: " + ", ".join(p + "*" for p in ALLOWED_PREFIXES) \
            + ", " + ", ".join(sorted(ALLOWED_NAMES)) + ")"
    return None


def allocator_preload_problem(value: str) -> str | None:
    """Why ``value`` is not a safe ``LD_PRELOAD`` of allocator libraries (None: it is).

    Every entry (``:`` or space separated) must be an absolute path to an existing
    regular file named like tcmalloc, jemalloc, mimalloc or Intel OpenMP (``libiomp5``),
    neither it nor its folder writable by other users."""
    entries = [e for e in re.split(r"[:\s]+", value.strip()) if e]
    if not entries:
        return "empty"
    for e in entries:
        if not os.path.isabs(e):
            return f"{e}: not an absolute path"
        if not _ALLOCATOR_RE.match(os.path.basename(e)):
            return f"{e}: not an allocator library (tcmalloc, jemalloc, mimalloc, libiomp5)"
        real = os.path.realpath(e)
        try:
            st, dst = os.stat(real), os.stat(os.path.dirname(real))
        except OSError:
            return f"{e}: no such file"
        if not stat.S_ISREG(st.st_mode):
            return f"{e}: not a file"
        if st.st_mode & stat.S_IWOTH:
            return f"{e}: writable by other users"
        if dst.st_mode & stat.S_IWOTH:
            return f"{e}: in a folder every user can write to"
    return None


class EnvRefused(ValueError):
    """A profile's ``env:`` holds variables the user has not confirmed. ``refused``:
    name → (value, reason). ``str()`` names each key, its value, why, and the fix."""

    def __init__(self, refused: Mapping[str, tuple[str, str]], fix: str, source: str = "the profile") -> None:
        self.refused = dict(refused)
        lines = [f"  {k}={v}  ({why})" for k, (v, why) in self.refused.items()]
        super().__init__(
            f"{source}: env: sets variables that a shared profile may set only with your confirmation "
            "(they can load code into the server or send data elsewhere):\n"
            + "\n".join(lines) + f"\n{fix}")


#: the CLI's fix (``vllm-dyno run``)
CLI_FIX = ("remove these keys from the profile's env:, or, if you trust these exact values, "
           "run again with --trust-env")


@dataclass
class EnvScreen:
    """The outcome of :func:`screen_env`: ``env`` (what the server may get),
    ``refused`` (name → (value, reason), not in ``env``) and ``notes`` (keys dropped
    from a built-in profile, with why)."""

    env: dict[str, str] = field(default_factory=dict)
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, fix: str = CLI_FIX, source: str = "the profile") -> dict[str, str]:
        """``env`` when nothing was refused; else raise :class:`EnvRefused`."""
        if self.refused:
            raise EnvRefused(self.refused, fix, source)
        return dict(self.env)


def value_problem(value: str) -> str | None:
    """Why a profile may not give an allowed variable this ``value`` (None: it may): a
    file path (``/…``, ``~…``, ``./…``) makes any variable choose what the server reads or
    loads, whatever its name says."""
    v = str(value).strip()
    if "/" in v or v.startswith("~"):
        return "its value is a file path: what it points to is read or loaded by the server"
    return None


def screen_env(env: Mapping[str, str], *, trusted: Mapping[str, str] | None = None,
               builtin: bool = False) -> EnvScreen:
    """Sort a profile's ``env`` into allowed, refused and (built-ins only) dropped keys.

    ``trusted``: pairs the user confirmed (``--trust-env``, the window's dialog, or their
    own ``--env``); a refused key is let through only when its value equals the
    confirmed one exactly. ``builtin``: the profile ships with vLLM Dyno — its
    ``LD_PRELOAD`` is kept when :func:`allocator_preload_problem` finds nothing, else
    dropped with a note."""
    trusted = trusted or {}
    out = EnvScreen()
    for k, v in env.items():
        why = env_problem(k) or value_problem(v)
        if why is None or (k in trusted and trusted[k] == v):
            out.env[k] = v
        elif builtin and k == "LD_PRELOAD":
            bad = allocator_preload_problem(v)
            if bad is None:
                out.env[k] = v
            else:
                out.notes.append(f"LD_PRELOAD={v} dropped: {bad} (vLLM's CPU guide recommends preloading "
                                 "tcmalloc; install it and point LD_PRELOAD at it)")
        else:
            out.refused[k] = (v, why)
    return out


def expansion_problem(name: str) -> str | None:
    """Why a profile's ``${name}`` is not expanded (None: it is). See the module docstring."""
    if is_secret_env_name(name):
        return (f"${{{name}}} looks like a secret: a profile never reads secrets from the environment "
                "(they would end up on the command line and in the run store); write the value itself "
                "or remove the reference")
    if name.startswith("VLLM_DYNO_") or name in EXPANDABLE_NAMES:
        return None
    return (f"${{{name}}} is not expanded in a profile: only VLLM_DYNO_* and " + ", ".join(sorted(EXPANDABLE_NAMES))
            + " are; write the value itself")


def valid_env_name(name: object) -> bool:
    """True for a POSIX environment variable name."""
    return isinstance(name, str) and bool(_NAME_RE.match(name))
