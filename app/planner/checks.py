"""Pre-launch checks: each looks at a built plan and returns a :class:`Finding` (verdict
``ok``/``warn``/``error``, a stable problem code, a sentence) plus candidate fixes.

A candidate fix is a dict of option values (ServerConfig field names; ``env`` merges
into the environment; a key that is not a field names an extra option, ``None`` drops
it). :func:`app.planner.plan.plan` offers the first candidate whose fixed configuration
no longer shows the problem and has no error the unfixed one did not have — memory
included.

Problem codes (stable): not_enough_gpus, tp_not_divisor_of_heads, pp_partition_invalid,
quantization_unknown, quantization_unsupported_by_gpu, dtype_unsupported_by_gpu,
dtype_unsupported_by_quantization, option_not_accepted, batched_tokens_below_num_seqs,
max_model_len_exceeds_model, not_enough_free_vram, not_enough_node_memory,
weights_do_not_fit, no_kv_cache_memory, context_exceeds_kv_cache,
request_exceeds_max_model_len, cuda_graph_oom_risk, sampler_warmup_oom, no_p2p,
cpu_worker_busy_wait.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from app.config import extra_args_to_dict
from app.planner.gpus import GIB
from app.planner.memory import CPU_DEFAULT_KV_GIB

if TYPE_CHECKING:
    from app.planner.plan import Plan

VERDICT_ORDER = {"ok": 0, "warn": 1, "error": 2}


@dataclass
class Finding:
    """One check's result: ``verdict`` ok/warn/error, ``problem`` code, ``message`` a
    plain sentence, ``fix`` option values that pass every check (None when no such fix
    was found), ``candidates`` the fixes tried in order."""

    problem: str
    verdict: str
    message: str
    fix: dict[str, Any] | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)


def floor2(x: float) -> float:
    """Round down to two decimals (0.6636 → 0.66), robust to float noise."""
    return math.floor(x * 100 + 1e-9) / 100


def tp_divides(tp: int, heads: int, kv_heads: int) -> bool:
    """vLLM's rule for tensor parallel size ``tp``: it divides the attention heads, and
    either divides the KV heads or is a multiple of them (the KV heads are then
    replicated). Source: vllm/config (ModelConfig.verify_with_parallel_config, "Total
    number of attention heads … must be divisible by tensor parallel size") and the
    KV-head replication in vllm/model_executor/layers/linear.py (QKVParallelLinear)."""
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


def valid_tp_sizes(cards: int, pp: int = 1, heads: int | None = None, kv_heads: int | None = None) -> list[int]:
    """The tensor parallel sizes that fit ``cards`` with pipeline size ``pp`` (TP × PP ≤
    cards) and, when the model's ``heads``/``kv_heads`` are known, satisfy
    :func:`tp_divides`; ``[1]`` at least. Ascending."""
    out = [t for t in range(1, max(1, cards // max(1, pp)) + 1)
           if not heads or tp_divides(t, heads, kv_heads or heads)]
    return out or [1]


def valid_pp_sizes(cards: int, tp: int = 1, layers: int | None = None) -> list[int]:
    """The pipeline parallel sizes that fit ``cards`` with tensor size ``tp`` and give
    every stage at least one of the model's ``layers`` (when known); ``[1]`` at least."""
    limit = layers or cards
    return [p for p in range(1, max(1, cards // max(1, tp)) + 1) if p <= limit] or [1]


def _tp_choices(p: "Plan", max_tp: int) -> list[int]:
    m = p.model
    return [t for t in range(max_tp, 0, -1) if tp_divides(t, m.heads, m.kv_heads)]


# ---------------------------------------------------------------------- checks
def check_world_size(p: "Plan") -> Finding | None:
    e, n = p.effective, len(p.gpus)
    if e.world <= n:
        return None
    cands = [{"tensor_parallel_size": t} for t in _tp_choices(p, n // e.pp)] if n // e.pp >= 1 else []
    if e.pp > 1:
        cands += [{"tensor_parallel_size": t, "pipeline_parallel_size": 1} for t in _tp_choices(p, n)]
    return Finding("not_enough_gpus", "error",
                   f"tensor_parallel_size × pipeline_parallel_size = {e.tp} × {e.pp} = {e.world} GPUs, "
                   f"but only {n} are selected: vLLM stops with \"World size ({e.world}) is larger than the "
                   f"number of available GPUs ({n})\".", candidates=cands)


def check_tp_heads(p: "Plan") -> Finding | None:
    e, m = p.effective, p.model
    if tp_divides(e.tp, m.heads, m.kv_heads):
        return None
    limit = max(1, len(p.gpus) // e.pp)
    below = [t for t in _tp_choices(p, min(e.tp, limit))]
    above = [t for t in range(e.tp + 1, limit + 1) if tp_divides(t, m.heads, m.kv_heads)]
    cands = [{"tensor_parallel_size": t} for t in below + above]
    if m.layers >= e.tp * e.pp:
        cands.append({"tensor_parallel_size": 1, "pipeline_parallel_size": e.tp * e.pp})
    return Finding("tp_not_divisor_of_heads", "error",
                   f"tensor_parallel_size {e.tp} does not divide the model's {m.heads} attention heads "
                   f"({m.kv_heads} KV heads): each card must hold whole heads.", candidates=cands)


def check_pp_partition(p: "Plan") -> Finding | None:
    if p.partition_error is None:
        return None
    return Finding("pp_partition_invalid", "error", p.partition_error,
                   candidates=[{"env": {"VLLM_PP_LAYER_PARTITION": None}}])


def check_quantization_known(p: "Plan") -> Finding | None:
    q = p.config.quantization
    if not q or q in p.rules.quantization_methods:
        return None
    return Finding("quantization_unknown", "error",
                   f"--quantization {q} is not a method vLLM {p.rules.version} knows "
                   f"(\"Unknown quantization method: {q}\").", candidates=[{"quantization": None}])


def check_quantization_capability(p: "Plan") -> Finding | None:
    q = p.effective.quantization
    if not q:
        return None
    need = p.rules.min_capability(q)
    gpus = [g for g in p.cards if g.kind != "cpu"]
    if need is None or not gpus:
        return None
    low = min(gpus, key=lambda g: g.capability)
    if low.capability >= need:
        return None
    return Finding("quantization_unsupported_by_gpu", "error",
                   f"quantization {q} needs compute capability {need / 10:.1f} or higher; the {low.name} "
                   f"has {low.cc:.1f}: use a checkpoint in another format (unquantized, or GPTQ from 6.0) "
                   f"or a newer card.")


def check_dtype_capability(p: "Plan") -> Finding | None:
    if p.config.dtype != "bfloat16":
        return None
    gpus = [g for g in p.cards if g.kind != "cpu"]
    low = min(gpus, key=lambda g: g.capability) if gpus else None
    if low is None or low.capability >= 80:
        return None
    return Finding("dtype_unsupported_by_gpu", "error",
                   f"bfloat16 needs compute capability 8.0; the {low.name} has {low.cc:.1f}: run in float16.",
                   candidates=[{"dtype": "half"}])


def check_dtype_quantization(p: "Plan") -> Finding | None:
    q = p.effective.quantization
    if q != "awq" or p.config.dtype != "bfloat16" or p.rules.awq_bf16:
        return None
    return Finding("dtype_unsupported_by_quantization", "error",
                   f"vLLM {p.rules.version} runs AWQ in float16 only (\"torch.bfloat16 is not supported for "
                   f"quantization method awq\").", candidates=[{"dtype": "half"}])


def check_removed_options(p: "Plan") -> Finding | None:
    try:
        extra = extra_args_to_dict(p.config.extra_args)
    except ValueError:
        return None
    bad = [k for k in extra if k in p.rules.removed_options]
    if not bad:
        return None
    return Finding("option_not_accepted", "error",
                   f"vLLM {p.rules.version} no longer accepts {', '.join('--' + b for b in bad)} "
                   f"(argparse stops with \"unrecognized arguments\").",
                   candidates=[{b.replace('-', '_'): None for b in bad}])


def check_batched_tokens(p: "Plan") -> Finding | None:
    e = p.effective
    if e.max_num_batched_tokens >= e.max_num_seqs:
        return None
    return Finding("batched_tokens_below_num_seqs", "error",
                   f"max_num_batched_tokens {e.max_num_batched_tokens} is smaller than max_num_seqs "
                   f"{e.max_num_seqs}; vLLM needs at least one token per sequence per step.",
                   candidates=[{"max_num_batched_tokens": e.max_num_seqs}])


def check_max_model_len(p: "Plan") -> Finding | None:
    e, m = p.effective, p.model
    if e.max_model_len <= m.max_position:
        return None
    return Finding("max_model_len_exceeds_model", "error",
                   f"max_model_len {e.max_model_len:,} is longer than the model's limit "
                   f"(max_position_embeddings {m.max_position:,}).", candidates=[{"max_model_len": m.max_position}])


#: what ends memory held by leftover vLLM processes (a fix that is no option value)
CLEANUP_HINT = ("end the leftover VLLM:: processes (`vllm-dyno cleanup`, or the window's Clean up leftover "
                "vLLM processes)")


def model_need_gib(r, block_size: int) -> float:
    """What one rank (a :class:`app.planner.memory.RankMemory`) needs inside its budget to
    start at all, GiB: weights, activations, the process's own memory (non-torch) and one
    KV block of ``block_size`` tokens (below it vLLM stops with "No available memory for
    the cache blocks")."""
    return r.weights_gib + r.activation_gib + r.non_torch_gib + r.kv_bytes_per_token * block_size / GIB


def min_utilization(p: "Plan") -> float:
    """The smallest ``gpu_memory_utilization`` that still holds the model on every rank
    (:func:`model_need_gib` ÷ the card's total, the largest over the ranks)."""
    return max(model_need_gib(r, p.effective.block_size) / r.total_gib for r in p.ranks)


def check_free_vram(p: "Plan") -> Finding | None:
    """vLLM refuses to start when ``gpu_memory_utilization`` × the card's total is more
    than its free memory (vllm/v1/worker/utils.py request_memory, 0.32: "Free memory on
    device cuda:0 (F/T GiB) on startup is less than desired GPU memory utilization (U, R
    GiB)"; vllm/v1/worker/gpu_worker.py init_device, 0.10/0.11, the same without the
    device name). The fix is the largest utilization that fits the free memory (rounded
    down to two decimals) only when it still holds the model (:func:`min_utilization`);
    otherwise no utilization fits and the message says to end the leftover processes."""
    e = p.effective
    short = [g for g in p.cards if g.kind != "cpu" and e.utilization * g.memory_gib > g.free_gib + 1e-9]
    if not short:
        return None
    fit = floor2(min(g.free_gib / g.memory_gib for g in p.cards if g.kind != "cpu"))
    need = min_utilization(p)
    g = min(short, key=lambda g: g.free_gib / g.memory_gib)
    head = (f"gpu_memory_utilization {e.utilization} asks for {e.utilization * g.memory_gib:.2f} GiB of the "
            f"{g.name}'s {g.memory_gib:.2f} GiB, but other processes hold {g.busy_gib:.2f} GiB "
            f"({g.free_gib:.2f} GiB free; often a leftover vLLM)")
    if fit > 0 and fit >= need:
        return Finding("not_enough_free_vram", "error",
                       f"{head}: {CLEANUP_HINT}, or use gpu_memory_utilization {fit}, the largest that fits the "
                       f"free memory and still holds the model (it needs at least {math.ceil(need * 100) / 100}).",
                       candidates=[{"gpu_memory_utilization": fit}])
    return Finding("not_enough_free_vram", "error",
                   f"{head}. No gpu_memory_utilization fits: the model needs at least "
                   f"{min(1.0, math.ceil(need * 100) / 100)} of the card (weights, activations and a KV block) "
                   f"and only {max(0.0, fit)} of it is free — {CLEANUP_HINT}.")


def _util_up(p: "Plan") -> list[dict[str, Any]]:
    """Utilizations above the current one, up to 0.95 or what the free memory allows,
    largest first; for GPUs, and for the CPU build where the utilization sizes it."""
    e = p.effective
    cards = [g for g in p.cards if g.kind != "cpu" or e.cpu_budget_from_utilization]
    if not cards:
        return []
    top = min(0.95, floor2(min(g.free_gib / g.memory_gib for g in cards)))
    cur = e.utilization
    return [{"gpu_memory_utilization": round(u / 100, 2)} for u in range(round(top * 100), round(cur * 100), -1)]


def _more_parallel(p: "Plan") -> list[dict[str, Any]]:
    e, n = p.effective, len(p.gpus)
    out = [{"tensor_parallel_size": t} for t in sorted(_tp_choices(p, n // e.pp)) if t > e.tp]
    for pp in range(e.pp + 1, n // e.tp + 1):
        if p.model.layers >= pp:
            out.append({"pipeline_parallel_size": pp})
    return out


def weights_room_gib(p: "Plan", r) -> float:
    """The memory the weights of rank ``r`` may take, GiB: the budget (total ×
    ``gpu_memory_utilization``), or on the CPU build with a KV space the node's total."""
    if r.gpu.kind == "cpu" and not p.effective.cpu_budget_from_utilization:
        return r.total_gib
    return r.budget_gib


def check_weights_fit(p: "Plan") -> Finding | None:
    """The weights alone are larger than the memory a card may use: vLLM runs out of
    memory while loading them or, when they fit the card but not the budget, finds no
    memory for the KV cache. Reported with the per-card figure, not as "no KV memory"."""
    bad = [r for r in p.ranks if r.weights_gib > weights_room_gib(p, r) + 1e-9]
    if not bad:
        return None
    r = max(bad, key=lambda r: r.weights_gib - weights_room_gib(p, r))
    e = p.effective
    room = weights_room_gib(p, r)
    what = (f"the node's {room:.2f} GiB" if room == r.total_gib and r.gpu.kind == "cpu" else
            f"the budget of {room:.2f} GiB (gpu_memory_utilization {e.utilization} × {r.total_gib:.2f} GiB)")
    split = f" split over TP {e.tp} × PP {e.pp}" if e.world > 1 else ""
    return Finding("weights_do_not_fit", "error",
                   f"the weights do not fit: {r.weights_gib:.2f} GiB per card on {r.gpu.name} (rank {r.rank}"
                   f"{split}, {p.weights_gib_total:.2f} GiB in all) is more than {what}: spread the model over "
                   f"more cards (tensor or pipeline parallel), or use a quantized checkpoint.",
                   candidates=_more_parallel(p) + _util_up(p))


def check_kv_memory(p: "Plan") -> Finding | None:
    bad = [r for r in p.ranks if r.kv_tokens <= 0 and r.weights_gib <= weights_room_gib(p, r) + 1e-9]
    if not bad:
        return None
    r = max(bad, key=lambda r: r.weights_gib + r.activation_gib + r.non_torch_gib - r.budget_gib)
    if r.gpu.kind == "cpu":
        return Finding("no_kv_cache_memory", "error",
                       f"no memory is left for the KV cache on the CPU build: weights {r.weights_gib:.2f} GiB + the "
                       f"process's own ≈{r.non_torch_gib:.2f} GiB exceed gpu_memory_utilization "
                       f"{p.effective.utilization} × the node's {r.total_gib:.2f} GiB = {r.budget_gib:.2f} GiB (vLLM: "
                       f"\"… on kv cache allocation is less than requested memory for kv\"): set the KV cache size "
                       f"(VLLM_CPU_KVCACHE_SPACE) or raise the utilization.",
                       candidates=cpu_kv_space_candidates(p) + _util_up(p))
    return Finding("no_kv_cache_memory", "error",
                   f"no memory is left for the KV cache on {r.gpu.name} (rank {r.rank}): weights "
                   f"{r.weights_gib:.2f} GiB + activations {r.activation_gib:.2f} GiB + non-torch "
                   f"{r.non_torch_gib:.2f} GiB exceed the budget of {r.budget_gib:.2f} GiB "
                   f"(\"No available memory for the cache blocks\"): quantize, raise the utilization or "
                   f"spread the model over more cards.", candidates=_util_up(p) + _more_parallel(p))


def _cpu_ranks(p: "Plan") -> list:
    return [r for r in p.ranks if r.gpu.kind == "cpu"]


def _cpu_kv_room(p: "Plan") -> int:
    """Whole GiB of the node left for the KV cache after the weights and the process's
    own memory (the smallest over the CPU ranks)."""
    return min(math.floor(r.gpu.free_gib - r.weights_gib - r.non_torch_gib + 1e-9) for r in _cpu_ranks(p))


def cpu_kv_space_want(p: "Plan") -> int:
    """The KV cache size, whole GiB, the CPU build of ``p`` can use: what
    ``max_num_seqs`` requests of ``max_model_len`` tokens take at most, but no more than
    4 GiB — the default of the versions that have one (vllm/platforms/cpu.py, 0.10/0.11)
    — unless one request of ``max_model_len`` tokens needs more; at least 1 GiB."""
    e = p.effective
    bpt = max((r.kv_bytes_per_token for r in _cpu_ranks(p)), default=0)
    one_request = math.ceil(e.max_model_len / e.block_size) * e.block_size * bpt / GIB
    return max(1, min(int(CPU_DEFAULT_KV_GIB), math.ceil(one_request * e.max_num_seqs)), math.ceil(one_request))


def cpu_kv_space_choice(p: "Plan") -> int | None:
    """The ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB: vLLM parses it with ``int``,
    vllm/envs.py) the planner picks for the CPU build: :func:`cpu_kv_space_want`, at most
    what the node has available after the weights and the process's own memory. None
    when not even 1 GiB is left (or there is no CPU device)."""
    if not _cpu_ranks(p):
        return None
    room = _cpu_kv_room(p)
    return min(room, cpu_kv_space_want(p)) if room >= 1 else None


def cpu_kv_space_candidates(p: "Plan") -> list[dict[str, Any]]:
    """KV cache sizes to try as fixes on the CPU build: :func:`cpu_kv_space_choice`, then
    all that is left of the node, then 1 GiB."""
    n = cpu_kv_space_choice(p)
    if n is None:
        return []
    sizes = list(dict.fromkeys([n, _cpu_kv_room(p), 1]))
    return [{"env": {"VLLM_CPU_KVCACHE_SPACE": str(m)}} for m in sizes]


def check_node_memory(p: "Plan") -> Finding | None:
    """The CPU build and the NUMA node's available memory (:func:`app.planner.cards.node_memory`).

    Where the utilization sizes it (0.32 on, no ``VLLM_CPU_KVCACHE_SPACE``): vLLM asks
    for ``gpu_memory_utilization`` × the node's total and stops when that is more than
    the node's available memory (vllm/v1/worker/cpu_worker.py, CPUWorker.__init__:
    "Available memory on node N (A/T GiB) on startup is less than desired CPU memory
    utilization (U, R GiB)"). With a KV space (or the 4 GiB default of 0.10/0.11): the
    weights, the process and the KV cache must fit in what is available (0.32:
    "Available memory on node N (A/T GiB) on kv cache allocation is less than requested
    memory for kv (K GiB)", cpu_worker.py determine_available_memory). Fixes: a KV space
    that fits (:func:`cpu_kv_space_candidates`), or the largest utilization that fits
    and still holds the model."""
    cpu = _cpu_ranks(p)
    if not cpu:
        return None
    e = p.effective
    r = cpu[0]
    g = r.gpu
    if r.weights_gib > weights_room_gib(p, r) + 1e-9:
        return None  # weights_do_not_fit says it
    where = f"only {g.free_gib:.2f} GiB of the NUMA node's {g.memory_gib:.2f} GiB is available (others hold " \
            f"{g.busy_gib:.2f} GiB)"
    if e.cpu_budget_from_utilization:
        want = e.utilization * g.memory_gib
        if want <= g.free_gib + 1e-9:
            return None
        cands = cpu_kv_space_candidates(p)
        fit = floor2(g.free_gib / g.memory_gib)
        if fit > 0 and fit >= min_utilization(p):
            cands.append({"gpu_memory_utilization": fit})
        msg = (f"on the CPU build gpu_memory_utilization is a fraction of the NUMA node's memory: {e.utilization} × "
               f"{g.memory_gib:.2f} GiB = {want:.2f} GiB, but {where}; vLLM {p.rules.version} stops with "
               f"\"Available memory on node … on startup is less than desired CPU memory utilization\". ")
        if cands:
            msg += ("Set the KV cache size instead (VLLM_CPU_KVCACHE_SPACE, GiB: vLLM then skips this check) or "
                    "lower the utilization.")
        else:
            msg += ("Not even the weights and the process fit in what is available: free memory on the node (other "
                    f"programs; {CLEANUP_HINT}).")
        return Finding("not_enough_node_memory", "error", msg, candidates=cands)
    need = r.weights_gib + r.non_torch_gib + r.kv_gib
    if need <= g.free_gib + 1e-9:
        return None
    src = "VLLM_CPU_KVCACHE_SPACE" if e.cpu_kv_space_gib is not None else "the default when VLLM_CPU_KVCACHE_SPACE is unset"
    said = (" (vLLM: \"Available memory on node … on kv cache allocation is less than requested memory for kv\")"
            if p.rules.cpu_utilization_budget else "")
    cands = [c for c in cpu_kv_space_candidates(p) if float(c["env"]["VLLM_CPU_KVCACHE_SPACE"]) < r.kv_gib]
    return Finding("not_enough_node_memory", "error",
                   f"the CPU build needs ≈{need:.2f} GiB of the NUMA node — weights {r.weights_gib:.2f} GiB, the "
                   f"process ≈{r.non_torch_gib:.2f} GiB and a KV cache of {r.kv_gib:g} GiB ({src}) — but {where}{said}: "
                   + ("a smaller KV cache fits." if cands else f"free memory on the node (other programs; {CLEANUP_HINT})."),
                   candidates=cands)


def check_context_fits(p: "Plan") -> Finding | None:
    e = p.effective
    if p.kv_cache_tokens <= 0 or p.kv_cache_tokens >= e.max_model_len:
        return None
    # never offer more than the model supports (that is its own error)
    cands: list[dict[str, Any]] = [{"max_model_len": min(p.kv_cache_tokens, p.model.max_position)}]
    if p.kv_cache_tokens * 2 >= e.max_model_len and e.kv_dtype_bytes > 1:
        cands.append({"kv_cache_dtype": "fp8"})
    return Finding("context_exceeds_kv_cache", "error",
                   f"one request of max_model_len {e.max_model_len:,} tokens needs "
                   f"{e.max_model_len * p.kv_bytes_per_token / 2**30:.2f} GiB of KV cache; only "
                   f"{p.kv_cache_tokens:,} tokens fit (the smallest stage decides).", candidates=cands)


def check_workload_len(p: "Plan") -> Finding | None:
    w = p.workload
    if w is None or w.prompt_tokens + w.output_tokens <= p.effective.max_model_len:
        return None
    need = w.prompt_tokens + w.output_tokens
    return Finding("request_exceeds_max_model_len", "error",
                   f"the workload's requests ({w.prompt_tokens} + {w.output_tokens} tokens) are longer than "
                   f"max_model_len {p.effective.max_model_len:,}: the server answers HTTP 400.",
                   candidates=[{"max_model_len": need}])


def check_graph_headroom(p: "Plan") -> Finding | None:
    bad = [r for r in p.ranks if r.gpu.kind != "cpu" and r.cuda_graphs_gib > r.headroom_gib]
    if not bad:
        return None
    r = bad[0]
    u = floor2(min((x.total_gib - x.cuda_graphs_gib - x.sampler_gib) / x.total_gib for x in p.ranks))
    return Finding("cuda_graph_oom_risk", "warn",
                   f"CUDA graphs need ≈{r.cuda_graphs_gib:.2f} GiB outside the budget but only "
                   f"{r.headroom_gib:.2f} GiB is left above gpu_memory_utilization {p.effective.utilization} "
                   f"on {r.gpu.name}: the launch may end in \"CUDA out of memory\".",
                   candidates=[{"gpu_memory_utilization": u}, {"enforce_eager": True}])


def check_sampler(p: "Plan") -> Finding | None:
    """The sampler warm-up after the KV cache is allocated and the CUDA graphs captured
    (vllm/v1/worker/gpu_worker.py ``compile_or_warm_up_model`` calls vllm/v1/worker/
    gpu_model_runner.py ``_dummy_sampler_run``, 0.10 to 0.32: an out-of-memory there is
    re-raised as ``RuntimeError("CUDA out of memory occurred when warming up sampler with
    N dummy requests. Please try lowering `max_num_seqs` or `gpu_memory_utilization` when
    initializing the engine.")``, which ends the launch): an error. Fixes: a smaller
    ``max_num_seqs`` (vLLM's own default for the card first), or a lower utilization."""
    # where the graphs alone overflow the headroom, cuda_graph_oom_risk (and its fixes) covers it
    bad = [r for r in p.ranks if r.sampler_gib and (r.sampler_gib > r.headroom_gib or (
        r.cuda_graphs_gib <= r.headroom_gib and r.sampler_gib > r.headroom_gib - r.cuda_graphs_gib))]
    if not bad:
        return None
    r = bad[0]
    e = p.effective
    default_seqs = p.rules.batch_defaults(r.gpu.memory_gib, r.gpu.name)[0]
    seqs = [default_seqs] if default_seqs < e.max_num_seqs else []
    s = e.max_num_seqs // 2
    while s >= 1:
        if s not in seqs and s < e.max_num_seqs:
            seqs.append(s)
        s //= 2
    u = floor2(min((x.total_gib - x.cuda_graphs_gib - x.sampler_gib) / x.total_gib for x in p.ranks))
    lower = [{"gpu_memory_utilization": u}] if 0 < u < e.utilization else []
    return Finding("sampler_warmup_oom", "error",
                   f"the sampler warm-up for max_num_seqs {e.max_num_seqs} × vocabulary {p.model.vocab:,} needs "
                   f"≈{r.sampler_gib:.2f} GiB above the budget, but only "
                   f"{max(0.0, r.headroom_gib - r.cuda_graphs_gib):.2f} GiB is left on {r.gpu.name} after CUDA "
                   f"graphs: vLLM stops the launch with \"CUDA out of memory occurred when warming up sampler with "
                   f"{e.max_num_seqs} dummy requests\".",
                   candidates=[{"max_num_seqs": s} for s in seqs] + lower)


def check_p2p(p: "Plan") -> Finding | None:
    e = p.effective
    if e.world <= 1 or p.config.env.get("NCCL_P2P_DISABLE") == "1":
        return None
    used = p.cards
    if all(g.p2p for g in used) or any(g.kind == "cpu" for g in used):
        return None
    g = next(g for g in used if not g.p2p)
    fix: dict[str, Any] = {"env": {"NCCL_P2P_DISABLE": "1"}}
    if e.tp > 1 and not p.config.disable_custom_all_reduce:
        fix["disable_custom_all_reduce"] = True
    return Finding("no_p2p", "warn",
                   f"{g.name} cards have no peer-to-peer access: NCCL can hang at start-up unless P2P is "
                   f"disabled, and vLLM's custom all-reduce needs P2P.", candidates=[fix])


def check_cpu_executor(p: "Plan") -> Finding | None:
    """The CPU build with its default executor: the model runs in a separate
    ``VLLM::Worker`` process, and it and ``VLLM::EngineCore`` spin (``sched_yield``) on
    their shared-memory queue for 1 s after every message (vllm/distributed/
    device_communicators/shm_broadcast.py, ``SpinCondition(busy_loop_s=1)``). Measured
    on 2 cores: tokens came in bursts, TTFT p99 at max_num_seqs 1.2–1.5 s instead of
    ≈ 40 ms. The in-process executor needs both the option and the variable: without
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the CPU platform turns ``uni`` back into ``mp``."""
    if not any(g.kind == "cpu" for g in p.cards) or p.effective.world > 1:
        return None

    if p.config.distributed_executor_backend == "uni" and p.config.env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        return None
    return Finding("cpu_worker_busy_wait", "warn",
                   "The CPU build runs the model in a separate VLLM::Worker process by default, and it and "
                   "VLLM::EngineCore busy-wait on their shared-memory queue: on a machine with few cores they starve "
                   "the API server and tokens arrive in bursts. Run the model in the engine's process "
                   "(--distributed-executor-backend uni with VLLM_ENABLE_V1_MULTIPROCESSING=0).",
                   candidates=[{"distributed_executor_backend": "uni",
                                "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}])


#: all checks in the order problems are reported (errors before warnings in the result)
CHECKS: list[Callable[["Plan"], Finding | None]] = [
    check_world_size, check_tp_heads, check_pp_partition, check_quantization_known,
    check_quantization_capability, check_dtype_capability, check_dtype_quantization,
    check_removed_options, check_batched_tokens, check_max_model_len, check_free_vram, check_node_memory,
    check_weights_fit, check_kv_memory, check_context_fits, check_workload_len, check_graph_headroom,
    check_sampler, check_p2p, check_cpu_executor,
]
