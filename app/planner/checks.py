"""Pre-launch checks: each looks at a built plan and returns a :class:`Finding` (verdict
``info``/``warn``/``error``, a stable problem code, a sentence) plus candidate fixes.
``info`` is information only: it never changes the plan's verdict (ok/warn/error).

A candidate fix is a dict of option values (ServerConfig field names; ``env`` merges
into the environment; a key that is not a field names an extra option, ``None`` drops
it). :func:`app.planner.plan.plan` offers the first candidate whose fixed configuration
no longer shows the problem and has no error the unfixed one did not have — memory
included. A finding's ``layouts`` (other tensor × pipeline × data parallel splits of
the selected cards, :func:`parallel_layouts`) are tried when no candidate passes: of
those that pass and fit the cards, the one with the highest predicted throughput is
offered.

Problem codes (stable): not_enough_gpus, tp_not_divisor_of_heads, pp_partition_invalid,
quantization_unknown, quantization_mismatch (``--quantization`` does not fit the checkpoint's
quantization_config, or needs one the checkpoint lacks), quantization_unsupported_by_gpu
(the method, or a compressed-tensors scheme of the checkpoint, needs a higher compute
capability), quantization_weight_only_fallback (info: vLLM runs
the quantization on its slower weight-only path on these cards), dtype_unsupported_by_gpu,
dtype_unsupported_by_quantization, option_not_accepted, batched_tokens_below_num_seqs,
active_seqs_above_num_seqs (``--max-num-active-seqs`` above the effective max_num_seqs),
max_model_len_exceeds_model, not_enough_free_vram, not_enough_node_memory,
weights_do_not_fit, no_kv_cache_memory, context_exceeds_kv_cache,
request_exceeds_max_model_len, cuda_graph_oom_risk, sampler_warmup_oom, no_p2p,
cpu_worker_busy_wait, p2p_hang_risk, p2p_forced, speculative_draft_unknown (the
``--speculative-config`` draft model's config.json cannot be read: its memory is not
counted), cpu_speculative_without_iomp (info: the CPU build serves speculative decoding
but warns that it is slow without Intel OpenMP preloaded), tp_spans_hosts (a rig of
several hosts: a tensor-parallel group crosses the network; vLLM's docs advise TP within
a node and PP across nodes), batched_tokens_below_max_model_len (chunked prefill off and
max_num_batched_tokens below max_model_len), kv_cache_dtype_unsupported_by_gpu (an FP8 E4M3
KV cache below compute capability 8.9), options_not_modelled (info: ``--extra`` options the
plan's figures leave out).
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

VERDICT_ORDER = {"ok": 0, "info": 0, "warn": 1, "error": 2}


@dataclass
class Finding:
    """One check's result: ``verdict`` info/warn/error (info: does not change the
    plan's verdict), ``problem`` code, ``message`` a plain sentence, ``fix`` option
    values that pass every check (None when no such fix was found), ``candidates`` the
    fixes tried in order, ``layouts`` the parallel splits tried after them (ranked by
    predicted throughput), ``alternatives`` the passing layouts with their predicted
    peak output tokens/s, best first (set by :func:`app.planner.plan.plan`)."""

    problem: str
    verdict: str
    message: str
    fix: dict[str, Any] | None = None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    layouts: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[tuple[dict[str, Any], float]] = field(default_factory=list)


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
    cards; pass PP × DP as ``pp`` for data parallel replicas: :func:`valid_dp_sizes`) and,
    when the model's ``heads``/``kv_heads`` are known, satisfy :func:`tp_divides`; ``[1]``
    at least. Ascending."""
    out = [t for t in range(1, max(1, cards // max(1, pp)) + 1)
           if not heads or tp_divides(t, heads, kv_heads or heads)]
    return out or [1]


def valid_pp_sizes(cards: int, tp: int = 1, layers: int | None = None) -> list[int]:
    """The pipeline parallel sizes that fit ``cards`` with tensor size ``tp`` (pass TP ×
    DP for data parallel replicas) and give every stage at least one of the model's
    ``layers`` (when known); ``[1]`` at least."""
    limit = layers or cards
    return [p for p in range(1, max(1, cards // max(1, tp)) + 1) if p <= limit] or [1]


def valid_dp_sizes(cards: int, tp: int = 1, pp: int = 1) -> list[int]:
    """The data parallel sizes (engine replicas of TP × PP cards each) that fit ``cards``:
    TP × PP × DP ≤ cards, vLLM's world size across data parallel ranks
    (``ParallelConfig.world_size_across_dp`` = world_size × data_parallel_size, world_size
    = PP × TP × PCP: vllm/config/parallel.py:623 and :945, vLLM 0.32.0) — the bound
    :func:`check_world_size` holds a plan to; ``[1]`` at least. Ascending."""
    return list(range(1, max(1, cards // max(1, tp * pp)) + 1))


def parallel_layouts(p: "Plan", more_cards_per_replica: bool = False) -> list[dict[str, Any]]:
    """Every other split of the selected cards: (tensor_parallel_size,
    pipeline_parallel_size, data_parallel_size) with TP × PP × DP ≤ the cards, TP
    satisfying :func:`tp_divides` and PP at most the model's layers. Each is a fix dict
    holding only the sizes that differ from the plan's (``{"tensor_parallel_size": 2}``).

    data_parallel_size varies only when the plan already runs data parallel replicas:
    more replicas means more engines, each with its own KV cache and share of the
    requests — a choice of deployment, not the repair of a layout; a single engine
    keeps DP 1. ``more_cards_per_replica``: only splits whose replica (TP × PP) spans
    more cards than now — the ones that give each card less of the model. Order: TP,
    then PP, then DP descending (:func:`app.planner.plan.plan` ranks the passing ones by
    predicted throughput)."""
    e, m, n = p.effective, p.model, len(p.gpus)
    dp_now = p.dp
    out: list[dict[str, Any]] = []
    for tp in range(n, 0, -1):
        if not tp_divides(tp, m.heads, m.kv_heads):
            continue
        for pp in range(n // tp, 0, -1):
            if pp > max(1, m.layers) or (more_cards_per_replica and tp * pp <= e.tp * e.pp):
                continue
            for dp in (range(n // (tp * pp), 0, -1) if dp_now > 1 else (1,)):
                if (tp, pp, dp) == (e.tp, e.pp, dp_now):
                    continue
                fix: dict[str, Any] = {}
                for key, new, now in (("tensor_parallel_size", tp, e.tp), ("pipeline_parallel_size", pp, e.pp),
                                      ("data_parallel_size", dp, dp_now)):
                    if new != now:
                        fix[key] = new
                out.append(fix)
    return out


# ---------------------------------------------------------------------- checks
def dp_rank_out_of_bounds(devices: int) -> str:
    """vLLM 0.32's message when a data parallel rank's worker is past the ``devices``
    visible cards (vllm/v1/worker/gpu_worker.py init_device, an AssertionError): the
    first such local rank is ``devices`` itself."""
    return f"DP adjusted local rank {devices} is out of bounds for {devices} devices."


def check_world_size(p: "Plan") -> Finding | None:
    """TP × PP × DP GPUs against the selected cards. vLLM's wordings: one replica
    larger than the cards — "World size (N) is larger than the number of available GPUs
    (M) in this node" (vllm/config/parallel.py, ParallelConfig, 0.10.2–0.33.0); a data
    parallel rank past the cards — "Error setting CUDA_VISIBLE_DEVICES: local range:
    [a, b)" (vllm/v1/engine/utils.py get_device_indices, 0.10.2 and 0.11.0); from 0.32
    the engine process no longer sets CUDA_VISIBLE_DEVICES on CUDA (the same file,
    CoreEngineProcManager: only platforms without device-index isolation, or Ray, go
    through get_physical_gpu_ids_for_local_dp_rank's "Error computing device indices for
    CUDA_VISIBLE_DEVICES"), and the worker's device check stops it: "DP adjusted local
    rank N is out of bounds for N devices." (vllm/v1/worker/gpu_worker.py init_device,
    0.32.0; assumed the same in 0.33.0). DP rank r takes devices r·(TP × PP) …
    (r+1)·(TP × PP) − 1; the first one past the N cards is N."""
    e, n, dp = p.effective, len(p.gpus), p.dp
    if e.world * dp <= n:
        return None
    layouts = parallel_layouts(p)
    if e.world > n:
        return Finding("not_enough_gpus", "error",
                       f"tensor_parallel_size × pipeline_parallel_size = {e.tp} × {e.pp} = {e.world} GPUs, "
                       f"but only {n} are selected: vLLM stops with \"World size ({e.world}) is larger than the "
                       f"number of available GPUs ({n})\".", layouts=layouts)
    r = n // e.world
    lo, hi = r * e.world, (r + 1) * e.world
    old = p.rules.entry in ("0.10", "0.11")
    said = (f"Error setting CUDA_VISIBLE_DEVICES: local range: [{lo}, {hi})" if old else
            dp_rank_out_of_bounds(n))
    return Finding("not_enough_gpus", "error",
                   f"data_parallel_size {dp} × (tensor_parallel_size × pipeline_parallel_size = {e.world}) = "
                   f"{dp * e.world} GPUs, but only {n} are selected: data parallel rank {r} would need GPUs "
                   f"{lo}–{hi - 1} and vLLM stops with \"{said}\".", layouts=layouts)


def check_tp_heads(p: "Plan") -> Finding | None:
    e, m = p.effective, p.model
    if tp_divides(e.tp, m.heads, m.kv_heads):
        return None
    return Finding("tp_not_divisor_of_heads", "error",
                   f"tensor_parallel_size {e.tp} does not divide the model's {m.heads} attention heads "
                   f"({m.kv_heads} KV heads): each card must hold whole heads.", layouts=parallel_layouts(p))


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


def _lowest_card(p: "Plan"):
    gpus = [g for g in p.cards if g.kind != "cpu"]
    return min(gpus, key=lambda g: g.capability) if gpus else None


def quantization_mismatch(p: "Plan") -> str | None:
    """vLLM's refusal when ``--quantization`` does not fit the checkpoint, else None.

    A checkpoint whose quantization_config names method A accepts A, the values
    :meth:`VllmRules.accepts_for_checkpoint` lists for A, and nothing else:
    "Quantization method specified in the model config (A) does not match the
    quantization method specified in the `quantization` argument (B)."
    (vllm/config/model.py ``ModelConfig._verify_quantization``; vllm/config.py in
    0.10.0). A checkpoint without quantization_config (its folder read) accepts the
    online methods, or a method whose own config file lies beside config.json; else
    "Cannot find the config file for B" (model_loader/weight_utils.py
    ``get_quant_config``). An unknown value is :func:`check_quantization_known`'s."""
    q, m = p.config.quantization, p.model
    if not q or q not in p.rules.quantization_methods:
        return None
    low = _lowest_card(p)
    cpu = any(g.kind == "cpu" for g in p.cards)
    if m.quant_method:
        cc = low.capability if low is not None else None
        if p.rules.accepts_for_checkpoint(m.quant_method, q, cc, cpu):
            return None
        return (f"Quantization method specified in the model config ({m.quant_method}) does not match the "
                f"quantization method specified in the `quantization` argument ({q}).")
    if m.checkpoint_files is None or p.rules.quantizes_online(q):
        return None
    if set(p.rules.config_files(q)) & set(m.checkpoint_files):
        return None
    return f"Cannot find the config file for {q}"


def check_quantization_matches_checkpoint(p: "Plan") -> Finding | None:
    """``--quantization`` against the checkpoint's own method (:func:`quantization_mismatch`).
    An error when the checkpoint's quantization_config was read, a warning when its
    method is only guessed from the repo id (the catalog). Fix: drop the option (vLLM
    then reads the checkpoint's method and picks its fastest kernel), else the
    checkpoint's own method."""
    refusal = quantization_mismatch(p)
    if refusal is None:
        return None
    q, m = p.config.quantization, p.model
    if not m.quant_method:
        return Finding("quantization_mismatch", "error",
                       f"--quantization {q} on a checkpoint without quantization_config: {q} needs a checkpoint "
                       f"quantized with {q}, and it is not one vLLM {p.rules.version} applies to a 16-bit "
                       f"checkpoint while loading (vLLM stops with \"{refusal}\"). Drop --quantization, or use a "
                       f"checkpoint quantized with {q}.", candidates=[{"quantization": None}])
    low = _lowest_card(p)
    why = ""
    if p.rules.accepts_for_checkpoint(m.quant_method, q) and low is not None:
        why = (f" ({q} runs {m.quant_method} checkpoints only where the Marlin kernels run: compute capability "
               f"{p.rules.marlin_min_capability / 10:.1f}; the {low.name} has {low.cc:.1f})")
    elif p.rules.accepts_for_checkpoint(m.quant_method, q):
        why = f" ({q} runs {m.quant_method} checkpoints only on a CUDA card)"
    guessed = " (guessed from the model's name)" if m.quant_source == "name" else ""
    return Finding("quantization_mismatch", "error" if m.quant_source == "config" else "warn",
                   f"--quantization {q} does not match the checkpoint's quantization_config, which names "
                   f"{m.quant_method}{guessed}{why}: vLLM {p.rules.version} stops with \"{refusal}\" Drop "
                   f"--quantization (vLLM reads the checkpoint's method) or give {m.quant_method}.",
                   candidates=[{"quantization": None}, {"quantization": m.quant_method}])


def quantization_capability_needs(p: "Plan", capability: int) -> list[tuple[str, int, bool, str | None]]:
    """What the effective quantization needs of a card of ``capability`` (×10):
    ``(what, minimum ×10, exact, fallback)`` for the method (its config's
    get_min_capability()) and, when the checkpoint's own compressed-tensors config is
    used, for each scheme of its config groups after vLLM's fallbacks below a scheme's
    minimum (W8A8-FP8 → W8A16-FP8, …): ``fallback`` names the scheme given up."""
    q, m = p.effective.quantization, p.model
    out: list[tuple[str, int, bool, str | None]] = []
    if not q:
        return out
    need = p.rules.min_capability(q)
    if need is not None:
        out.append((q, need, False, None))
    if q == m.quant_method and q == "compressed-tensors":
        for scheme in m.quant_schemes:
            rule, given_up = p.rules.scheme_rule(scheme), None
            while rule and rule.get("fallback") and capability < int(rule["min"]):
                given_up, scheme = scheme, rule["fallback"]
                rule = p.rules.scheme_rule(scheme)
            if rule:
                out.append((f"compressed-tensors scheme {scheme}", int(rule["min"]), bool(rule.get("exact")),
                            given_up))
    return out


def check_quantization_capability(p: "Plan") -> Finding | None:
    """The lowest card against :func:`quantization_capability_needs`. vLLM's wordings:
    "The quantization method X is not supported for the current GPU. Minimum
    capability: N. Current capability: M." (VllmConfig._get_quantization_config) and,
    per compressed-tensors scheme, "Quantization scheme is not supported for the current
    GPU. Min capability: N. …" or, for a scheme of one exact capability, "… Required
    capability: N. …" (CompressedTensorsConfig._check_scheme_supported). Not checked
    when the option does not even match the checkpoint (:func:`quantization_mismatch`)."""
    low = _lowest_card(p)
    if low is None or not p.effective.quantization or quantization_mismatch(p):
        return None
    cc = low.capability
    for what, need, exact, _ in quantization_capability_needs(p, cc):
        if exact and cc != need:
            text = (f"{what} runs only on compute capability {need / 10:.1f}; the {low.name} has {low.cc:.1f} "
                    f"(vLLM {p.rules.version}: \"No compressed-tensors compatible scheme was found\")")
        elif cc < need:
            said = (f"The quantization method {what} is not supported for the current GPU. Minimum capability: "
                    f"{need}. Current capability: {cc}." if " scheme " not in what else
                    f"Quantization scheme is not supported for the current GPU. Min capability: {need}. "
                    f"Current capability: {cc}.")
            text = (f"{what} needs compute capability {need / 10:.1f} or higher; the {low.name} has "
                    f"{low.cc:.1f} (vLLM {p.rules.version}: \"{said}\")")
        else:
            continue
        online = bool(p.config.quantization) and not p.model.quant_method
        return Finding("quantization_unsupported_by_gpu", "error",
                       text + (": drop --quantization (the checkpoint is 16-bit) or use a newer card." if online else
                               ": use a checkpoint in a format this card runs (GPTQ from 6.0, AWQ from 7.5) or a "
                               "newer card."),
                       candidates=[{"quantization": None}] if p.config.quantization else [])
    return None


def check_quantization_fallback(p: "Plan") -> Finding | None:
    """Information, not a problem: on the lowest card vLLM runs the quantization on a
    slower path — FP8 weight-only through the Marlin kernel below the method's fast
    path (8.9; "Your GPU does not have native support for FP8 computation but FP8
    quantization is being used. Weight-only FP8 compression will be used leveraging the
    Marlin kernel.", layers/quantization/utils/marlin_utils_fp8.py), or a
    compressed-tensors scheme's fallback (W8A8-FP8 → W8A16-FP8, W4A4-NVFP4 →
    W4A16-NVFP4; compressed_tensors.py ``_get_scheme_from_parts``)."""
    low = _lowest_card(p)
    q = p.effective.quantization
    if low is None or not q or quantization_mismatch(p):
        return None
    cc = low.capability
    need = p.rules.min_capability(q)
    fast = p.rules.fast_path_capability(q)
    if fast is not None and (need is None or cc >= need) and cc < fast:
        return Finding("quantization_weight_only_fallback", "info",
                       f"the {low.name} (compute capability {low.cc:.1f}) has no FP8 compute (from {fast / 10:.1f}): "
                       f"vLLM runs {q} weight-only through the Marlin kernel and says so (\"Your GPU does not have "
                       f"native support for FP8 computation\"); prefill-heavy steps are slower.")
    for what, need_s, exact, given_up in quantization_capability_needs(p, cc):
        if given_up and cc >= need_s:
            return Finding("quantization_weight_only_fallback", "info",
                           f"the {low.name} (compute capability {low.cc:.1f}) is below the {given_up} scheme's "
                           f"minimum: vLLM runs the checkpoint as {what.split()[-1]} instead (weights quantized, "
                           f"activations in 16 bits); prefill-heavy steps are slower.")
    return None


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


def check_active_seqs(p: "Plan") -> Finding | None:
    """``--max-num-active-seqs`` above the effective ``max_num_seqs`` (its version's default
    when unset): vLLM refuses it at start-up (vllm/config/scheduler.py:335–342 @ 0.32.0)."""
    a, e = p.config.max_num_active_seqs, p.effective
    if a is None or a <= e.max_num_seqs:
        return None
    return Finding("active_seqs_above_num_seqs", "error",
                   f"max_num_active_seqs {a} is larger than max_num_seqs {e.max_num_seqs}; vLLM admits at most "
                   f"max_num_seqs requests into RUNNING and refuses the combination.",
                   candidates=[{"max_num_active_seqs": e.max_num_seqs}, {"max_num_seqs": a}])


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
                   candidates=_util_up(p), layouts=parallel_layouts(p, more_cards_per_replica=True))


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
                   f"spread the model over more cards.", candidates=_util_up(p),
                   layouts=parallel_layouts(p, more_cards_per_replica=True))


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
    """vLLM's check before it allocates the KV cache (vllm/v1/core/kv_cache_utils.py
    ``_check_enough_kv_cache_memory`` :1003 @ 0.32.0): one request of max_model_len — in
    every KV cache group, a sliding window or chunk holding only its window
    (app.engine.kvcache) — must fit each worker's KV memory less the null block; the fix
    is vLLM's own "estimated maximum model length" (:meth:`Plan.fitting_model_len`)."""
    e = p.effective
    if p.kv_blocks <= 0 or p.context_fits():
        return None
    fit = p.fitting_model_len()
    lay = p.kv_layout
    # never offer more than the model supports (that is its own error)
    cands: list[dict[str, Any]] = [{"max_model_len": min(fit, p.model.max_position)}] if fit > 0 else []
    if fit * 2 >= e.max_model_len and e.kv_dtype_bytes > 1:
        cands.append({"kv_cache_dtype": "fp8"})
    groups = "" if lay.uniform else f" ({lay.describe()}: a window holds only its window)"
    return Finding("context_exceeds_kv_cache", "error",
                   f"one request of max_model_len {e.max_model_len:,} tokens needs {p.context_kv_gib():.2f} GiB of KV "
                   f"cache{groups}; only {fit:,} tokens fit (the smallest stage decides; vLLM: \"To serve at "
                   f"least one request with the model's max seq len … Based on the available memory, the estimated "
                   f"maximum model length is {fit}\").", candidates=cands)


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


#: NCCL_P2P_LEVEL values past NCCL's default cut-off (PXB: P2P only below a shared PCIe
#: switch): the path types after PXB in topoPathTypeStr (NCCL 2.27/2.28 src/graph/topo.cc;
#: compared case-sensitively, as ncclGetLevel's strcmp does) and 3–5 in the old
#: numbering (levelsOldToNew: 3 → PHB, 4 and 5 → SYS; src/graph/paths.cc).
NCCL_LEVELS_PAST_SWITCH = ("P2C", "PXN", "PHB", "SYS", "NET")


def _env_int(env: dict[str, str], name: str) -> int | None:
    try:
        return int(str(env.get(name, "")).strip(), 0)
    except ValueError:
        return None


def nccl_p2p_forced(env: dict[str, str]) -> str | None:
    """``NAME=value`` of the variable that makes NCCL use P2P further than its default,
    or None. NCCL (src/graph/paths.cc ncclGetLevel, 2.21–2.28) reads ``NCCL_P2P_DISABLE``
    first (1 → never P2P, which wins), then ``NCCL_P2P_LEVEL`` (a path type or an old
    number); ``NCCL_P2P_DISABLE=0`` is the same as unset."""
    if _env_int(env, "NCCL_P2P_DISABLE") == 1:
        return None
    level = str(env.get("NCCL_P2P_LEVEL", "")).strip()
    if level in NCCL_LEVELS_PAST_SWITCH or (level[:1].isdigit() and (_env_int(env, "NCCL_P2P_LEVEL") or 0) >= 3):
        return f"NCCL_P2P_LEVEL={level}"
    return None


def nccl_p2p_disabled(env: dict[str, str]) -> bool:
    """Whether the server's environment keeps NCCL off P2P between any two cards:
    ``NCCL_P2P_DISABLE=1``, or ``NCCL_P2P_LEVEL=LOC`` (its old number 0) — "never use P2P"
    (NCCL src/graph/paths.cc ncclGetLevel, 2.21–2.28, the order of :func:`nccl_p2p_forced`).
    The all-reduce then goes through host memory (the SHM transport)."""
    if _env_int(env, "NCCL_P2P_DISABLE") == 1:
        return True
    level = str(env.get("NCCL_P2P_LEVEL", "")).strip()
    return level == "LOC" or (level.isdigit() and int(level) == 0)


def custom_all_reduce_state(p: "Plan") -> tuple[bool, str]:
    """(whether vLLM's custom all-reduce runs for the TP group, why not: the line vLLM
    logs). vLLM's order (vllm/distributed/device_communicators/custom_all_reduce.py,
    CustomAllreduce.__init__, the same in 0.10.2, 0.11.0, 0.32.0 and 0.33.0): world size
    not in [2, 4, 6, 8] → "Custom allreduce is disabled due to an unsupported world size";
    more than two cards not all NVLink-connected (``is_fully_connected``) → "… not
    supported on more than two PCIe-only GPUs"; no P2P (``_can_p2p``: the driver's
    ``can_device_access_peer`` with the default VLLM_SKIP_P2P_CHECK=1) → "… your
    platform lacks GPU P2P capability or P2P test failed". NVLink between all cards is
    taken from the catalog: ≥ 300 GB/s (SXM boards; a bridge joins only a pair)."""
    tp = p.effective.tp
    group = p.cards[:tp]
    if tp <= 1:
        return False, "one card per stage: no all-reduce"
    if p.config.disable_custom_all_reduce:
        return False, "turned off by --disable-custom-all-reduce"
    if tp not in (2, 4, 6, 8):
        return False, f"Custom allreduce is disabled due to an unsupported world size: {tp}"
    if tp > 2 and not all(g.nvlink_gbs >= 300 and g.p2p for g in group):
        return False, "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"
    if not all(g.p2p for g in group):
        return False, "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test failed"
    return True, "on"


def check_p2p(p: "Plan") -> Finding | None:
    """Peer-to-peer between the cards of one replica (TP × PP).

    - Cards without P2P (GeForce): **info**. NCCL uses P2P only where NVML reports it
      (src/graph/paths.cc ncclTopoCheckP2p: status read and write OK, unless
      NCCL_IGNORE_DISABLED_P2P=2) and CUDA allows peer access (src/transport/p2p.cc
      p2pCanConnect: cudaDeviceCanAccessPeer; NCCL 2.21–2.28), else it goes through
      host memory; vLLM turns its custom all-reduce off itself
      (:func:`custom_all_reduce_state`). No variable forces P2P past CUDA's answer.
    - Cards with P2P over PCIe on a host whose IOMMU/ACS redirects P2P to the root
      complex (``p.host``, :class:`app.planner.pcie.HostPcie`): **warn**
      ``p2p_hang_risk`` (NCCL's troubleshooting guide, "PCI Access Control Services"),
      fix NCCL_P2P_DISABLE=1 and, where vLLM would run it, --disable-custom-all-reduce.
    - The same with NCCL_P2P_LEVEL forcing P2P past NCCL's default cut-off
      (:func:`nccl_p2p_forced`): **error** ``p2p_forced``.
    A hang seen in a log is the diagnosis's ``nccl_hang`` (app.planner.diagnose)."""
    e = p.effective
    group = p.cards[:e.world]
    if e.world <= 1 or any(g.kind == "cpu" for g in group):
        return None
    env = p.config.env
    nccl_off = _env_int(env, "NCCL_P2P_DISABLE") == 1
    car_on, car_why = custom_all_reduce_state(p)
    if not all(g.p2p for g in group):
        g = next(g for g in group if not g.p2p)
        text = (f"{g.name} cards have no peer-to-peer (P2P) access. NCCL finds that out itself (it uses P2P only "
                f"where NVML and CUDA report it) and passes data through host memory instead")
        if e.tp > 1 and not p.config.disable_custom_all_reduce:
            text += (f"; vLLM turns its custom all-reduce off on its own and logs \"{car_why}\" "
                     f"(--disable-custom-all-reduce only silences that line)")
        text += ". NCCL_P2P_DISABLE=1 changes nothing on these cards." if nccl_off else \
            (". Nothing needs setting; should a launch still stop after \"vLLM is using nccl\", the log diagnosis "
             "(nccl_hang) gives the fix.")
        tries = [v for v in (nccl_p2p_forced(env),
                             "NCCL_IGNORE_DISABLED_P2P=2" if _env_int(env, "NCCL_IGNORE_DISABLED_P2P") == 2 else None) if v]
        if tries:
            text += (f" {' and '.join(tries)} cannot turn P2P on here: NCCL still asks CUDA for peer access, "
                     f"and the driver refuses it on these cards.")
        return Finding("no_p2p", "info", text)
    if p.host is None or not p.host.redirects_p2p or all(g.nvlink_gbs >= 300 for g in group):
        return None
    forced = nccl_p2p_forced(env)
    fix: dict[str, Any] = {}
    if not nccl_off:
        fix["env"] = {"NCCL_P2P_DISABLE": "1", **({"NCCL_P2P_LEVEL": None} if forced else {})}
    if car_on:
        fix["disable_custom_all_reduce"] = True
    if not fix:
        return None
    g = group[0]
    risk = (f"the host has {p.host.describe()}: P2P between the {g.name} cards over PCIe goes up to the CPU's root "
            f"complex, where NCCL's troubleshooting guide warns of \"a significant performance reduction or even "
            f"a hang\"")
    if car_on:
        risk += " (vLLM's custom all-reduce uses P2P between two cards)"
    if forced:
        return Finding("p2p_forced", "error",
                       f"{forced} makes NCCL use P2P through the CPU's root complex (its default stops below a "
                       f"shared PCIe switch), and {risk}. Drop it and turn P2P off.", candidates=[fix])
    return Finding("p2p_hang_risk", "warn",
                   f"{risk[0].upper()}{risk[1:]}. Turn P2P off here, or turn the IOMMU off (BIOS, or "
                   f"amd_iommu=off / intel_iommu=off on the kernel command line).", candidates=[fix])


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


def check_speculative_draft(p: "Plan") -> Finding | None:
    """The ``--speculative-config`` draft model whose config.json the planner cannot read
    (a Hub id not in the local cache): its weights and KV cache are not counted, so the
    memory plan is too generous by the draft's size (app.planner.plan.draft_of)."""
    d = p.draft
    if d is None or d.method != "draft_model" or d.arch is not None:
        return None
    name = (p.config.speculative_config or {}).get("model")
    return Finding("speculative_draft_unknown", "warn",
                   f"speculative_config: the draft model {name!r} has no config.json here (not a directory, not in "
                   "the Hugging Face cache, not in the catalog), so its weights and KV cache are not counted in this "
                   "plan: download it (hf download …) or give its directory as \"model\".")


def check_cpu_speculative(p: "Plan") -> Finding | None:
    """The CPU build with a ``--speculative-config``: vLLM 0.32 serves it (ngram measured,
    docs/vllm-facts.md) but on x86 warns "Speculative decoding on CPU without Intel OpenMP
    in LD_PRELOAD will cause significant performance loss" when no ``libiomp`` is preloaded
    (vllm/v1/worker/cpu_worker.py, ``check_preloaded_libs("libiomp")``). Information only:
    the run is valid, the figures lower."""
    if p.draft is None or not any(g.kind == "cpu" for g in p.cards):
        return None
    if "libiomp" in p.config.env.get("LD_PRELOAD", ""):
        return None
    return Finding("cpu_speculative_without_iomp", "info",
                   "The CPU build serves speculative decoding, but on x86 without Intel OpenMP preloaded vLLM warns of "
                   "\"significant performance loss\": preload libiomp5.so (LD_PRELOAD, from the intel-openmp "
                   "package) for figures like a tuned CPU server's.")


def check_chunked_prefill_batch(p: "Plan") -> Finding | None:
    """Chunked prefill off (``--no-enable-chunked-prefill`` through ``--extra``) with a
    ``max_num_batched_tokens`` below ``max_model_len``: vLLM refuses it
    (vllm/config/scheduler.py SchedulerConfig.verify_max_model_len, 0.32.0: "max_num_batched_tokens
    (B) is smaller than max_model_len (L). This effectively limits the maximum sequence
    length to max_num_batched_tokens and makes vLLM reject longer sequences."). Only an
    explicit ``max_num_batched_tokens``: unset, vLLM sizes it to the length itself."""
    try:
        extra = extra_args_to_dict(p.config.extra_args)
    except ValueError:
        return None
    if extra.get("enable-chunked-prefill", True) is not False or p.config.max_num_batched_tokens is None:
        return None
    b, length = p.config.max_num_batched_tokens, p.effective.max_model_len
    if b >= length:
        return None
    return Finding("batched_tokens_below_max_model_len", "error",
                   f"with chunked prefill off every prompt is prefilled in one step, and max_num_batched_tokens {b:,} "
                   f"is smaller than max_model_len {length:,}: vLLM {p.rules.version} stops with "
                   f"\"max_num_batched_tokens ({b}) is smaller than max_model_len ({length})\". Raise "
                   f"max_num_batched_tokens to {length:,}, lower max_model_len to {b:,}, or leave chunked prefill on.",
                   candidates=[{"max_num_batched_tokens": length}, {"max_model_len": b}])


#: KV cache dtypes stored as FP8 E4M3, which Triton (vLLM's attention kernels on cards without FlashAttention 3)
#: compiles only from compute capability 8.9: triton/backends/nvidia/compiler.py (3.9.0) adds "fp8e4nv" to
#: supported_fp8_dtypes only for capability >= 89, and triton/language/core.py raises "type fp8e4nv not
#: supported in this architecture. The supported fp8 dtypes are ('fp8e4b15', 'fp8e5')"; E5M2 (fp8e5) compiles on
#: every card. The CPU build's attention takes fp8, fp8_e4m3 and fp8_e5m2 (vllm/v1/attention/backends/cpu_attn.py
#: CPUAttentionBackend.supported_kv_cache_dtypes, 0.32.0).
FP8_E4M3_KV = ("fp8", "fp8_e4m3")
FP8_E4M3_MIN_CC = 89


def check_kv_dtype_capability(p: "Plan") -> Finding | None:
    """An FP8 E4M3 KV cache (:data:`FP8_E4M3_KV`) on a card below compute capability 8.9:
    the attention kernel does not compile; fp8_e5m2 halves the KV cache the same way."""
    if p.config.kv_cache_dtype not in FP8_E4M3_KV:
        return None
    low = _lowest_card(p)
    if low is None or low.capability >= FP8_E4M3_MIN_CC:
        return None
    return Finding("kv_cache_dtype_unsupported_by_gpu", "error",
                   f"--kv-cache-dtype {p.config.kv_cache_dtype} stores the KV cache as FP8 E4M3, which the attention "
                   f"kernels (Triton) compile only from compute capability 8.9; the {low.name} has {low.cc:.1f}: "
                   f"the launch stops with \"type fp8e4nv not supported in this architecture\". Use "
                   f"--kv-cache-dtype fp8_e5m2 (also 1 byte per value) or auto.",
                   candidates=[{"kv_cache_dtype": "fp8_e5m2"}, {"kv_cache_dtype": None}])


#: options passed through ``--extra`` that a check reads (the rest are named as not modelled)
MODELLED_EXTRA = {"enable-chunked-prefill", "enable-lora", "max-loras", "max-lora-rank", "lora-dtype",
                  "fully-sharded-loras"}
#: options that change neither memory nor speed (not worth a note)
NEUTRAL_EXTRA = {"seed", "served-model-name", "disable-log-requests", "disable-log-stats", "uvicorn-log-level",
                 "api-key", "trust-remote-code", "revision", "tokenizer", "download-dir", "chat-template",
                 "enable-log-requests", "load-format", "config-format", "tokenizer-mode", "hf-token",
                 "code-revision", "tokenizer-revision", "allowed-origins", "root-path", "ssl-keyfile",
                 "ssl-certfile", "response-role", "tool-call-parser", "enable-auto-tool-choice", "reasoning-parser",
                 "max-cpu-loras", "lora-modules"}


def check_unmodelled_options(p: "Plan") -> Finding | None:
    """Information: the ``--extra`` options the plan does not model are named, so that a
    plan that fits is not read as covering them (LoRA adapters, swap space, offloading
    take memory that is not in these figures)."""
    try:
        extra = extra_args_to_dict(p.config.extra_args)
    except ValueError:
        return None
    names = [k for k in extra if k not in MODELLED_EXTRA and k not in NEUTRAL_EXTRA
             and k not in p.rules.removed_options]
    if not names:
        return None
    shown = ", ".join(f"--{k}" if extra[k] is True else f"--no-{k}" if extra[k] is False else f"--{k} {extra[k]}"
                      for k in names)
    return Finding("options_not_modelled", "info",
                   f"not modelled: {shown} — {'its' if len(names) == 1 else 'their'} memory and speed are not in "
                   f"these figures.")


def check_lora(p: "Plan") -> Finding | None:
    """Information with ``--enable-lora``: the adapter buffers each GPU holds (counted in the
    weights, :func:`app.planner.memory.lora_gib`), and what is not modelled — the LoRA
    kernels' time in the predicted speed, and on a MoE model the experts' adapters."""
    e = p.effective
    if e.lora_slots <= 0:
        return None
    gib = max((r.lora_gib for r in p.ranks), default=0.0)
    moe = (" LoRA on the MoE experts is not counted either (its buffers grow with the experts: plan with "
           "--max-loras as small as you can)." if p.model.is_moe else "")
    return Finding("lora_memory", "info",
                   f"LoRA: {e.lora_slots} adapter slot{'s' if e.lora_slots != 1 else ''} of rank ≤ {e.lora_rank} "
                   f"take {gib:.2f} GiB on each GPU (in 'weights'; --max-loras and --max-lora-rank size them); the "
                   f"adapters' kernels are not in the predicted speed.{moe}")


#: all checks in the order problems are reported (errors before warnings in the result)
def check_tp_spans_hosts(p: "Plan") -> Finding | None:
    """A tensor-parallel group larger than a host's cards (``p.rig``) all-reduces twice a
    layer over the inter-host link (app.engine.steptime). vLLM's "Distributed Inference
    and Serving" guide (docs.vllm.ai, v0.5.5 on: "The tensor parallel size should be the
    number of GPUs in each node, and the pipeline parallel size is the number of nodes")
    — the fix: TP = cards per host, the rest in the pipeline."""
    r = p.rig
    tp, pp = p.effective.tp, p.effective.pp
    if r is None or not r.multi_host or tp <= r.cards_per_host:
        return None
    new_tp = r.cards_per_host
    new_pp = tp * pp // new_tp if (tp * pp) % new_tp == 0 else None
    fix = {"tensor_parallel_size": new_tp, "pipeline_parallel_size": new_pp} if new_pp else None
    link = r.link.title if r.link is not None else "the network"
    return Finding("tp_spans_hosts", "warn",
                   f"tensor_parallel_size {tp} spans {math.ceil(tp / r.cards_per_host)} hosts of "
                   f"{r.cards_per_host} card(s): every layer all-reduces twice over {link}; keep TP within a host "
                   f"and put the hosts in the pipeline (vLLM's multi-node advice): "
                   + (f"--tensor-parallel-size {new_tp} --pipeline-parallel-size {new_pp}" if new_pp else
                      f"--tensor-parallel-size {new_tp} with the pipeline across hosts"),
                   candidates=[fix] if fix else [])


CHECKS: list[Callable[["Plan"], Finding | None]] = [
    check_world_size, check_tp_heads, check_pp_partition, check_quantization_known,
    check_quantization_matches_checkpoint, check_quantization_capability, check_quantization_fallback,
    check_dtype_capability, check_dtype_quantization, check_removed_options, check_batched_tokens,
    check_active_seqs, check_max_model_len, check_free_vram, check_node_memory, check_weights_fit, check_kv_memory,
    check_context_fits, check_workload_len, check_graph_headroom,
    check_sampler, check_p2p, check_cpu_executor, check_speculative_draft, check_cpu_speculative,
    check_tp_spans_hosts, check_chunked_prefill_batch, check_kv_dtype_capability, check_unmodelled_options,
    check_lora,
]
