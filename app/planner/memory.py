"""Per-GPU memory plan: what vLLM (V1) will put on each card before the first request.

Source: docs/perf-model.md "KV cache": budget = total · gpu_memory_utilization; KV
memory = budget − weights − activation peak − non-torch memory; CUDA graphs come out
of the (1 − utilization) headroom; KV cache tokens = whole blocks of ``block_size``
tokens; vLLM's logged "Maximum concurrency" = blocks / ceil(max_model_len / block).
Each pipeline stage is planned on its own cards; vLLM then uses the smallest block
count of all workers. The CPU build: its KV space is ``VLLM_CPU_KVCACHE_SPACE`` GiB when
set (and, in 0.10/0.11, 4 GiB when unset); from 0.32 without it the worker's whole budget
is ``gpu_memory_utilization`` × the NUMA node's memory and the KV cache what is left of it
after the process's own memory (data/vllm_versions.yaml ``cpu_memory``). A KV memory that
would be negative is 0 (the checks name what overspends the budget).

Speculative decoding (:class:`Draft`): the drafter's weights are loaded inside the
target's ``load_model`` (vllm/v1/worker/gpu_model_runner.py, 0.32: "Loading drafter
model..." before "Model loading took …"), so they count in the weights; its attention
layers are in the same static forward context, so ``get_kv_cache_spec`` gives them KV
like the target's layers and every KV token holds both (fewer tokens for the same
memory); vLLM's CPU model runner does the same ("EAGLE drafter KV cache initialized for
CPU backend", vllm/v1/worker/cpu_model_runner.py). The drafter runs after the last
pipeline stage, on its cards.
All sizes in GiB (2^30 B) unless the name says bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from app.engine.kvcache import KvCacheLayout, kv_cache_groups
from app.planner.gpus import GIB, GpuSpec
from app.planner.models import DTYPE_BYTES, ModelArch

#: Assumed figures (GiB), to be compared with real logs (app.planner.accuracy):
NON_TORCH_GIB = 0.6          # CUDA context, cuBLAS workspace — one card
NON_TORCH_PARALLEL_GIB = 0.3  # + NCCL buffers when TP·PP > 1
GRAPHS_BASE_GIB = 0.2        # CUDA graphs: base + per layer on the card
GRAPHS_PER_LAYER_GIB = 0.005
SAMPLER_COPIES = 3           # fp32 logits, probabilities, sort/top-k buffers
CPU_DEFAULT_KV_GIB = 4.0     # VLLM_CPU_KVCACHE_SPACE when unset, 0.10/0.11 (vllm/platforms/cpu.py:
                             # "… is not set, using 4 by default")
#: the CPU build's server beyond its weights and KV cache (Python, torch, vLLM): measured on vLLM
#: 0.32.0 CPU with the tiny model and the in-process executor, the API server's RSS 0.6 GiB and the
#: engine core's 1.67 GiB with its 1 GiB KV cache; in a published log of Qwen2.5-1.5B (2.88 GiB of
#: weights) vLLM's worker had 3.99 GiB of RSS after warm-up ("requested memory for kv (-0.39/3.6
#: GiB)"), 1.1 GiB beyond the weights. Assumed 1.5 GiB, a little on the safe side of both.
CPU_RUNTIME_GIB = 1.5


@dataclass
class Effective:
    """The values vLLM will really use (options as given, else version defaults).
    Tokens for lengths and batch sizes; ``utilization`` a fraction of total memory."""

    tp: int
    pp: int
    quantization: str | None
    dtype: str
    dtype_bytes: int
    kv_dtype_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    utilization: float
    enforce_eager: bool
    block_size: int
    pp_partition: list[int]
    cpu_kv_space_gib: float | None = None
    cpu_utilization_budget: bool = False
    #: LoRA (``--enable-lora``): adapter slots on the GPU (``--max-loras``; 0: LoRA off), their
    #: rank (``--max-lora-rank``), bytes per element (``--lora-dtype``, auto: the model's) and
    #: ``--fully-sharded-loras`` (:func:`lora_gib`)
    lora_slots: int = 0
    lora_rank: int = 16
    lora_dtype_bytes: int = 2
    lora_fully_sharded: bool = False
    #: KV cache groups (app.engine.kvcache): tokens scheduled but not yet settled, which a
    #: sliding/chunked layer keeps beside its window (``VllmConfig.max_in_flight_tokens``,
    #: vllm/config/vllm.py:590 @ 0.32.0: max_concurrent_batches × max_num_batched_tokens; 0:
    #: max_num_batched_tokens), whether the hybrid KV cache manager is on, prefix caching (a
    #: mamba state's blocks) and draft tokens per step
    max_in_flight_tokens: int = 0
    hybrid_kv: bool = True
    prefix_caching: bool = True
    spec_tokens: int = 0
    #: the V0 engine without chunked prefill: steps of whole prompts only, before any decode
    #: (app.engine.scheduler, ``prefill_first``)
    prefill_first: bool = False

    @property
    def cpu_budget_from_utilization(self) -> bool:
        """The CPU build sizes its memory from ``gpu_memory_utilization`` (a version that
        does, and no ``VLLM_CPU_KVCACHE_SPACE``); else its KV cache is the KV space."""
        return self.cpu_utilization_budget and self.cpu_kv_space_gib is None

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def in_flight_tokens(self) -> int:
        """``max_in_flight_tokens``, or ``max_num_batched_tokens`` when not set (one batch)."""
        return self.max_in_flight_tokens or self.max_num_batched_tokens


@dataclass(frozen=True)
class Draft:
    """The speculative-decoding drafter as the planner counts it (``--speculative-config``):
    ``method`` as vLLM resolves it, ``k`` draft tokens per step; ``arch`` the draft's
    shape when it is a transformer of its own (a draft model, an EAGLE head, the MTP
    layer), None for ngram/suffix (nothing on the card) and Medusa/MLP heads (no KV);
    ``weight_bytes`` all its weights (not split by TP); ``kv`` whether its layers hold KV;
    ``passes``: forward passes per decode step (k for a draft model or EAGLE head, 1 for
    Medusa, 0 for ngram); ``note`` where the figures come from."""

    method: str
    k: int
    arch: ModelArch | None = None
    weight_bytes: float = 0.0
    kv: bool = False
    passes: int = 0
    note: str = ""

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int) -> int:
        """The draft layers' KV bytes per token on one card of the TP group (0 without)."""
        if not self.kv or self.arch is None:
            return 0
        return self.arch.kv_bytes_per_token(kv_dtype_bytes, tp)


@dataclass
class RankMemory:
    """One worker (one card): where its memory goes. GiB except ``kv_bytes_per_token``."""

    rank: int
    gpu: GpuSpec
    stage: int
    layers: range
    total_gib: float
    budget_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    kv_gib: float
    kv_bytes_per_token: int
    kv_tokens: int
    cuda_graphs_gib: float
    sampler_gib: float
    #: the speculative drafter's share of ``weights_gib`` and its KV bytes per token
    #: (beside ``kv_bytes_per_token``, the target's; ``kv_tokens`` counts both)
    draft_weights_gib: float = 0.0
    #: the LoRA buffers' share of ``weights_gib`` (:func:`lora_gib`)
    lora_gib: float = 0.0
    draft_kv_bytes_per_token: int = 0
    #: blocks in this worker's KV pool (app.engine.kvcache: one block of every layer of the widest
    #: KV cache group); ``kv_tokens`` is vLLM's "KV cache size" of them
    kv_blocks: int = 0

    @property
    def headroom_gib(self) -> float:
        """Memory above the budget (1 − utilization), which CUDA graphs and the sampler
        warm-up use."""
        return self.total_gib - self.budget_gib


def pp_partition(layers: int, pp: int, env_value: str | None = None) -> list[int]:
    """Layers per pipeline stage: ``VLLM_PP_LAYER_PARTITION`` ("16,32") if given, else
    vLLM's even split (extra layers go to the stages before the last, from the end).
    Raises ValueError naming the variable when the partition does not add up."""
    if env_value:
        parts = [int(x) for x in env_value.split(",") if x.strip()]
        if len(parts) != pp or sum(parts) != layers or min(parts) < 1:
            raise ValueError(
                f"VLLM_PP_LAYER_PARTITION={env_value!r} must list {pp} positive layer counts that add "
                f"up to the model's {layers} layers"
            )
        return parts
    base = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        base[-i] += 1
    return base


def activation_gib(model: ModelArch, eff: Effective, layers_on_rank: int, last_stage: bool) -> float:
    """Peak activation of vLLM's profiling forward (``max_num_batched_tokens`` dummy
    tokens) on one rank, GiB: hidden states and residuals (≈4·H), the q/k/v projection,
    the MLP's gate/up and down intermediates (MoE: fused-expert caches for the top-k
    experts), 2 bytes each; plus, on the last stage, the dummy sampler's fp32 logits and
    probabilities for ``max_num_seqs`` rows. Assumed shape, calibrate against logs."""
    if layers_on_rank == 0:
        return 0.0
    n = eff.max_num_batched_tokens
    tp = eff.tp
    qkv = (model.heads + 2 * model.kv_heads) * model.head_dim / tp
    if model.is_moe:
        mlp = 3 * model.moe_intermediate * model.experts_per_tok / tp + 3 * model.shared_intermediate / tp
    else:
        mlp = 3 * model.intermediate / tp
    per_tok = 2 * (4 * model.hidden + qkv + mlp)
    act = n * per_tok
    if last_stage:
        act += eff.max_num_seqs * model.vocab * 4 * 2
    return act / GIB


#: vLLM's LoRA defaults (vllm/config/lora.py, 0.32.0: ``max_loras`` 1, ``max_lora_rank`` 16)
LORA_DEFAULT_SLOTS, LORA_DEFAULT_RANK = 1, 16


def lora_gib(model: ModelArch, eff: Effective, layers_on_rank: int) -> float:
    """The LoRA buffers one rank allocates while it loads the model (so in vLLM's "Model
    loading took" figure), GiB: for every linear layer of a decoder layer, per slice,
    ``lora_a_stacked`` (max_loras × 1 × a_out × input) and ``lora_b_stacked`` (max_loras ×
    1 × output × rank) in the LoRA dtype — vllm/lora/layers/base_linear.py
    ``create_lora_weights``, 0.32.0: a column-parallel layer (qkv_proj: q, k, v slices;
    gate_up_proj: gate, up) has a = rank (rank ÷ TP fully sharded), its full input and its
    output ÷ TP; a row-parallel one (o_proj, down_proj) has a = rank, its input ÷ TP and its
    full output (÷ TP fully sharded). Every linear layer is a LoRA target by default
    (vllm/lora/utils.py ``get_supported_lora_modules``). Not counted: MoE experts'
    LoRA (the plan names it as not modelled) and the embedding/LM-head adapters of
    models that declare them. 0 without LoRA."""
    if eff.lora_slots <= 0 or layers_on_rank == 0:
        return 0.0
    tp, r, H = eff.tp, eff.lora_rank, model.hidden
    r_col = r / tp if eff.lora_fully_sharded else r
    q_out = model.heads * model.head_dim / tp
    kv_out = max(1, model.kv_heads // tp) * model.head_dim  # fewer KV heads than ranks: one replicated each
    o_in = model.heads * model.head_dim / tp
    inter = (model.shared_intermediate if model.is_moe else model.intermediate) / tp
    # column-parallel: A (a × input) + B (output ÷ TP × rank) per slice
    qkv = 3 * r_col * H + (q_out + 2 * kv_out) * r
    gate_up = (2 * r_col * H + 2 * inter * r) if inter > 0 else 0.0
    # row-parallel: A (rank × input ÷ TP) + B (output × rank; ÷ TP fully sharded)
    b_out = H / tp if eff.lora_fully_sharded else H
    o = r * o_in + b_out * r
    down = (r * inter + b_out * r) if inter > 0 else 0.0
    per_layer = qkv + gate_up + o + down
    return eff.lora_slots * per_layer * layers_on_rank * eff.lora_dtype_bytes / GIB


def cuda_graphs_gib(eff: Effective, layers_on_rank: int) -> float:
    """CUDA graph memory (GiB): 0 with ``enforce_eager``, else a base plus a per-layer
    part (docs/perf-model.md: 0.1–1+ GiB). Assumed."""
    if eff.enforce_eager:
        return 0.0
    return GRAPHS_BASE_GIB + GRAPHS_PER_LAYER_GIB * layers_on_rank


def sampler_gib(model: ModelArch, eff: Effective) -> float:
    """Sampler warm-up (``max_num_seqs`` rows × vocabulary × fp32 × copies), GiB; runs
    after the KV cache is allocated, so it must fit in the headroom."""
    return eff.max_num_seqs * model.vocab * 4 * SAMPLER_COPIES / GIB


def kv_layout(model: ModelArch, eff: Effective) -> KvCacheLayout:
    """The model's KV cache groups on one card of the TP group
    (:func:`app.engine.kvcache.kv_cache_groups` of :meth:`ModelArch.kv_layers`): one
    full-attention group for most models; sliding-window, chunked and linear-attention
    layers grouped as vLLM 0.32's hybrid KV cache manager groups them."""
    layers = model.kv_layers(eff.kv_dtype_bytes, eff.tp, eff.spec_tokens, eff.dtype_bytes)
    return kv_cache_groups(layers, eff.block_size, eff.hybrid_kv, eff.prefix_caching, eff.spec_tokens)


def plan_ranks(model: ModelArch, eff: Effective, cards: list[GpuSpec], draft: Draft | None = None) -> list[RankMemory]:
    """One :class:`RankMemory` per worker, ranks in vLLM's order (stage-major: stage s
    uses ranks s·TP … s·TP+TP−1). ``cards`` must have one entry per rank. ``draft``: the
    speculative drafter, on the last stage's cards (module docstring)."""
    out: list[RankMemory] = []
    start = 0
    layout = kv_layout(model, eff)
    for s, n_layers in enumerate(eff.pp_partition):
        rng = range(start, start + n_layers)
        start += n_layers
        first, last = s == 0, s == eff.pp - 1
        w = model.weight_bytes(eff.quantization, eff.dtype_bytes, rng, embed=first, lm_head=last) / eff.tp / GIB
        act = activation_gib(model, eff, n_layers, last)
        bpt = model.kv_bytes_per_token(eff.kv_dtype_bytes, eff.tp, n_layers)
        lw = lora_gib(model, eff, n_layers)
        w += lw
        dw, dbpt = 0.0, 0
        if draft is not None and last:
            dw = draft.weight_bytes / eff.tp / GIB
            dbpt = draft.kv_bytes_per_token(eff.kv_dtype_bytes, eff.tp)
            w += dw
        for t in range(eff.tp):
            r = s * eff.tp + t
            g = cards[r]
            if g.kind == "cpu":
                total = g.memory_gib
                non_torch, graphs, a = CPU_RUNTIME_GIB, 0.0, 0.0
                if eff.cpu_budget_from_utilization:
                    budget_all = total * eff.utilization  # vLLM: ceil(MemTotal × utilization)
                    kv = budget_all - w - non_torch       # − the process's RSS after warm-up
                else:
                    kv = eff.cpu_kv_space_gib if eff.cpu_kv_space_gib is not None else CPU_DEFAULT_KV_GIB
                    budget_all = w + non_torch + kv       # what the worker holds: weights, itself, KV
            else:
                total = g.memory_gib
                budget_all = total * eff.utilization
                non_torch = NON_TORCH_GIB + (NON_TORCH_PARALLEL_GIB if eff.world > 1 else 0.0)
                graphs = cuda_graphs_gib(eff, n_layers)
                a = act
                kv = budget_all - w - a - non_torch
            kv = max(0.0, kv)
            # one pool block: a page of every layer of the widest KV cache group on this stage, plus the
            # drafter's KV for the pool's block size (its layers counted as full attention)
            block_bytes = layout.bytes_per_block(rng) + dbpt * layout.block_size
            blocks = max(0, math.floor(kv * GIB / block_bytes)) if block_bytes else 0
            tokens = layout.kv_cache_tokens(blocks, eff.max_model_len, eff.in_flight_tokens)
            out.append(RankMemory(
                rank=r, gpu=g, stage=s, layers=rng, total_gib=total, budget_gib=budget_all,
                weights_gib=w, activation_gib=a, non_torch_gib=non_torch, kv_gib=kv,
                kv_bytes_per_token=bpt, kv_tokens=tokens, kv_blocks=blocks, cuda_graphs_gib=graphs,
                sampler_gib=sampler_gib(model, eff) if last and g.kind != "cpu" else 0.0,
                draft_weights_gib=dw, draft_kv_bytes_per_token=dbpt, lora_gib=lw,
            ))
    return out


def kv_dtype_bytes(kv_cache_dtype: str | None, model_dtype_bytes: int) -> int:
    """Bytes per KV element: ``auto`` → the model's dtype; fp8 variants → 1."""
    if not kv_cache_dtype or kv_cache_dtype == "auto":
        return model_dtype_bytes
    return DTYPE_BYTES.get(kv_cache_dtype, 1 if "fp8" in kv_cache_dtype else model_dtype_bytes)
