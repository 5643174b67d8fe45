"""The tuner's search space and the planner's pruning (issue 18, items 1–2).

Dimensions (each narrowed by the user; the defaults in brackets):

- the split of the selected cards into ``tensor_parallel_size`` × ``pipeline_parallel_size``
  × ``data_parallel_size`` [every split that uses all the cards; with ``fewer_cards``
  (or an objective per GPU) also splits on fewer cards];
- the checkpoint: one model id per quantization the user lists (a checkpoint's
  quantization is fixed) [the profile's model];
- ``max_num_batched_tokens`` [2048, vLLM's default for the card, twice that];
- ``kv_cache_dtype`` [auto, fp8 — on GPUs];
- CUDA graphs on/off (``enforce_eager``) [both — on GPUs; the CPU build has none];
- any other ``vllm serve`` option the user ticks, with its values (``vary``): a
  ServerConfig option directly, any other as argv (``extra_args``). The planner models
  neither's effect on step times, so their values are predicted alike: they are
  measured only when their candidate is the best predicted (the budget decides).

Not a dimension: ``gpu_memory_utilization`` — each candidate gets the largest value
(≤ :data:`MAX_UTILIZATION`, 0.01 steps) at which the planner finds neither an error
nor a memory warning (:data:`MEMORY_WARNINGS`): the planner's margin
(:func:`largest_utilization`); and ``max_num_seqs`` — under closed-loop load, N users
on a server whose ``max_num_seqs`` ≥ N behave as ``max_num_seqs`` = N, so each
candidate is measured with a large value (:data:`EXPLORE_MAX_NUM_SEQS`, lowered while
the planner says the sampler warm-up would not fit) and the recommendation's value comes
from its measured capacity (:func:`recommended_max_num_seqs`). Prefix caching waits for
shared-prefix workloads (issue 20): without them it cannot change a capacity.

Pruning: a candidate is dropped with the planner's reason (:func:`app.planner.plan.check`:
fit, heads divisibility, capability, the vLLM version's options and quantizations); over a
rig of hosts (issue 21), first with the reason the rig's launch plan refuses its layout
(:func:`app.hosts.plan.launch_plan`'s :class:`~app.hosts.plan.PlanError`: ranks that do
not split evenly over the hosts, a tensor-parallel group spanning hosts, more ranks per
host than a host's selected cards, data parallel with the Ray backend …).
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.config import (INTERNAL_FIELDS, KV_CACHE_DTYPES, VLLM_OPTIONS, ServerConfig, dict_to_extra_args,
                        secret_option_problem)
from app.hosts.plan import PlanError, launch_plan
from app.hosts.spec import Host
from app.planner.gpus import GpuSpec, RigLayout
from app.planner.models import ModelArch, quant_format, resolve_model
from app.planner.plan import Plan, Workload, check
from app.planner.versions import rules_for

#: the highest gpu_memory_utilization the tuner gives a candidate (vLLM's own bound is
#: 1.0; above 0.95 a desktop's display and the CUDA context leave too little, as the
#: planner's checks of free memory and CUDA-graph headroom say case by case)
MAX_UTILIZATION = 0.95
#: below this the tuner does not look for a fitting utilization
MIN_UTILIZATION = 0.50
#: warnings that mean "this utilization leaves too little memory outside vLLM's budget"
MEMORY_WARNINGS = frozenset({"cuda_graph_oom_risk"})
#: max_num_seqs while a candidate is measured: large enough not to bind below twice its
#: capacity (the search probes up to there), halved while the sampler warm-up would not
#: fit; the recommendation then gets its own value
EXPLORE_MAX_NUM_SEQS = (512, 256, 128, 64, 32, 16)
#: max_num_batched_tokens always tried besides the card's default and twice it
MNBT_FLOOR = 2048
#: the options a candidate sets itself (not "vary"-able)
OWN_FIELDS = frozenset({"model", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                        "quantization", "max_num_batched_tokens", "kv_cache_dtype", "enforce_eager",
                        "gpu_memory_utilization", "max_num_seqs"})


class TuneSpace(BaseModel):
    """What the user lets the tuner vary; None = the default of the dimension (module
    docstring). ``checkpoints``: quantization label → model id (``{"awq": "…-AWQ",
    "fp8": "…-FP8"}``), empty = the profile's model; ``vary``: any other vLLM option
    (ServerConfig field name) → the values to try."""

    model_config = ConfigDict(extra="forbid")

    tp: Optional[list[int]] = Field(None, description="tensor_parallel_size values")
    pp: Optional[list[int]] = Field(None, description="pipeline_parallel_size values")
    dp: Optional[list[int]] = Field(None, description="data_parallel_size values")
    checkpoints: dict[str, str] = Field(default_factory=dict)
    max_num_batched_tokens: Optional[list[int]] = None
    kv_cache_dtype: Optional[list[str]] = None
    enforce_eager: Optional[list[bool]] = None
    fewer_cards: bool = False
    vary: dict[str, list[Any]] = Field(default_factory=dict)

    @field_validator("tp", "pp", "dp", "max_num_batched_tokens")
    @classmethod
    def _positive(cls, v: Optional[list[int]], info: ValidationInfo) -> Optional[list[int]]:
        if v is not None:
            if not v or any(int(x) < 1 for x in v):
                raise ValueError(f"{info.field_name}: give one or more whole numbers ≥ 1, e.g. 1,2,4")
            v = sorted(set(int(x) for x in v))
        return v

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None:
            bad = [x for x in v if x not in KV_CACHE_DTYPES]
            if bad or not v:
                raise ValueError(f"kv_cache_dtype {', '.join(bad) or '(none)'}: choose from {', '.join(KV_CACHE_DTYPES)}")
        return v

    @field_validator("vary")
    @classmethod
    def _vary(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in v.items():
            name_ = name.replace("-", "_")
            if name_ in OWN_FIELDS:
                raise ValueError(f"vary {name}: the tuner sets {name_} itself; narrow it with its own option")
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name_) or name_ in INTERNAL_FIELDS:
                raise ValueError(f"vary {name}: not a vLLM option name (write it as vLLM spells it, e.g. "
                                 f"block_size or enable_chunked_prefill)")
            bad = secret_option_problem("--" + name_.replace("_", "-"), "vary")
            if bad:
                raise ValueError(bad)
            if not values:
                raise ValueError(f"vary {name}: give at least one value")
        return {k.replace("-", "_"): vals for k, vals in v.items()}


@dataclass
class Candidate:
    """One configuration: ``key`` a short stable label ("TP4 PP1 DP2 · awq · kv auto ·
    graphs · mnbt 8192"), ``config`` the server options it is measured with,
    ``checkpoint`` the quantization label of its model, ``cards`` how many it uses,
    ``pruned_because`` the planner's reason it cannot start (None: it can), ``plan``
    its planner check (not stored)."""

    key: str
    config: ServerConfig
    checkpoint: str
    cards: int
    pruned_because: Optional[str] = None
    plan: Optional[Plan] = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "checkpoint": self.checkpoint, "cards": self.cards,
                "server": server_flags(self.config), "pruned_because": self.pruned_because}


def server_flags(cfg: ServerConfig) -> dict[str, Any]:
    """The options a configuration sets, as ServerConfig field names with their values
    (booleans as true/false, nothing unset): the ``server`` of the tuner's JSON."""
    return {k: v for k, v in cfg.model_dump(exclude_none=True).items() if k in VLLM_OPTIONS or k == "model"}


def splits(n: int, space: TuneSpace, fewer_cards: bool = False) -> list[tuple[int, int, int]]:
    """(TP, PP, DP) triples from the space's lists (default: every divisor of ``n``)
    whose product is ``n`` (or at most ``n`` with ``fewer_cards``), TP-major order."""
    divs = [d for d in range(1, n + 1) if n % d == 0]
    tps, pps, dps = space.tp or divs, space.pp or divs, space.dp or divs
    out = []
    for tp, pp, dp in itertools.product(tps, pps, dps):
        world = tp * pp * dp
        if world == n or (fewer_cards and world < n):
            out.append((tp, pp, dp))
    return sorted(out, key=lambda s: (-s[0] * s[1] * s[2], -s[0], s[1], s[2]))


def checkpoint_label(cfg: ServerConfig, model: ModelArch) -> str:
    """The quantization label of the profile's own checkpoint: its ``quantization``
    option, else the checkpoint's method, else its dtype (``bf16``)."""
    if cfg.quantization:
        return quant_format(cfg.quantization) or cfg.quantization
    return model.quant_method or (cfg.dtype if cfg.dtype not in (None, "auto") else "bf16")


def _label(tp: int, pp: int, dp: int, ckpt: str, kv: Optional[str], eager: Optional[bool], mnbt: int,
           vary: dict[str, Any]) -> str:
    parts = [f"TP{tp} PP{pp} DP{dp}", ckpt]
    if kv is not None:
        parts.append(f"kv {kv}")
    if eager is not None:
        parts.append("eager" if eager else "graphs")
    parts.append(f"mnbt {mnbt}")
    parts += [f"{k} {v}" for k, v in vary.items()]
    return " · ".join(parts)


def _errors(p: Plan) -> list[str]:
    out = [f"{f.problem}: {f.message}" for f in p.findings if f.verdict == "error"]
    if not out and (p.partition_error is not None or not p.ranks or any(r.kv_tokens <= 0 for r in p.ranks)):
        out.append(p.partition_error or "no_kv_cache_memory: no room for the KV cache")
    return out


def _memory_ok(p: Plan) -> bool:
    return not _errors(p) and not any(f.problem in MEMORY_WARNINGS for f in p.findings)


def largest_utilization(cfg: ServerConfig, cards: list[GpuSpec], model: ModelArch, workload: Workload | None,
                        vllm_version: str | None, rig: RigLayout | None = None) -> tuple[float | None, Plan]:
    """The largest ``gpu_memory_utilization`` (0.01 steps, :data:`MIN_UTILIZATION` …
    :data:`MAX_UTILIZATION`) at which the planner finds no error and no memory warning,
    with its plan; (None, the plan at ``cfg``'s own utilization) when none does. The CPU
    build keeps ``cfg``'s value, None included (there it sizes a share of the node's
    memory): its plan says whether that fits. ``rig``: the hosts the cards sit in and
    their link (:meth:`app.profiles.model.HardwareFingerprint.rig_layout`; None: one
    host) — the plans' step models send what crosses hosts over it."""
    if cards and cards[0].kind == "cpu":
        return cfg.gpu_memory_utilization, check(cfg, cards, model, workload, vllm_version, rig=rig)

    def at(u: float) -> Plan:
        return check(cfg.model_copy(update={"gpu_memory_utilization": u}), cards, model, workload, vllm_version,
                     rig=rig)

    top = at(MAX_UTILIZATION)
    if _memory_ok(top):
        return MAX_UTILIZATION, top
    ok_u, ok_p = None, top
    for u100 in range(int(MAX_UTILIZATION * 100) - 1, int(MIN_UTILIZATION * 100) - 1, -1):
        p = at(u100 / 100)
        if _memory_ok(p):
            ok_u, ok_p = u100, p
            break
        if _errors(p) and not _errors(top):  # lower only loses more: no utilization leaves room for both
            break
    if ok_u is None:
        return None, top
    return ok_u / 100, ok_p


def default_mnbt(cards: list[GpuSpec], vllm_version: str | None) -> list[int]:
    """``max_num_batched_tokens`` values tried by default: :data:`MNBT_FLOOR`, vLLM's
    default for the card (its version's batch defaults) and twice that."""
    g = cards[0]
    d = rules_for(vllm_version).batch_defaults(g.memory_gib, g.name)[1]
    return sorted({MNBT_FLOOR, d, 2 * d})


def enumerate_candidates(base: ServerConfig, cards: list[GpuSpec], space: TuneSpace, workload: Workload | None,
                         vllm_version: str | None, fewer_cards: bool = False,
                         rig: RigLayout | None = None, hosts: list[Host] | None = None,
                         ray_address: str | None = None) -> list[Candidate]:
    """Every configuration of ``space`` around ``base`` on ``cards`` (one GpuSpec per
    selected card), each checked by the planner: runnable ones with the largest
    fitting utilization and an exploring ``max_num_seqs``, the others with
    ``pruned_because``; ``rig``: the hosts and link the cards sit in (None: one host),
    planned with every candidate; ``hosts``: the rig's hosts (two or more) — a candidate
    whose layout their launch plan refuses (:func:`app.hosts.plan.launch_plan`, with
    ``ray_address``) is pruned with the plan's reason. Raises ValueError (naming the input) when the space is empty or
    a checkpoint's model is unknown (the planner's ModelNotFoundError)."""
    if not cards:
        raise ValueError("tune needs at least one card: give --sim-gpu/--sim-gpu-count or select GPUs")
    cpu = cards[0].kind == "cpu"
    base_model = resolve_model(base.model)
    ckpts = dict(space.checkpoints) or {checkpoint_label(base, base_model): base.model}
    models = {label: (mid, base_model if mid == base.model else resolve_model(mid)) for label, mid in ckpts.items()}
    kvs: list[Optional[str]] = ([*space.kv_cache_dtype] if space.kv_cache_dtype
                                else [base.kv_cache_dtype] if cpu else ["auto", "fp8"])
    eagers: list[Optional[bool]] = ([*space.enforce_eager] if space.enforce_eager
                                    else [base.enforce_eager] if cpu else [False, True])
    mnbts = space.max_num_batched_tokens or default_mnbt(cards, vllm_version)
    vary_items = list(space.vary.items())
    vary_combos = [dict(zip([k for k, _ in vary_items], vals)) for vals in
                   itertools.product(*[v for _, v in vary_items])] or [{}]
    sp = splits(len(cards), space, fewer_cards or space.fewer_cards)
    if not sp:
        raise ValueError(f"no split of {len(cards)} cards into the given --tp/--pp/--dp values uses them all "
                         f"(TP × PP × DP must be {len(cards)}); add values or allow fewer cards")
    out: list[Candidate] = []
    for (tp, pp, dp), (label, (mid, arch)), kv, eager, mnbt, extra in itertools.product(
            sp, models.items(), kvs, eagers, mnbts, vary_combos):
        upd: dict[str, Any] = {"model": mid, "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                               "data_parallel_size": dp, "max_num_batched_tokens": mnbt,
                               "kv_cache_dtype": kv, "enforce_eager": eager}
        upd.update({k: v for k, v in extra.items() if k in VLLM_OPTIONS})
        other = {k: v for k, v in extra.items() if k not in VLLM_OPTIONS}
        if other:  # options ServerConfig does not model: passed through as vLLM argv
            upd["extra_args"] = list(base.extra_args) + dict_to_extra_args(other)
        if mid != base.model:
            upd["quantization"] = None  # the checkpoint's own method
        use = cards[:tp * pp * dp]
        key = _label(tp, pp, dp, label, kv if not cpu else None, eager if not cpu else None, mnbt, extra)
        try:
            cfg = base.model_copy(update=upd)
            cfg = ServerConfig.model_validate(cfg.model_dump())
        except ValueError as e:
            out.append(Candidate(key, base, label, len(use), f"invalid options: {e}"))
            continue
        refused = rig_refusal(cfg, hosts, ray_address)
        if refused is not None:
            out.append(Candidate(key, cfg, label, len(use), refused))
            continue
        cand = _fit(cfg, use, arch, workload, vllm_version, key, label, rig)
        out.append(cand)
    return out


def rig_refusal(cfg: ServerConfig, hosts: list[Host] | None, ray_address: str | None = None) -> str | None:
    """Why the launch plan of a rig of ``hosts`` (two or more) refuses ``cfg``'s layout —
    ``launch_plan: `` and :func:`app.hosts.plan.launch_plan`'s :class:`PlanError` — or
    None (it accepts it, or there is no rig)."""
    if hosts is None or len(hosts) < 2:
        return None
    try:
        launch_plan(list(hosts), cfg, ray_address=ray_address)
    except PlanError as e:
        return f"launch_plan: {e}"
    return None


def _fit(cfg: ServerConfig, cards: list[GpuSpec], arch: ModelArch, workload: Workload | None,
         vllm_version: str | None, key: str, label: str, rig: RigLayout | None = None) -> Candidate:
    """The candidate with the exploring max_num_seqs and the largest fitting
    utilization, or pruned with the planner's first error."""
    first_errors: list[str] | None = None
    for seqs in EXPLORE_MAX_NUM_SEQS:
        c = cfg.model_copy(update={"max_num_seqs": seqs, "max_num_batched_tokens": max(seqs, cfg.max_num_batched_tokens or 0)})
        u, p = largest_utilization(c, cards, arch, workload, vllm_version, rig)
        if _memory_ok(p):
            c = c.model_copy(update={"gpu_memory_utilization": u}) if cards[0].kind != "cpu" else c
            return Candidate(key, c, label, len(cards), None, p)
        errs = _errors(p) or [f"{f.problem}: {f.message} No gpu_memory_utilization ≤ {MAX_UTILIZATION} leaves room for "
                              f"both the KV cache and this" for f in p.findings if f.problem in MEMORY_WARNINGS]
        if first_errors is None:
            first_errors = errs
        if not any(e.startswith("sampler_warmup_oom") or e.startswith("cuda_graph_oom_risk") for e in errs):
            break  # a smaller max_num_seqs cannot help
    return Candidate(key, cfg, label, len(cards), (first_errors or ["the planner finds no fitting memory"])[0])


def recommended_max_num_seqs(users: float, limit: int | None = None) -> int:
    """``max_num_seqs`` for a measured capacity of ``users`` closed-loop users: the
    capacity rounded up to a multiple of 8 (CUDA-graph capture sizes are multiples of 8
    above 8 in vLLM's default ``cudagraph_capture_sizes``: 1, 2, 4, then 8, 16, 24 …),
    so that the users at the SLO all run in the batch and a surge beyond them queues
    instead of slowing every stream; at most ``limit`` (the value it was measured with)."""
    n = max(1, math.ceil(users))
    n = n if n <= 4 else 8 * math.ceil(n / 8)
    return min(n, limit) if limit else n
