"""Import and export: a profile as a ``vllm serve`` command line or a vLLM ``--config``
YAML file, and back.

The ``server:`` block of a profile is a ``--config`` mapping already, so the YAML
export is that block (model path resolved); the environment and GPU choice, which a
``--config`` file cannot hold, are written as comments. The command line is
``ENV=V … CUDA_VISIBLE_DEVICES=… vllm serve MODEL --opt v …``, shell-quoted
(:func:`shlex.quote`); booleans follow vLLM's ``--flag`` / ``--no-flag`` convention
(docs/vllm-facts.md, "CLI options").

Secrets (issue 15, item 3): an imported command line or ``--config`` file that passes a
secret-carrying option (``--api-key``, ``--hf-token``, in every spelling vLLM accepts:
:func:`app.config.secret_option_of`) is refused with the fix; secret-named environment
assignments (:func:`app.config.is_secret_env_name`) are dropped with a warning, never
kept in the profile; exports write a secret-named variable as ``NAME="${NAME}"``.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from app.config import (ConfigError, ServerConfig, check_no_secret_options, dict_to_extra_args,
                        extra_args_to_dict, is_secret_env_name, option_name)
from app.planner.versions import serve_options, vllm_accepts
from app.profiles.io import ProfileError, profile_from_data, safe_yaml
from app.profiles.model import Profile

#: vLLM's short option spellings → long names
SHORT_OPTIONS = {"-tp": "tensor-parallel-size", "-pp": "pipeline-parallel-size", "-dp": "data-parallel-size",
                 "-q": "quantization"}

_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


# ---------------------------------------------------------------------- export
@dataclass(frozen=True)
class VllmExport:
    """What an export of a ``--config`` mapping keeps for vLLM (issue 37 item 6):
    ``options`` the mapping (in the given order, dashed long names), ``dropped`` one line
    per option left out and why (``--sim-perturb: not a `vllm serve` option …``)."""

    options: dict[str, Any]
    dropped: list[str]


def vllm_export(mapping: dict[str, Any], version: str | None = None) -> VllmExport:
    """The options of ``mapping`` (a ``--config`` mapping: :meth:`ServerConfig.to_vllm_config`
    or a profile's ``server:`` block, keys dashed or not) that ``vllm serve`` of
    ``version`` accepts (:func:`app.planner.versions.vllm_accepts`: vLLM's own parser,
    the release that first has an option, the releases that removed it; None: the
    parser's version). Left out: the sim's options and any other of Dyno's own that the
    form's extra options carried (``--sim-perturb``, ``--sim-truth``, ``--sim-seed`` …),
    options the version does not take, and ``host`` at Dyno's loopback default (vLLM's own
    default, every interface, applies where the command is run; a host the user set
    stays). ``model`` always stays."""
    loopback = ServerConfig.model_fields["host"].default
    keep: dict[str, Any] = {}
    dropped: list[str] = []
    ver = version or serve_options()[0]
    for k, v in mapping.items():
        key = option_name(str(k).lstrip("-"))
        if key == "model":
            keep[key] = v
        elif key == "host" and v == loopback:
            dropped.append(f"--host {v}: Dyno's local default, not the user's")
        elif not vllm_accepts(key, version):
            dropped.append(f"--{key}: not an option of `vllm serve` {ver}")
        else:
            keep[key] = v
    return VllmExport(keep, dropped)


def config_command(cfg: ServerConfig, version: str | None = None, program: str = "vllm serve") -> str:
    """``cfg`` as one copy-pasteable ``vllm serve`` line holding only what vLLM
    ``version`` accepts (:func:`vllm_export`), its environment (a secret as
    ``${NAME}``) and ``CUDA_VISIBLE_DEVICES`` first; no ``--port`` (the launch's own)."""
    opts = dict(vllm_export(cfg.to_vllm_config(), version).options)
    model = str(opts.pop("model"))
    head = shlex.split(program)
    argv = head + ([model] if head[-1:] == ["serve"] else ["--model", model]) + dict_to_extra_args(opts)
    pre = cfg.shell_env()
    return (pre + " " if pre else "") + shlex.join(argv)


def config_yaml(cfg: ServerConfig, version: str | None = None) -> str:
    """``cfg`` as vLLM's ``--config`` YAML holding only what vLLM ``version`` accepts
    (:func:`vllm_export`)."""
    return yaml.safe_dump(vllm_export(cfg.to_vllm_config(), version).options, sort_keys=False, allow_unicode=True)


def command_env(profile: Profile) -> dict[str, str]:
    """Environment assignments of the command line: ``env`` + ``CUDA_VISIBLE_DEVICES``
    (values as stored; :func:`_assignments` writes a secret as ``${NAME}``)."""
    env = dict(profile.env)
    idx = profile.gpu_indices()
    if idx is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, idx))
    return env


def to_command_line(profile: Profile, *, program: str = "vllm serve", resolve: bool = True) -> str:
    """The profile as one copy-pasteable shell line (``vllm serve MODEL …``).

    ``program``: what runs vLLM (``"vllm serve"``; or e.g. ``"python -m
    vllm.entrypoints.openai.api_server"``, then the model is passed as ``--model``).
    ``resolve``: expand the model path (see app.profiles.model.resolve_model_path).
    """
    cfg = dict(vllm_export(profile.vllm_config(resolve=resolve)).options)
    model = str(cfg.pop("model"))
    head = shlex.split(program)
    argv = head + ([model] if head[-1:] == ["serve"] else ["--model", model]) + dict_to_extra_args(cfg)
    pre = _assignments(command_env(profile))
    return (pre + " " if pre else "") + shlex.join(argv)


def _assignments(env: dict[str, str]) -> str:
    """``K=V …`` shell-quoted; a secret-named variable as ``K="${K}"`` (its value is never exported)."""
    return " ".join(f'{k}="${{{k}}}"' if is_secret_env_name(k) else f"{k}={shlex.quote(v)}" for k, v in env.items())


def to_vllm_config_yaml(profile: Profile, *, resolve: bool = True, comments: bool = True) -> str:
    """The ``server:`` block as a ``vllm serve --config FILE`` YAML text; environment
    and GPUs (which such a file cannot hold) as leading comments when ``comments``."""
    body = yaml.safe_dump(vllm_export(profile.vllm_config(resolve=resolve)).options, sort_keys=False,
                          allow_unicode=True)
    if not comments:
        return body
    head = [f"# vLLM --config file exported by vLLM Dyno from profile {profile.name!r}",
            "# run: vllm serve --config THIS_FILE"]
    env = command_env(profile)
    if env:
        head.append("# environment: " + _assignments(env))
    return "\n".join(head) + "\n" + body


# ---------------------------------------------------------------------- import
def parse_command_line(line: str | list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``[ENV=V …] vllm serve MODEL --opt v …`` (also ``python -m
    vllm.entrypoints.cli.main serve …`` and ``python -m vllm.entrypoints.openai.api_server
    --model M …``) → (``--config`` mapping, environment). Line continuations
    (backslash-newline) are accepted. Raises ConfigError naming the token that is wrong.
    """
    if isinstance(line, str):
        try:
            toks = shlex.split(line.replace("\\\n", " "))
        except ValueError as e:
            raise ConfigError(f"cannot split the command line: {e} (check the quotes)") from None
    else:
        toks = list(line)
    env: dict[str, str] = {}
    while toks and (_ENV_RE.match(toks[0]) or toks[0] in ("env", "export")):
        t = toks.pop(0)
        if "=" in t:
            k, v = t.split("=", 1)
            env[k] = v
    # skip the program: everything up to "serve" (+ its positional model) or the first option
    model = None
    if "serve" in toks:
        i = toks.index("serve") + 1
        if i < len(toks) and not toks[i].startswith("-"):
            model = toks[i]
            i += 1
    else:
        i = 0
        while i < len(toks) and not toks[i].startswith("-"):
            i += 1
        if i < len(toks) and toks[i] == "-m":  # python -m module
            i += 2
            while i < len(toks) and not toks[i].startswith("-"):
                i += 1
    rest = ["--" + SHORT_OPTIONS[t] if t in SHORT_OPTIONS else t for t in toks[i:]]
    check_no_secret_options(rest, "the command line")
    if not rest and model is None:
        raise ConfigError("no vLLM options found: paste a line such as `vllm serve MODEL --max-num-seqs 64`")
    d = extra_args_to_dict(rest)
    cfg: dict[str, Any] = {}
    if model is not None:
        cfg["model"] = model
    for k, v in d.items():
        cfg[option_name(k)] = v
    if "config" in cfg:
        raise ConfigError("the command uses --config FILE: import that YAML file instead "
                          "(vllm-dyno profiles import FILE)")
    return cfg, env


def profile_from_vllm_config(cfg: dict[str, Any], name: str, *, env: dict[str, str] | None = None,
                             label: str = "<import>", base: Profile | None = None,
                             warnings: list[str] | None = None) -> Profile:
    """A profile around a ``--config`` mapping. ``CUDA_VISIBLE_DEVICES`` in ``env``
    becomes ``gpus``. ``base``: a profile whose other blocks (ramp, engine, notes …) the
    new one keeps. A secret-carrying option in ``cfg`` is refused; secret-named ``env``
    keys are dropped with a warning (both: issue 15, item 3). Raises :class:`ProfileError`."""
    try:
        check_no_secret_options(["--" + str(k).lstrip("-") for k in cfg], "the vLLM options")
    except ConfigError as e:
        raise ProfileError(label, None, str(e)) from None
    env = dict(env or {})
    for k in [k for k in env if is_secret_env_name(k)]:
        if not env.pop(k).startswith("${") and warnings is not None:
            warnings.append(f"{k} dropped: a secret is never stored in a profile; set it in the environment "
                            "you launch from" + (" (or use --api-key-file)" if k == "VLLM_API_KEY" else ""))
    gpus = None
    cvd = env.pop("CUDA_VISIBLE_DEVICES", None)
    if cvd is not None:
        try:
            gpus = [int(x) for x in cvd.split(",") if x.strip()]
        except ValueError:
            raise ProfileError(label, "CUDA_VISIBLE_DEVICES", f"{cvd!r} is not a list of GPU indices "
                                                              "(UUIDs are not kept in profiles)") from None
    data: dict[str, Any] = base.to_data() if base is not None else {"schema_version": 1}
    data.update(name=name, server=cfg)
    data["env"] = {**(data.get("env") or {}), **env} if base is not None else env
    if gpus is not None:
        data["gpus"] = gpus
    return profile_from_data(data, label, warnings)


def import_command_line(line: str, name: str, **kw: Any) -> Profile:
    """A profile from a pasted ``vllm serve`` command line. Raises ProfileError."""
    try:
        cfg, env = parse_command_line(line)
    except ConfigError as e:
        raise ProfileError("<command line>", None, str(e)) from None
    return profile_from_vllm_config(cfg, name, env=env, label="<command line>", **kw)


def import_vllm_config_yaml(text: str, name: str, label: str = "<config>", **kw: Any) -> Profile:
    """A profile from a vLLM ``--config`` YAML text. Raises ProfileError naming ``label``."""
    data = safe_yaml(text, label)
    if not isinstance(data, dict):
        raise ProfileError(label, None, "a vLLM --config file is a mapping of option: value")
    env = {**comment_env(text), **(kw.pop("env", None) or {})}
    return profile_from_vllm_config(data, name, label=label, env=env, **kw)


def comment_env(text: str) -> dict[str, str]:
    """The ``# environment: A=1 B=2`` comment :func:`to_vllm_config_yaml` writes, read
    back (so export → import keeps the environment and GPU choice); {} when absent."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# environment: "):
            try:
                toks = shlex.split(line[len("# environment: "):])
            except ValueError:
                return {}
            return dict(t.split("=", 1) for t in toks if _ENV_RE.match(t))
    return {}


def import_text(text: str, name: str | None = None, label: str = "<import>",
                warnings: list[str] | None = None) -> Profile:
    """Import whatever was given: a vLLM Dyno profile (has ``server:``), a vLLM
    ``--config`` YAML (has ``model:``) or a ``vllm serve`` command line. ``name``
    overrides (or, for the vLLM forms, provides; default from the model) the name.
    Raises :class:`ProfileError`."""
    stripped = text.lstrip()
    looks_cmd = bool(re.match(r"^([A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(\S*/)?(vllm|python\S*)\s", stripped))
    if not looks_cmd:
        data = safe_yaml(text, label)
        if isinstance(data, dict) and ("server" in data or "config" in data):
            if name:
                data = {**data, "name": name}
            return profile_from_data(data, label, warnings)
        if isinstance(data, dict):
            nm = name or _name_from_model(data.get("model"))
            return profile_from_vllm_config(data, nm, env=comment_env(text), label=label, warnings=warnings)
        if not isinstance(data, str):
            raise ProfileError(label, None, "neither a profile, a vLLM --config mapping nor a vllm serve command")
    try:
        cfg, env = parse_command_line(text)
    except ConfigError as e:
        raise ProfileError(label, None, str(e)) from None
    return profile_from_vllm_config(cfg, name or _name_from_model(cfg.get("model")), env=env, label=label,
                                    warnings=warnings)


def _name_from_model(model: Any) -> str:
    if not isinstance(model, str) or not model.strip():
        return "imported"
    return model.rstrip("/").split("/")[-1] or "imported"
