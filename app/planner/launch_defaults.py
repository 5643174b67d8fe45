"""Working defaults for the CPU build of vLLM: the one function every launch goes through
(:meth:`app.run.controller.RunController.launch_defaults` calls it for ``serve``, ``run``
and the window on this machine; each host's agent of a rig calls it for its own part,
its own interpreter and cores, :meth:`app.hosts.agent.Agent.launch`).

vLLM's own defaults do not work well on a machine without a GPU:

- From 0.32 the CPU build takes ``gpu_memory_utilization`` (default 0.92) as a fraction
  of the NUMA node's memory and stops when the node has less than that available
  ("Available memory on node 0 (8.61/9.96 GiB) on startup is less than desired CPU memory
  utilization (0.92, 9.17 GiB)", vllm/v1/worker/cpu_worker.py); where it starts, it takes
  92 % of the node. A KV cache size (``VLLM_CPU_KVCACHE_SPACE``, whole GiB) skips that
  check and sizes the cache: the planner picks it (:func:`app.planner.checks.cpu_kv_space_choice`,
  4 GiB or what one ``max_model_len`` request needs, within what the node has available
  after the weights).
- The default executor runs the model in a separate ``VLLM::Worker`` process that
  busy-waits with the engine core (docs/cli.md, docs/vllm-facts.md): the in-process executor
  is ``--distributed-executor-backend uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  (app.planner.checks.check_cpu_executor).
- In 0.32 the CPU build saves an AOT-compiled model at every launch that the next launch
  cannot load (``cpu_aot_compile_reloads`` in data/vllm_versions.yaml, from
  vllm/compilation/decorators.py:315): it compiles again each time, after a failed load.
  ``VLLM_USE_AOT_COMPILE=0`` compiles through torch.compile's own cache, which reloads.

Only what the user did not set is filled — an option in the configuration, a variable in
its ``env`` or in the environment vLLM Dyno was started from; an explicit value is never
overridden.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from app.config import ServerConfig
from app.planner.cards import cards_for
from app.planner.checks import cpu_kv_space_choice
from app.planner.gpus import GpuSpec
from app.planner.models import ModelArch, ModelNotFoundError, resolve_model
from app.planner.plan import apply_fix, fix_to_flags, plan
from app.planner.versions import rules_for

#: the findings that say the CPU build's memory does not work as configured
_MEMORY_PROBLEMS = ("not_enough_node_memory", "weights_do_not_fit", "no_kv_cache_memory")


def _gib(x: float) -> str:
    return f"{x:.2f} GiB" if x >= 1 else f"{x * 1024:.0f} MiB"


@dataclass
class LaunchDefaults:
    """What :func:`cpu_build_defaults` chose. ``config`` the configuration to launch;
    ``fix`` the values filled in (ServerConfig field names, ``env`` for variables — the
    form of a planner fix, :func:`app.planner.plan.apply_fix`); ``chosen`` one line per
    choice, for the user; ``notes`` what could not be chosen, and why; ``host``: the rig's
    host they were chosen on (its SSH destination; None: this machine)."""

    config: ServerConfig
    fix: dict[str, Any] = field(default_factory=dict)
    chosen: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    host: str | None = None

    def lines(self) -> list[str]:
        """What a front end prints: what was chosen (with the flags, so that the user can
        set them), then the notes; a host's prefixed ``host DEST: ``."""
        out = []
        on = f"host {self.host}: " if self.host else ""
        if self.chosen:
            out.append(f"{on}CPU build of vLLM — chosen for what you did not set: {fix_to_flags(self.fix)}")
            out += [f"  {c}" for c in self.chosen]
        return out + [f"{on}CPU build of vLLM: {n}" for n in self.notes]

    def as_dict(self) -> dict[str, Any]:
        """The JSON form an agent sends back with its part's ``launched`` reply (no config:
        the part's argv says what ran): ``fix``, ``chosen``, ``notes``."""
        return {"fix": self.fix, "chosen": list(self.chosen), "notes": list(self.notes)}


def cpu_build_defaults(config: ServerConfig, *, vllm_version: str | None, cards: list[GpuSpec] | None = None,
                       model: ModelArch | None = None,
                       environ: Mapping[str, str] | None = None) -> LaunchDefaults:
    """``config`` with the CPU build's working defaults filled in where the user set
    nothing (see the module docstring). ``vllm_version``: the installed CPU build's
    (``"0.32.0+cpu"``); ``cards``: the CPU device(s) to size for (default: this machine's
    node, :func:`app.planner.cards.cards_for` ``cpu_build=True``); ``model``: the
    architecture (default: :func:`app.planner.models.resolve_model` of ``config.model``,
    offline); ``environ``: the environment the server inherits (default ``os.environ``)."""
    env_in = os.environ if environ is None else environ

    def user_set(name: str) -> bool:
        return name in config.env or name in env_in

    out = LaunchDefaults(config)
    fix: dict[str, Any] = {}
    env: dict[str, str] = {}
    if config.world_size == 1 and not user_set("VLLM_ENABLE_V1_MULTIPROCESSING") and \
            config.distributed_executor_backend in (None, "uni"):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if config.distributed_executor_backend is None:
            fix["distributed_executor_backend"] = "uni"
            out.chosen.append("--distributed-executor-backend uni with VLLM_ENABLE_V1_MULTIPROCESSING=0: the model "
                              "runs in the engine's process (the default separate VLLM::Worker busy-waits with the "
                              "engine and starves the API server on few cores)")
        else:
            out.chosen.append("VLLM_ENABLE_V1_MULTIPROCESSING=0: without it the CPU build turns the uni executor "
                              "you asked for back into mp")

    rules = rules_for(vllm_version)
    if not rules.cpu_aot_compile_reloads and not user_set("VLLM_USE_AOT_COMPILE"):
        env["VLLM_USE_AOT_COMPILE"] = "0"
        out.chosen.append(f"VLLM_USE_AOT_COMPILE=0: vLLM {rules.entry}'s CPU build cannot load back the AOT-compiled "
                          "model it saves, so every launch would compile it again after a failed load; "
                          "torch.compile's own cache reloads")
    if not user_set("VLLM_CPU_KVCACHE_SPACE"):
        try:
            arch = model if model is not None else resolve_model(config.model)
        except (ModelNotFoundError, OSError, ValueError) as e:
            arch = None
            out.notes.append(f"no KV cache size chosen: the model's architecture is not known here ({e})")
        if arch is not None:
            devices = cards if cards is not None else cards_for(cpu_build=True)
            p = plan(apply_fix(config, {**fix, "env": env}), devices, arch, vllm_version=vllm_version,
                     use_calibration=False, predict=False)
            g, w = devices[0], _gib(p.ranks[0].weights_gib)
            if config.gpu_memory_utilization is not None and rules.cpu_utilization_budget:
                # the user's utilization sizes the memory: keep it, say when it does not fit
                out.notes += [f.message for f in p.findings if f.problem in _MEMORY_PROBLEMS]
            elif (n := cpu_kv_space_choice(p)) is None:
                out.notes.append(f"no KV cache size fits: {g.free_gib:.2f} GiB of the NUMA node is available and "
                                 f"the weights take {w}; free memory on the node")
            else:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(n)
                vllm_default = (f"vLLM's default, gpu_memory_utilization {rules.default_utilization} × the node's "
                                f"{g.memory_gib:.2f} GiB = {rules.default_utilization * g.memory_gib:.2f} GiB"
                                if rules.cpu_utilization_budget else "vLLM's default of 4 GiB")
                out.chosen.append(f"VLLM_CPU_KVCACHE_SPACE={n}: a KV cache of {n} GiB, of the {g.free_gib:.2f} GiB "
                                  f"the NUMA node has available (weights {w}), instead of {vllm_default}")
    if env:
        fix["env"] = env
    if fix:
        out.fix = fix
        out.config = apply_fix(config, fix)
    return out
