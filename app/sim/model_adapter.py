"""The sim's one door to the planner: GPU and model catalogs, the memory plan, vLLM's
refusals (with vLLM's own error text) and the step times.

Everything else in :mod:`app.sim` calls only this module. Memory figures, checks and
step times come from :mod:`app.planner` (``plan``, ``build_step_model``) for vLLM
0.32's rules; what the planner does not hold and the sim needs — vLLM's exact error
sentences per problem code (docs/vllm-facts.md, "Failures to recognise") and the
telemetry figures of a card (idle power, thermal thresholds, clocks) — lives here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.config import ServerConfig
from app.engines import SIM_VLLM_RULES
from app.planner.checks import dp_rank_out_of_bounds, quantization_capability_needs, quantization_mismatch
from app.planner.gpus import GIB, GpuSpec, RigLayout, UnknownLinkError, load_links, lookup_gpu, lookup_link, rig_layout
from app.planner.models import ModelArch, resolve_model
from app.engine.kvcache import KvCacheLayout
from app.engine.steptime import PerfParams, StepTimeModel
from app.planner.plan import Plan, build_step_model
from app.planner.plan import plan as planner_plan

BLOCK_SIZE = 16  # vLLM's KV block on GPUs, tokens
#: the vLLM version whose defaults and wording the sim follows (declared with the engine, app.engines)
VLLM_RULES = SIM_VLLM_RULES


# ---------------------------------------------------------------------------- catalogs
def find_gpu(name: str) -> GpuSpec:
    """Planner catalog card by catalog or NVML name. Raises KeyError (UnknownGpuError)
    whose message lists the catalog."""
    return lookup_gpu(name)


def find_model(name: str) -> ModelArch:
    """Architecture of a local model dir, a cached Hub id or a catalog id (``…-AWQ``
    suffix → AWQ 4-bit). Raises LookupError (ModelNotFoundError) naming the catalog."""
    return resolve_model(name)


@dataclass(frozen=True)
class Card:
    """What the virtual telemetry needs of a card. Memory bytes = NVML's total;
    power W; temperatures °C; clocks MHz. ``nvml_name`` as NVML reports it."""

    name: str
    nvml_name: str
    memory_bytes: int
    tdp_w: float
    idle_w: float
    slowdown_c: float
    shutdown_c: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    cc: tuple[int, int]
    p2p: bool
    nvlink: bool


#: name → (idle W, slowdown °C, shutdown °C, max SM clock MHz, memory clock MHz): typical
#: values for the class (assumed, not read from a card); real runs read them from NVML.
_TELEMETRY = {
    "RTX 3090": (25, 90, 98, 1695, 9751), "RTX 4090": (25, 88, 93, 2520, 10501),
    "RTX 5090": (30, 88, 93, 2407, 14001), "RTX 5080": (20, 88, 93, 2617, 15001),
    "RTX 5070 Ti": (18, 88, 93, 2452, 14001), "H100 SXM": (70, 87, 92, 1980, 2619),
    "H100 PCIe": (45, 87, 92, 1755, 1593), "A100 80GB SXM": (55, 87, 92, 1410, 1593),
}
_TELEMETRY_DEFAULT = (25, 88, 93, 2000, 9001)


def card_of(g: GpuSpec) -> Card:
    idle, slow, shut, sm, mem = _TELEMETRY.get(g.name, _TELEMETRY_DEFAULT)
    nvml = g.nvml_names[0] if g.nvml_names else f"NVIDIA {g.name}"
    major = int(g.cc)
    return Card(g.name, nvml, int(g.memory_gib * GIB), g.tdp_w or 300.0, idle, slow, shut, sm, mem,
                (major, int(round((g.cc - major) * 10))), g.p2p, g.nvlink_gbs > 0)


# ---------------------------------------------------------------------------- refusals
class Refusal(Exception):
    """vLLM would refuse this configuration. ``text``: vLLM's error line (root cause);
    ``where``: the ``file.py:N`` vLLM prints; ``process``: APIServer or EngineCore_DP0;
    ``wrapped``: vLLM adds 'Engine core initialization failed' after it; ``after_load``:
    vLLM gets there only after loading the weights (memory profiling); ``core``: the
    engine core process that failed (a data parallel replica's own)."""

    def __init__(self, text: str, where: str, process: str = "EngineCore_DP0", wrapped: bool = True,
                 after_load: bool = False, available_kv_gib: float | None = None,
                 core: str = "EngineCore_DP0") -> None:
        super().__init__(text)
        self.text, self.where, self.process, self.wrapped = text, where, process, wrapped
        self.after_load, self.available_kv_gib, self.core = after_load, available_kv_gib, core


def _refusal(p: Plan) -> Refusal | None:
    """The first error vLLM itself would hit, in vLLM's order, with vLLM's text."""
    codes = {f.problem: f for f in p.findings if f.verdict == "error"}
    e, m = p.effective, p.model
    n = len(p.gpus)
    if "option_not_accepted" in codes:
        return Refusal(f"ValueError: {codes['option_not_accepted'].message}", "arg_utils.py:1", "APIServer", False)
    if "quantization_unknown" in codes:
        return Refusal(f"ValueError: Unknown quantization method: {e.quantization}. Must be one of "
                       f"{p.rules.quantization_methods}.", "arg_utils.py:1", "APIServer", False)
    if "quantization_mismatch" in codes:
        return Refusal(f"ValueError: {quantization_mismatch(p)}", "model.py:1", "APIServer", False)
    if "batched_tokens_below_num_seqs" in codes:
        return Refusal(f"ValueError: max_num_batched_tokens ({e.max_num_batched_tokens}) must be greater than or "
                       f"equal to max_num_seqs ({e.max_num_seqs}).", "scheduler.py:1", "APIServer", False)
    if "active_seqs_above_num_seqs" in codes:
        return Refusal(f"ValueError: max_num_active_seqs ({p.config.max_num_active_seqs}) cannot be greater than "
                       f"max_num_seqs ({e.max_num_seqs}).", "scheduler.py:340", "APIServer", False)
    if "max_model_len_exceeds_model" in codes:
        return Refusal(f"ValueError: User-specified max_model_len ({e.max_model_len}) is greater than the derived "
                       f"max_model_len (max_position_embeddings={m.max_position} or model_max_length=None in "
                       "model's config.json). To allow overriding this maximum, set the env var "
                       "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", "model.py:1", "APIServer", False)
    if "not_enough_gpus" in codes and e.world <= n:  # a data parallel replica past the cards
        r = n // e.world  # the replica holding local rank n (vllm/v1/worker/gpu_worker.py init_device, 0.32.0)
        core = f"EngineCore_DP{r}"
        worker = core if e.world == 1 else f"Worker_DP{r}_TP{n - r * e.world}"
        return Refusal(f"AssertionError: {dp_rank_out_of_bounds(n)}", "gpu_worker.py:492", worker, core=core)
    if "not_enough_gpus" in codes:
        return Refusal(f"ValueError: World size ({e.world}) is larger than the number of available GPUs ({n}) in "
                       "this node. If this is intentional and you are using: - ray, set "
                       "'--distributed-executor-backend ray'.", "arg_utils.py:1204", "APIServer", False)
    if "tp_not_divisor_of_heads" in codes:
        if m.heads % e.tp:
            return Refusal(f"ValueError: Total number of attention heads ({m.heads}) must be divisible by tensor "
                           f"parallel size ({e.tp}).", "core.py:700")
        return Refusal(f"AssertionError: total_num_kv_heads ({m.kv_heads}) is not divisible by tensor parallel "
                       f"size ({e.tp})", "core.py:700")
    if "quantization_unsupported_by_gpu" in codes:
        g = min(p.cards, key=lambda c: c.capability)
        need = p.rules.min_capability(e.quantization or "") or 0
        # the method's minimum first (VllmConfig), then each compressed-tensors scheme (get_scheme)
        for what, s_need, exact, _ in quantization_capability_needs(p, g.capability) if g.capability >= need else []:
            if exact and g.capability != s_need:
                return Refusal("NotImplementedError: No compressed-tensors compatible scheme was found.",
                               "core.py:700")
            if g.capability < s_need:
                return Refusal(f"RuntimeError: Quantization scheme is not supported for the current GPU. Min "
                               f"capability: {s_need}. Current capability: {g.capability}.", "core.py:700")
        return Refusal(f"ValueError: The quantization method {e.quantization} is not supported for the current "
                       f"GPU. Minimum capability: {need}. Current capability: {g.capability}.", "core.py:700")
    if "dtype_unsupported_by_gpu" in codes:
        g = min(p.cards, key=lambda c: c.capability)
        return Refusal("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                       f"Your {g.name} GPU has compute capability {g.cc}. You can use float16 instead by explicitly "
                       "setting the `dtype` flag in CLI, for example: --dtype=half.", "core.py:700")
    if "dtype_unsupported_by_quantization" in codes:
        return Refusal(f"ValueError: torch.bfloat16 is not supported for quantization method {e.quantization}. "
                       "Supported dtypes: [torch.float16]", "core.py:700")
    for r in p.ranks:
        if r.weights_gib > r.total_gib:
            return Refusal(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU {r.rank} "
                           f"has a total capacity of {r.total_gib:.2f} GiB of which 0 bytes is free.",
                           "core.py:700", after_load=True)
    kv = min(r.kv_gib for r in p.ranks)
    if "no_kv_cache_memory" in codes or kv <= 0:
        return Refusal("ValueError: No available memory for the cache blocks. Try increasing "
                       "`gpu_memory_utilization` when initializing the engine.", "core.py:700", after_load=True)
    if "context_exceeds_kv_cache" in codes:
        rk = min(p.ranks, key=lambda r: r.kv_gib)
        # vLLM's sentence and figures: kv_cache_utils.py _check_enough_kv_cache_memory (:1003 @ 0.32.0), the
        # need and the estimate over its KV cache groups (app.engine.kvcache)
        return Refusal(
            f"ValueError: To serve at least one request with the models's max seq len ({e.max_model_len}), "
            f"({p.context_kv_gib():.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({rk.kv_gib:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{p.fitting_model_len()}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine.", "core.py:843", after_load=True,
            available_kv_gib=rk.kv_gib)
    if codes:  # an error the sim has no vLLM sentence for: the planner's own
        f = next(iter(codes.values()))
        return Refusal(f"ValueError: {f.message}", "core.py:700")
    return None


# ---------------------------------------------------------------------------- the plan
@dataclass
class SimPlan:
    """The planned rig as the sim uses it. Bytes per GPU (rank 0 unless named);
    tokens as counts, one engine's (each data parallel replica has its own ``num_blocks``
    KV blocks, the same on identical cards); ``used_bytes_per_rank`` every rank of every
    replica, replica r on cards r·TP·PP …. ``plan`` is the planner's full :class:`Plan`."""

    plan: Plan
    card: Card
    gpu_count: int
    tp: int
    pp: int
    dp: int
    weights_bytes: float
    kv_bytes: float
    kv_bytes_per_token: int
    num_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    utilization: float
    cuda_graph_bytes: float
    used_bytes_per_rank: list[float]
    load_s: float

    #: a hybrid model's KV cache groups (app.engine.kvcache), None for one full-attention group;
    #: ``num_blocks`` then counts the pool's blocks
    kv_layout: KvCacheLayout | None = None

    @property
    def kv_tokens(self) -> int:
        """vLLM's "KV cache size" (tokens) of the planned pool (:meth:`capacity`)."""
        return self.capacity(self.num_blocks)[0]

    @property
    def max_concurrency(self) -> float:
        """vLLM's logged "Maximum concurrency" of the planned pool (:meth:`capacity`)."""
        return self.capacity(self.num_blocks)[1]

    @property
    def block_size(self) -> int:
        """Tokens per block of the pool (16; a hybrid attention/mamba model's grown block)."""
        return BLOCK_SIZE if self.kv_layout is None else self.kv_layout.block_size

    def capacity(self, num_blocks: int) -> tuple[int, float]:
        """(KV cache size in tokens, maximum concurrency at max_model_len) of a pool of
        ``num_blocks``, as vLLM 0.32 computes them (``get_kv_cache_capacity``,
        vllm/v1/core/kv_cache_utils.py:2300): blocks × 16 and blocks / ceil(max_model_len / 16)
        for one full-attention group, over the KV cache groups otherwise (app.engine.kvcache)."""
        if self.kv_layout is None:
            return num_blocks * BLOCK_SIZE, num_blocks / math.ceil(self.max_model_len / BLOCK_SIZE)
        f = self.plan.effective.in_flight_tokens
        return (self.kv_layout.kv_cache_tokens(num_blocks, self.max_model_len, f),
                self.kv_layout.max_concurrency(num_blocks, self.max_model_len, f))


def load_seconds(weights_bytes_per_gpu: float) -> float:
    """Rig seconds to load one worker's weights: 4 s + 1.5 GB/s (assumed; workers load
    their shards in parallel)."""
    return 4.0 + weights_bytes_per_gpu / 1.5e9


def sim_rig_layout(gpu_count: int, hosts: int = 1, link: str | None = None) -> RigLayout | None:
    """The layout of ``gpu_count`` cards over ``hosts`` hosts (evenly) joined by ``link``
    (a link-catalog name); None for one host. Raises ValueError naming the option and
    the fix (``--sim-hosts`` not dividing the cards, no ``--sim-link``, an unknown link)."""
    if hosts < 1:
        raise ValueError(f"--sim-hosts {hosts}: give at least 1 host")
    if hosts == 1:
        return None
    if gpu_count % hosts:
        raise ValueError(f"--sim-hosts {hosts} does not divide --sim-gpu-count {gpu_count}: the cards are split "
                         f"evenly over the hosts; give a count that is a multiple of {hosts}")
    if not link:
        raise ValueError(f"--sim-hosts {hosts} needs --sim-link NAME, the link between the hosts: one of "
                         f"{', '.join(load_links())}")
    try:
        return rig_layout(hosts, gpu_count // hosts, lookup_link(link))
    except UnknownLinkError as e:
        raise ValueError(f"--sim-link: {e}") from None


def plan_rig(config: ServerConfig, gpu_name: "str | GpuSpec", gpu_count: int, hosts: int = 1,
             link: str | None = None) -> SimPlan:
    """Plan ``config`` on ``gpu_count`` cards named ``gpu_name`` (or given as a
    :class:`GpuSpec`, e.g. :func:`app.planner.gpus.cpu_device` for the CPU build), in
    ``hosts`` hosts joined by ``link`` (:func:`sim_rig_layout`). Raises KeyError /
    LookupError for an unknown card or model, ValueError for a bad host layout,
    :class:`Refusal` (vLLM's text) for a configuration vLLM refuses."""
    gpu = gpu_name if isinstance(gpu_name, GpuSpec) else find_gpu(gpu_name)
    model = find_model(config.model)
    rig = sim_rig_layout(gpu_count, hosts, link)
    p = planner_plan(config, [gpu] * gpu_count, model, vllm_version=VLLM_RULES, use_calibration=False, predict=False,
                     rig=rig)
    ref = _refusal(p)
    if ref is not None:
        if ref.after_load:
            ref.load_s = load_seconds(p.ranks[0].weights_gib * GIB)  # type: ignore[attr-defined]
            ref.weights_gib = p.ranks[0].weights_gib  # type: ignore[attr-defined]
        raise ref
    e = p.effective
    r0 = p.ranks[0]
    hybrid = not p.kv_layout.uniform
    blocks = p.kv_blocks if hybrid else min(r.kv_tokens for r in p.ranks) // BLOCK_SIZE
    return SimPlan(
        plan=p, card=card_of(gpu), gpu_count=gpu_count, tp=e.tp, pp=e.pp, dp=p.dp, weights_bytes=r0.weights_gib * GIB,
        kv_bytes=min(r.kv_gib for r in p.ranks) * GIB, kv_bytes_per_token=r0.kv_bytes_per_token, num_blocks=blocks,
        max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
        utilization=e.utilization, cuda_graph_bytes=r0.cuda_graphs_gib * GIB,
        used_bytes_per_rank=[(r.budget_gib + r.cuda_graphs_gib) * GIB for r in p.ranks],
        load_s=load_seconds(r0.weights_gib * GIB), kv_layout=p.kv_layout if hybrid else None)


# ---------------------------------------------------------------------------- step times
class StepModel:
    """Engine step times in rig seconds from the planner's :class:`StepTimeModel`.
    ``params``: a whole parameter set instead of the planner's defaults for the card
    class (e.g. a calibration, :func:`app.planner.calibrate.load_calibration`); then the
    single overrides ``eta_mem``, ``eta_c``, ``t_cpu`` (s per step) on top (None = keep)."""

    def __init__(self, sp: SimPlan, eta_mem: float | None = None, eta_c: float | None = None,
                 t_cpu: float | None = None, params: PerfParams | None = None) -> None:
        base = build_step_model(sp.plan)
        if params is not None:
            base = base.with_params(params)
        pr: PerfParams = base.params
        changes = {k: v for k, v in (("eta_mem", eta_mem), ("eta_compute", eta_c), ("t_cpu_s", t_cpu))
                   if v is not None}
        self.model: StepTimeModel = base.with_params(replace(pr, **changes)) if changes else base

    @property
    def params(self) -> PerfParams:
        return self.model.params

    def step_time(self, decode_batch: int, decode_context_sum: float, prefill_tokens: int,
                  prefill_attention: float = 0.0, spec_tokens: int = 0) -> float:
        """One fused step, seconds: :meth:`app.engine.steptime.StepTimeModel.step_time`
        (the planner's prediction steps with the same method); ``spec_tokens`` the draft
        tokens it verifies (speculative decoding)."""
        return self.model.step_time(decode_batch, decode_context_sum, prefill_tokens, prefill_attention, spec_tokens)

    def engine_step_time(self, decode_batch: int, decode_context_sum: float, prefill_tokens: int,
                         prefill_attention: float = 0.0, spec_tokens: int = 0) -> float | tuple[float, float]:
        """What the engine's scheduler steps with:
        :attr:`app.engine.steptime.StepTimeModel.engine_step_time` (with pipeline
        parallelism a step's latency and its slowest stage's interval, s)."""
        return self.model.engine_step_time(decode_batch, decode_context_sum, prefill_tokens, prefill_attention,
                                           spec_tokens)

    @property
    def pipeline_parallel_size(self) -> int:
        return self.model.pipeline_parallel_size

    def step_time_decode(self, batch: int, mean_context: float) -> float:
        return self.model.step_time_decode(batch, mean_context)

    def step_time_prefill(self, n_tokens: int) -> float:
        return self.model.step_time_prefill(n_tokens)
