"""The plan: will it fit, how many users, what breaks — before a launch.

``plan(config, gpus, model, workload)`` resolves vLLM's effective settings for the
installed (or newest known) version, plans each card's memory (app.planner.memory),
runs every check (app.planner.checks) and searches a passing fix for each problem,
then builds the step-time model (app.engine.steptime) and predicts the ramp and the
users at the SLO on the step-level engine (app.planner.predict).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from app.config import ServerConfig, dict_to_extra_args, extra_args_to_dict
from app.engine.steptime import (Curve, CurvePoint, PerfParams, StageSpec, StepTimeModel, default_levels,
                                 async_scheduling_default, default_params, predict_level)
from app.loadgen.capacity import P99_MIN_REQUESTS, SEARCH_STEP_CAP_S, Capacity
from app.loadgen.prompts import planned_lengths
from app.loadgen import workload as wl
from app.loadgen.spec import SLO, CapacitySearch, RampSpec
from app.loadgen.stats import find_knee
from app.engine.admission import AdmissionLimits
from app.engine.kvcache import CHUNKED, FULL, MAMBA, SLIDING, KvCacheLayout
from app.engine.specdecode import DEFAULT_ACCEPTANCE
from app.engines import Engine
from app.planner.calibrate import hardware_fingerprint, load_calibration
from app.planner.checks import CHECKS, VERDICT_ORDER, Finding, nccl_p2p_disabled
from app.planner.gpus import GIB, GpuSpec, RigLayout
from app.planner.memory import (LORA_DEFAULT_RANK, LORA_DEFAULT_SLOTS, Draft, Effective, RankMemory, kv_dtype_bytes,
                                 kv_layout, plan_ranks, pp_partition)
from app.planner.models import DTYPE_BYTES, ModelArch, ModelNotFoundError, quant_bytes_per_param, resolve_model
from app.planner.pcie import HostPcie
from app.planner.predict import EngineLimits, predict_ramp
from app.planner.versions import VllmRules, chunked_prefill_default, rules_for, v0_batch_defaults, v0_engine


def mean_lengths(spec: wl.Workload) -> tuple[int, int]:
    """The mean (prompt, output) tokens of the requests ``spec`` sends
    (:func:`app.loadgen.prompts.planned_lengths`), each at least 1."""
    return wl.mean_tokens(spec, planned_lengths(spec))


#: the fields of :class:`Workload` that are the ramp's, not the requests' (:meth:`Workload.of`)
_RAMP_FIELDS = ("levels", "warmup_s", "step_s", "slo", "search", "requests_per_level", "search_cap_s", "settle")


@dataclass(frozen=True)
class Workload:
    """The closed-loop ramp the plan predicts: ``requests``, the one workload model
    (:class:`app.loadgen.workload.Workload`: lengths, seed, dataset, shared prefix,
    multi-turn — a ramp's or a tune's, unchanged), and how the load generator would run
    it: the concurrency ``levels`` of the predicted curve (None → 1, 2, 4 … up to twice
    the capacity), each ``warmup_s`` + ``step_s`` rig seconds; ``slo``: the bounds the
    predicted users at SLO are judged on (None: no such prediction), found by a capacity
    search like ``vllm-dyno ramp --find-capacity``: ``search`` (None: its defaults),
    ≥ ``requests_per_level`` measured requests a level, ``search_cap_s`` its time cap,
    the same warm-up. ``settle``: RampSpec.settle (None: a search's levels settle, the
    curve's do not). :attr:`prompt_tokens`/:attr:`output_tokens`: the mean lengths of the
    requests (a dataset's: of the requests it sends) — for the concurrency the KV cache
    holds."""

    requests: wl.Workload = field(default_factory=wl.Workload)
    levels: tuple[int, ...] | None = None
    warmup_s: float = 0.0
    step_s: float = 20.0
    slo: SLO | None = None
    search: CapacitySearch | None = None
    requests_per_level: int = P99_MIN_REQUESTS
    search_cap_s: float = SEARCH_STEP_CAP_S
    settle: bool | None = None

    @classmethod
    def of(cls, prompt_tokens: wl.Length = 512, output_tokens: wl.Length = 128, levels: tuple[int, ...] | None = None,
           **kw: Any) -> "Workload":
        """A plan's workload from keywords: those of the requests (any
        :class:`app.loadgen.workload.Workload` field: ``length_spread``, ``seed``,
        ``multi_turn`` …) and those of the ramp (``levels``, ``warmup_s``, ``step_s``,
        ``slo`` …). Raises ValueError (pydantic's) for a bad request field."""
        ramp = {k: kw.pop(k) for k in _RAMP_FIELDS if k in kw}
        return cls(wl.Workload(prompt_tokens=prompt_tokens, output_tokens=output_tokens, **kw), levels, **ramp)

    @classmethod
    def from_ramp(cls, spec: RampSpec) -> "Workload":
        """The workload of a ramp: its requests unchanged (a request-rate ramp's as a
        closed loop sends them: the plan's curve and users at SLO stay closed-loop), its
        warm-up, step, concurrency levels and SLO; a capacity search's own search, request
        floor and cap (its curve: the default levels of 20 s)."""
        levels = tuple(int(x) for x in spec.levels) if spec.mode == "concurrency" and spec.levels else None
        kw: dict[str, Any] = {"step_s": spec.step_seconds or 20.0}
        if spec.search is not None and spec.mode == "concurrency":  # its step is the search's cap; the curve
            # keeps 20 s levels (a request-rate search is not the users at SLO the plan predicts)
            kw = {"search": spec.search, "requests_per_level": spec.requests_per_level or P99_MIN_REQUESTS,
                  "search_cap_s": spec.step_seconds or SEARCH_STEP_CAP_S}
        return cls(spec.closed_loop(), levels, spec.warmup_seconds, slo=None if spec.slo.is_empty() else spec.slo,
                   settle=spec.settle, **kw)

    @functools.cached_property
    def _means(self) -> tuple[int, int]:
        r = self.requests
        return mean_lengths(r) if r.prompts_file is not None else wl.mean_tokens(r)

    @property
    def prompt_tokens(self) -> int:
        """The mean prompt tokens of the requests (a range's middle; a dataset's mean)."""
        return self._means[0]

    @property
    def output_tokens(self) -> int:
        """The mean output tokens (max_tokens) of the requests."""
        return self._means[1]

    def _spec(self, **kw: Any) -> RampSpec:
        return RampSpec(**self.requests.closed_loop().model_dump(), warmup_seconds=self.warmup_s,
                        slo=self.slo or SLO(), settle=self.settle, **kw)

    def ramp_spec(self, levels: list[int]) -> RampSpec:
        """The fixed ramp the predicted curve imitates (every level runs: no SLO stop)."""
        return self._spec(levels=[float(x) for x in levels], step_seconds=self.step_s)

    def search_spec(self) -> RampSpec | None:
        """The capacity search the predicted users at SLO imitate — ``vllm-dyno ramp
        --find-capacity`` with this workload (None without an SLO)."""
        if self.slo is None or self.slo.is_empty():
            return None
        return self._spec(search=self.search or CapacitySearch(), requests_per_level=self.requests_per_level,
                          step_seconds=self.search_cap_s)


@dataclass
class Plan:
    """Everything the planner found. Sizes in GiB unless named bytes; tokens as counts.

    ``verdict`` ok/warn/error (info findings do not count); ``problem`` the first
    error's code (else the first warning's, else None); ``fix`` its passing fix (or
    None); ``findings`` all of them. ``cards`` one entry per rank of every data
    parallel replica (replica r on cards r·TP·PP …); ``ranks`` their memory.
    ``kv_cache_tokens`` what vLLM will log as "KV cache size" (one engine);
    ``max_concurrency`` vLLM's "Maximum concurrency for max_model_len tokens per
    request" (one engine); ``workload_concurrency`` requests of the workload that run at
    once on all replicas (each capped by max_num_seqs). ``perf`` the step-time model of
    one replica, ``curve`` the predicted ramp of the whole server and ``capacity`` the
    predicted answer of a capacity search at the workload's SLO (None without one), both
    from the step-level engine (:mod:`app.planner.predict`). ``host`` the host's
    IOMMU/ACS (None: unknown). ``rig`` how the cards sit in hosts and the link between
    them (None: all on one host)."""

    config: ServerConfig
    model: ModelArch
    gpus: list[GpuSpec]
    cards: list[GpuSpec]
    rules: VllmRules
    effective: Effective
    ranks: list[RankMemory]
    workload: Workload | None
    partition_error: str | None = None
    findings: list[Finding] = field(default_factory=list)
    perf: StepTimeModel | None = None
    curve: Curve | None = None
    capacity: Capacity | None = None
    host: HostPcie | None = None
    #: the speculative drafter (``--speculative-config``), None without
    draft: Draft | None = None
    #: the chance each draft position is accepted given the one before, for the predicted
    #: ramp (app.engine.specdecode; the sim's --sim-spec-acceptance default unless given)
    spec_acceptance: float = DEFAULT_ACCEPTANCE
    rig: RigLayout | None = None
    #: the share of the planned KV cache the engine gets (a simulated rig's truth,
    #: app.profiles.truth ``kv_tokens_scale``; 1: all of it)
    kv_tokens_scale: float = 1.0

    @property
    def dp(self) -> int:
        """data_parallel_size: engine replicas, each on TP × PP cards of its own."""
        return self.config.data_parallel_size or 1

    # ------------------------------------------------------------------ figures
    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token of the whole model (all layers, all heads)."""
        return self.model.kv_bytes_per_token(self.effective.kv_dtype_bytes, 1)

    @functools.cached_property
    def kv_layout(self) -> KvCacheLayout:
        """The model's KV cache groups (:func:`app.planner.memory.kv_layout`)."""
        return kv_layout(self.model, self.effective)

    @property
    def kv_blocks(self) -> int:
        """Blocks of one engine's KV pool: the smallest of its workers (vLLM re-plans every
        worker to the smallest count: kv_cache_utils.py:2660 @ 0.32.0)."""
        return min((r.kv_blocks for r in self.ranks), default=0)

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM's "KV cache size" of one engine (tokens, :meth:`KvCacheLayout.kv_cache_tokens`)."""
        e = self.effective
        return self.kv_layout.kv_cache_tokens(self.kv_blocks, e.max_model_len, e.in_flight_tokens) if self.ranks else 0

    @property
    def max_concurrency(self) -> float:
        e = self.effective
        return self.kv_layout.max_concurrency(self.kv_blocks, e.max_model_len, e.in_flight_tokens)

    def concurrency_for(self, prompt_tokens: int, output_tokens: int) -> tuple[int, str]:
        """(requests that run at once on one engine — one data parallel replica —, what
        limits it: "max_num_seqs" or "KV cache"): the pool's blocks over the blocks one
        request of that length holds at its last step in every KV cache group — the whole
        context in a full-attention group, a window in a sliding one (what the engine holds:
        :meth:`KvCacheLayout.held_blocks`)."""
        e = self.effective
        per = self.kv_layout.held_blocks(max(0, prompt_tokens + output_tokens - 1), 1)
        kv = self.kv_blocks // max(1, per)
        if kv < e.max_num_seqs:
            return kv, "KV cache"
        return e.max_num_seqs, "max_num_seqs"

    def context_fits(self) -> bool:
        """Whether one request of max_model_len fits every worker's KV memory (vLLM's
        check before it allocates, null block reserved: :meth:`KvCacheLayout.fits`)."""
        e = self.effective
        return all(self.kv_layout.fits(self._kv_bytes(r), e.max_model_len, e.in_flight_tokens, r.layers)
                   for r in self.ranks)

    def fitting_model_len(self) -> int:
        """vLLM's "estimated maximum model length" for the KV memory of the tightest worker
        (:meth:`KvCacheLayout.max_model_len`), at most max_model_len."""
        e = self.effective
        return min((self.kv_layout.max_model_len(self._kv_bytes(r), e.in_flight_tokens, e.max_model_len, r.layers)
                    for r in self.ranks), default=0)

    def context_kv_gib(self) -> float:
        """KV memory one request of max_model_len needs on the tightest worker (GiB): its
        blocks in every KV cache group × the pool's bytes per block."""
        e, lay = self.effective, self.kv_layout
        per = lay.blocks_per_request(e.max_model_len, e.in_flight_tokens)
        return max((lay.bytes_per_block(r.layers) * per for r in self.ranks), default=0) / GIB

    def _kv_bytes(self, r: RankMemory) -> float:
        """A worker's KV bytes for the target model's layers (the drafter's share per block off)."""
        lay = self.kv_layout
        bpb = lay.bytes_per_block(r.layers)
        full = bpb + r.draft_kv_bytes_per_token * lay.block_size
        return r.kv_gib * GIB * (bpb / full if full else 1.0)

    @property
    def workload_concurrency(self) -> int | None:
        if self.workload is None:
            return None
        return self.concurrency_for(self.workload.prompt_tokens, self.workload.output_tokens)[0] * self.dp

    @property
    def predicted_users_at_slo(self) -> float | None:
        """The largest concurrency whose predicted p99s meet the workload's SLO (the
        capacity search's rule applied to the engine's levels); None without an SLO or a
        prediction."""
        return self.capacity.users if self.capacity is not None else None

    @property
    def link_share(self) -> float | None:
        """The inter-host link's share of a decode step at the predicted users at the SLO
        (else at the workload's concurrency), per replica: 0 on one host; None without a
        step model or a workload."""
        if self.perf is None or self.workload is None:
            return None
        w = self.workload
        cap, _ = self.concurrency_for(w.prompt_tokens, w.output_tokens)
        users = self.predicted_users_at_slo
        batch = min(cap, math.ceil(users / self.dp)) if users else cap
        return self.perf.link_share_decode(max(1, batch), w.prompt_tokens + w.output_tokens / 2)

    def engine_limits(self) -> EngineLimits:
        """What one scheduler of this server holds (KV blocks, max_num_seqs, the token
        budget) and how many engines (data parallel replicas) there are."""
        e = self.effective
        # prefix caching: vLLM V1's default is on (vllm/config/cache.py, 0.32.0); only --no-… turns it off;
        # V0's is off (effective_settings)
        pc = e.prefix_caching
        c = self.config
        gate = AdmissionLimits(c.max_num_queued_reqs, c.max_num_queued_tokens)
        if not self.kv_layout.uniform:  # the pool's blocks, each request holding only its windows
            blocks = self.kv_blocks if self.kv_tokens_scale == 1.0 else int(self.kv_blocks * self.kv_tokens_scale)
            return EngineLimits(max(1, blocks), e.max_num_seqs, e.max_num_batched_tokens, self.dp,
                                spec_tokens=self.config.num_speculative_tokens, spec_acceptance=self.spec_acceptance,
                                enable_prefix_caching=pc, max_model_len=e.max_model_len, kv_layout=self.kv_layout,
                                max_num_active_seqs=c.max_num_active_seqs, admission=gate,
                                prefill_first=e.prefill_first)
        kv = self.kv_cache_tokens if self.kv_tokens_scale == 1.0 else int(self.kv_cache_tokens * self.kv_tokens_scale)
        return EngineLimits.of_tokens(kv, e.max_num_seqs, e.max_num_batched_tokens, self.dp,
                                      spec_tokens=self.config.num_speculative_tokens,
                                      spec_acceptance=self.spec_acceptance,
                                      enable_prefix_caching=pc, max_model_len=e.max_model_len,
                                      max_num_active_seqs=c.max_num_active_seqs, admission=gate,
                                      prefill_first=e.prefill_first)

    @property
    def weights_gib_total(self) -> float:
        e = self.effective
        return self.model.weight_bytes(e.quantization, e.dtype_bytes) / GIB

    # ------------------------------------------------------------------ verdict
    @property
    def verdict(self) -> str:
        return max((f.verdict for f in self.findings if f.verdict in ("warn", "error")),
                   key=VERDICT_ORDER.__getitem__, default="ok")

    @property
    def primary(self) -> Finding | None:
        for level in ("error", "warn"):
            for f in self.findings:
                if f.verdict == level:
                    return f
        return None

    @property
    def problem(self) -> str | None:
        return self.primary.problem if self.primary else None

    @property
    def fix(self) -> dict[str, Any] | None:
        return self.primary.fix if self.primary else None

    def problems(self) -> list[str]:
        return [f.problem for f in self.findings]

    def as_dict(self) -> dict[str, Any]:
        """A plain mapping for storage and JSON output."""
        e = self.effective
        return {
            "verdict": self.verdict, "problem": self.problem, "fix": self.fix,
            "findings": [{"problem": f.problem, "verdict": f.verdict, "message": f.message, "fix": f.fix,
                          "alternatives": [{"fix": a, "output_tps": tps} for a, tps in f.alternatives]}
                         for f in self.findings],
            "data_parallel_size": self.dp,
            "host": None if self.host is None else {"iommu": self.host.iommu, "acs": self.host.acs,
                                                    "source": self.host.source},
            "rig": None if self.rig is None else {
                "hosts": self.rig.hosts, "cards_per_host": self.rig.cards_per_host,
                "link": None if self.rig.link is None else self.rig.link.name,
                "tp_hosts": self.perf.tp_hosts if self.perf is not None else None,
                "link_share": self.link_share},
            "vllm_version": self.rules.version,
            "kv_bytes_per_token": self.kv_bytes_per_token, "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency, "workload_concurrency": self.workload_concurrency,
            "weights_gib_total": self.weights_gib_total,
            "speculative": None if self.draft is None else {
                "method": self.draft.method, "num_speculative_tokens": self.draft.k,
                "draft_weights_gib_total": self.draft.weight_bytes / GIB,
                "draft_kv_bytes_per_token": self.draft.kv_bytes_per_token(e.kv_dtype_bytes, 1),
                "acceptance": self.spec_acceptance,
                "note": self.draft.note},
            "effective": {k: getattr(e, k) for k in e.__dataclass_fields__},
            "ranks": [{"rank": r.rank, "gpu": r.gpu.name, "stage": r.stage, "total_gib": r.total_gib,
                       "budget_gib": r.budget_gib, "weights_gib": r.weights_gib, "activation_gib": r.activation_gib,
                       "non_torch_gib": r.non_torch_gib, "kv_gib": r.kv_gib, "kv_tokens": r.kv_tokens,
                       "cuda_graphs_gib": r.cuda_graphs_gib, "sampler_gib": r.sampler_gib,
                       "draft_weights_gib": r.draft_weights_gib,
                       "draft_kv_bytes_per_token": r.draft_kv_bytes_per_token} for r in self.ranks],
            "curve": None if self.curve is None else {
                "knee": self.curve.knee, "knee_reason": self.curve.knee_reason,
                "points": [p.__dict__ for p in self.curve.points]},
            "predicted_users_at_slo": self.predicted_users_at_slo,
            "predicted_capacity": None if self.capacity is None else self.capacity.model_dump(
                mode="json", include={"users", "users_low", "users_high", "next_users", "output_tps", "ttft_p99",
                                      "tpot_p99", "e2e_p99", "limited_by", "slo", "shape", "sentence"}),
        }


# ---------------------------------------------------------------------- effective
def cpu_kv_space_of(value: str | None) -> float | None:
    """``VLLM_CPU_KVCACHE_SPACE`` as GiB: None when unset or empty (vLLM 0.32
    vllm/platforms/cpu.py reads it only when set and not ""), or not a number."""
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _resolve_dtype(cfg: ServerConfig, model: ModelArch, cards: list[GpuSpec], rules: VllmRules,
                   quantization: str | None) -> str:
    d = cfg.dtype or "auto"
    if d in ("half",):
        return "float16"
    if d in ("float",):
        return "float32"
    if d != "auto":
        return d
    d = model.torch_dtype if model.torch_dtype in ("bfloat16", "float16", "float32") else "bfloat16"
    if d == "float32":
        d = "bfloat16"  # vLLM serves float32 checkpoints in 16 bits by default
    gpus = [g for g in cards if g.kind != "cpu"]
    if d == "bfloat16" and gpus and min(g.capability for g in gpus) < 80:
        d = "float16"  # vLLM falls back on its own when dtype is auto
    if d == "bfloat16" and quantization == "awq" and not rules.awq_bf16:
        d = "float16"
    return d


#: methods whose drafter is a small transformer sharing the target's embedding and lm_head
#: (EAGLE heads; vLLM's EAGLE proposer loads them from the target when the head has none)
_HEAD_METHODS = ("eagle", "eagle3", "dflash", "dspark")


def draft_of(cfg: ServerConfig, model: ModelArch, dtype_bytes: int) -> Draft | None:
    """The drafter of ``cfg``'s ``--speculative-config`` (None without one), as
    :class:`app.planner.memory.Draft`:

    - ngram, ngram_gpu, suffix: no weights, no KV, no forward pass (they look the
      continuation up in the request's own tokens).
    - draft_model: the draft's config.json (a local directory or the Hugging Face
      cache, :func:`app.planner.models.resolve_model`, as the main model) — all its
      weights, its KV per token, k forward passes a step; a draft that cannot be read
      counts as nothing, and ``note`` says so (the plan warns).
    - eagle, eagle3, dflash, dspark: the head's config.json when it can be read (its
      decoder layer(s), without embedding and lm_head, which the head shares with the
      target), else one decoder layer of the target's shape; KV for its layers; k passes.
    - mtp (and the ``*_mtp`` names), extract_hidden_states: the target's own next-token
      layer(s) — one layer of its shape (DeepSeek-V3's ``num_nextn_predict_layers`` is 1).
    - medusa, mlp_speculator: k heads of one H×H block and an lm_head each, no KV, one pass.
    """
    d = cfg.speculative_config
    if not d:
        return None
    method, k = cfg.speculative_method or "draft_model", cfg.num_speculative_tokens
    one_layer = replace(model, layers=max(1, int(getattr(model, "mtp_layers", 1) or 1)), first_dense_layers=0)
    if method in ("ngram", "ngram_gpu", "suffix", "custom_class"):
        return Draft(method, k, note=f"{method}: no draft weights" if method != "custom_class" else
                     "custom_class: the proposer's memory is not known")
    if method in ("medusa", "mlp_speculator"):
        w = k * (model.hidden * model.hidden + model.vocab * model.hidden) * dtype_bytes
        return Draft(method, k, None, w, False, 1, f"{method}: {k} heads of H×H + lm_head each (no KV)")
    if method in ("mtp", "extract_hidden_states"):
        return Draft(method, k, one_layer, one_layer.weight_bytes(None, dtype_bytes, embed=False, lm_head=False),
                     True, k, f"{method}: the target's next-token layer (one layer of its shape)")
    name = str(d.get("model") or "")
    try:
        arch = resolve_model(name)
        src = arch.source or name
    except (ModelNotFoundError, LookupError, ValueError, OSError):
        arch, src = None, ""
    if method in _HEAD_METHODS:
        head = arch if arch is not None else one_layer
        note = (f"{method} head {name}: {head.layers} layer(s) from {src}" if arch is not None else
                f"{method} head {name}: config not found, assumed one decoder layer of the target's shape")
        return Draft(method, k, head, head.weight_bytes(None, dtype_bytes, embed=False, lm_head=False), True, k, note)
    if arch is None:
        return Draft(method, k, note=f"draft model {name!r}: no config.json found (not a directory, not in the "
                     "Hugging Face cache, not in the catalog), so its memory is not counted: download it or "
                     "give its directory")
    return Draft(method, k, arch, arch.weight_bytes(None, dtype_bytes), True, k,
                 f"draft model {name}: {arch.layers} layers from {src}")


def lora_settings(cfg: ServerConfig, model_dtype_bytes: int) -> dict[str, Any]:
    """The :class:`Effective` LoRA fields from ``--enable-lora``, ``--max-loras``,
    ``--max-lora-rank``, ``--lora-dtype`` and ``--fully-sharded-loras`` (passed as extra
    arguments; vLLM's defaults :data:`app.planner.memory.LORA_DEFAULT_SLOTS` / ``_RANK``
    and the model's dtype); none without ``--enable-lora``. A malformed number is left to
    the option checks (vLLM refuses it)."""
    try:
        extra = extra_args_to_dict(cfg.extra_args)
    except ValueError:
        return {}
    if not extra.get("enable-lora"):
        return {}

    def num(key: str, default: int) -> int:
        try:
            return max(1, int(extra.get(key) or default))
        except (TypeError, ValueError):
            return default

    ldt = str(extra.get("lora-dtype") or "auto")
    return {"lora_slots": num("max-loras", LORA_DEFAULT_SLOTS), "lora_rank": num("max-lora-rank", LORA_DEFAULT_RANK),
            "lora_dtype_bytes": DTYPE_BYTES.get(ldt, model_dtype_bytes) if ldt != "auto" else model_dtype_bytes,
            "lora_fully_sharded": bool(extra.get("fully-sharded-loras"))}


def effective_settings(cfg: ServerConfig, model: ModelArch, cards: list[GpuSpec], rules: VllmRules) -> tuple[Effective, str | None]:
    """vLLM's effective values for ``cfg`` (and an error text when the PP layer
    partition is invalid)."""
    tp = cfg.tensor_parallel_size or 1
    pp = cfg.pipeline_parallel_size or 1
    q = cfg.quantization or model.quant_method
    dtype = _resolve_dtype(cfg, model, cards, rules, q)
    dbytes = DTYPE_BYTES.get(dtype, 2)
    smallest = min(cards, key=lambda g: g.memory_gib)
    cpu = any(g.kind == "cpu" for g in cards)
    seqs, batched = rules.batch_defaults(smallest.memory_gib, smallest.name, tp * pp if cpu else 0)
    mml = cfg.max_model_len or model.max_position
    try:
        given = extra_args_to_dict(cfg.extra_args).get("enable-chunked-prefill")
    except ValueError:
        given = None
    chunked = bool(given) if given is not None else chunked_prefill_default(
        rules.version, mml, bool(model.sliding_window), bool(cfg.num_speculative_tokens), bool(lora_settings(cfg, dbytes)))
    v0 = v0_engine(rules.version) and not cpu
    if v0:
        seqs, batched = v0_batch_defaults(mml, chunked)
    part_err = None
    try:
        part = pp_partition(model.layers, pp, cfg.env.get("VLLM_PP_LAYER_PARTITION"))
    except ValueError as e:
        part_err = str(e)
        part = pp_partition(model.layers, pp) if model.layers >= pp else [1] * pp
    space = cpu_kv_space_of(cfg.env.get("VLLM_CPU_KVCACHE_SPACE"))
    batched_eff = cfg.max_num_batched_tokens or batched
    eff = Effective(
        tp=tp, pp=pp, quantization=q, dtype=dtype, dtype_bytes=dbytes,
        kv_dtype_bytes=kv_dtype_bytes(cfg.kv_cache_dtype, dbytes),
        max_model_len=cfg.max_model_len or model.max_position,
        max_num_seqs=cfg.max_num_seqs or seqs,
        max_num_batched_tokens=batched_eff,
        utilization=cfg.gpu_memory_utilization or rules.default_utilization,
        enforce_eager=bool(cfg.enforce_eager), block_size=128 if cpu else 16, pp_partition=part,
        cpu_kv_space_gib=space, cpu_utilization_budget=rules.cpu_utilization_budget,
        **lora_settings(cfg, dbytes), **kv_group_settings(cfg, model, pp, batched_eff, rules.version),
        prefill_first=v0 and not chunked,
    )
    if v0 and cfg.enable_prefix_caching is None:  # V0's default: off (V1 turned it on)
        eff = replace(eff, prefix_caching=False)
    return eff, part_err


def kv_group_settings(cfg: ServerConfig, model: ModelArch, pp: int, max_num_batched_tokens: int,
                      version: str | None) -> dict[str, Any]:
    """The :class:`Effective` fields the KV cache groups need (app.engine.kvcache):
    ``max_in_flight_tokens`` = max_concurrent_batches × max_num_batched_tokens, where
    max_concurrent_batches is 2 with async scheduling on one stage, else
    pipeline_parallel_size (vllm/config/vllm.py:577–598 @ 0.32.0); ``hybrid_kv`` off with
    ``--disable-hybrid-kv-cache-manager`` and, for a model with ``attention_chunk_size``
    (Llama 4), unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1`` and not with
    an EAGLE drafter (vllm/config/vllm.py:2148–2169); prefix caching (on unless
    ``--no-enable-prefix-caching``) and the draft tokens per step."""
    try:
        extra = extra_args_to_dict(cfg.extra_args)
    except ValueError:
        extra = {}
    on = extra.get("async-scheduling")
    asyn = bool(on) if on is not None else async_scheduling_default(version, pp)
    batches = 2 if asyn and pp == 1 else pp
    hybrid = not extra.get("disable-hybrid-kv-cache-manager")
    if model.attention_chunk_size:
        eagle = "eagle" in str((cfg.speculative_config or {}).get("method") or "")
        if eagle or cfg.env.get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "0") in ("", "0"):
            hybrid = False
    return {"max_in_flight_tokens": batches * max_num_batched_tokens, "hybrid_kv": hybrid,
            "prefix_caching": cfg.enable_prefix_caching is not False, "spec_tokens": cfg.num_speculative_tokens}


# ---------------------------------------------------------------------- fixes
def apply_fix(cfg: ServerConfig, fix: dict[str, Any]) -> ServerConfig:
    """``cfg`` with the option values of ``fix`` (``env`` merged, a ``None`` env value
    removed; keys that are not ServerConfig fields edit ``extra_args``, ``None`` drops
    the option). Raises ValueError when the result is not a valid ServerConfig."""
    data = cfg.model_dump()
    extra = extra_args_to_dict(cfg.extra_args)
    for k, v in fix.items():
        if k == "env":
            env = dict(data["env"])
            for ek, ev in v.items():
                if ev is None:
                    env.pop(ek, None)
                else:
                    env[ek] = str(ev)
            data["env"] = env
        elif k in ServerConfig.model_fields:
            data[k] = v
        else:
            opt = k.replace("_", "-")
            if v is None:
                extra.pop(opt, None)
            else:
                extra[opt] = v
    data["extra_args"] = dict_to_extra_args(extra)
    try:
        return ServerConfig(**data)
    except ValidationError as e:
        raise ValueError(str(e)) from e


def fix_to_flags(fix: dict[str, Any]) -> str:
    """A fix as a command-line fragment: ``NCCL_P2P_DISABLE=1 --disable-custom-all-reduce``."""
    parts = []
    for k, v in fix.items():
        if k == "env":
            parts += [f"{ek}={ev}" if ev is not None else f"unset {ek}" for ek, ev in v.items()]
        elif v is True:
            parts.append(f"--{k.replace('_', '-')}")
        elif v is False:
            parts.append(f"--no-{k.replace('_', '-')}")
        elif v is None:
            parts.append(f"(drop --{k.replace('_', '-')})")
        else:
            parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts)


# ---------------------------------------------------------------------- perf model
def kv_windows(m: ModelArch, e: Effective, layers: range) -> tuple[tuple[float, int], ...]:
    """The windowed layers of ``layers`` for the step time (:attr:`StageSpec.kv_windows`):
    (KV bytes per token on one card, window) per window — sliding layers their window,
    chunked ones their chunk, linear-attention layers 0 (their KV bytes in
    :meth:`ModelArch.kv_bytes_per_token` count them as attention). () for a model of
    full-attention layers only."""
    if not m.is_hybrid_kv:
        return ()
    per_tok = m.kv_bytes_per_token(e.kv_dtype_bytes, e.tp, 1)
    out: dict[int, float] = {}
    for i in layers:
        lay = m.layer_kinds[i] if i < len(m.layer_kinds) else FULL
        if lay == SLIDING and m.sliding_window:
            out[m.sliding_window] = out.get(m.sliding_window, 0.0) + per_tok
        elif lay == CHUNKED and m.attention_chunk_size:
            out[m.attention_chunk_size] = out.get(m.attention_chunk_size, 0.0) + per_tok
        elif lay == MAMBA:
            out[0] = out.get(0, 0.0) + per_tok
    return tuple((b, w) for w, b in sorted(out.items()))


def build_step_model(p: Plan, params: PerfParams | None = None) -> StepTimeModel:
    """The step-time model of the planned server: per stage, the slowest card of the
    TP group (lowest bandwidth) and that card's share of weights, parameters and KV
    (in the KV cache dtype: fp8 halves the KV bytes read a step); ``enforce_eager``
    makes each step pay the CUDA graph launch saving per layer (``t_launch_layer_s``);
    ``p.rig`` puts the inter-host link into the all-reduces and stage sends that cross
    hosts (:class:`app.engine.steptime.StepTimeModel`)."""
    m, e = p.model, p.effective
    bpp = quant_bytes_per_param(e.quantization, m.quant_bits if e.quantization == m.quant_method else None,
                                m.quant_group_size if e.quantization == m.quant_method else None, e.dtype_bytes)
    stages = []
    for s in range(e.pp):
        rs = [r for r in p.ranks if r.stage == s]
        slow = min(rs, key=lambda r: r.gpu.bandwidth_gbs)
        layers = slow.layers
        expert_params = sum(m.experts * 3 * m.hidden * m.moe_intermediate for i in layers if m.is_moe_layer(i))
        expert_bytes = expert_params * bpp / e.tp
        active = sum(m.layer_params(i, active=True) for i in layers)
        head = m.embedding_params() if s == e.pp - 1 else 0.0  # lm_head
        active += head
        hd = (m.kv_lora_rank + m.qk_rope_head_dim) if m.is_mla else m.head_dim
        dense = (slow.weights_gib - slow.draft_weights_gib) * GIB - expert_bytes
        # --quantization awq runs AWQ's own GEMM (vLLM keeps awq_marlin for a checkpoint served without the
        # flag or with awq_marlin: AWQMarlinConfig.override_quantization_method)
        awq = p.config.quantization == "awq" and bpp < e.dtype_bytes
        stages.append(StageSpec(
            gpu=slow.gpu, layers=len(layers),
            dense_weight_bytes=dense,
            expert_weight_bytes=expert_bytes, active_params=active / e.tp,
            kv_bytes_per_token=slow.kv_bytes_per_token, attn_heads=m.heads / e.tp, head_dim=hd,
            weight_kernel="awq_gemm" if awq else "",
            dense_weight_bytes_16=dense / bpp * e.dtype_bytes if awq else 0.0,
            kv_windows=kv_windows(m, e, layers), head_params=head / e.tp))
    if params is None:
        params = default_params(stages[0].gpu, e.tp, m.quant_bits if e.quantization else None, p.rules.version,
                                p2p=False if nccl_p2p_disabled(p.config.env) else None)
    extra = extra_args_to_dict(p.config.extra_args)
    steps = max(1, int(extra.get("num-scheduler-steps", 1) or 1))
    on = extra.get("async-scheduling")
    # the CPU build's forward pass runs on the cores that schedule: nothing to overlap
    asyn = (bool(on) if on is not None else async_scheduling_default(p.rules.version, e.pp)) and \
        stages[0].gpu.kind != "cpu"
    draft = None
    d = p.draft
    if d is not None and d.passes and d.weight_bytes > 0:
        last = min((r for r in p.ranks if r.stage == e.pp - 1), key=lambda r: r.gpu.bandwidth_gbs)
        a = d.arch
        layers = a.layers if a is not None else 0
        # params per token on this card: the draft's layers (+ its lm_head: it outputs logits); a head
        # without an arch (Medusa): its weights, all used per token
        act = (sum(a.layer_params(i, True) for i in range(a.layers)) + a.embedding_params()) if a is not None \
            else d.weight_bytes / max(1, e.dtype_bytes)
        stage = StageSpec(gpu=last.gpu, layers=layers, dense_weight_bytes=d.weight_bytes / e.tp, expert_weight_bytes=0.0,
                          active_params=act / e.tp, kv_bytes_per_token=last.draft_kv_bytes_per_token,
                          attn_heads=(a.heads / e.tp) if a is not None else 0.0,
                          head_dim=a.head_dim if a is not None else 0)
        draft = StepTimeModel([stage], params, a.hidden if a is not None else m.hidden, e.tp,
                              max_num_batched_tokens=e.max_num_batched_tokens, rig=p.rig)
    return StepTimeModel(stages, params, m.hidden, e.tp, m.experts if m.is_moe else 0,
                         m.experts_per_tok if m.is_moe else 0, e.max_num_batched_tokens, e.enforce_eager, draft,
                         rig=p.rig, scheduler_steps=steps, async_scheduling=asyn)


# ---------------------------------------------------------------------- the predicted ramp
def engine_curve(p: Plan, w: Workload, capacity: int, capacity_reason: str) -> Curve:
    """The predicted ramp of the whole server from the step-level engine
    (:func:`app.planner.predict.predict_ramp` of ``w.ramp_spec``): per level the load
    generator's own figures — output tokens/s over the level's window, TTFT/TPOT/e2e
    means and p99s of its measured requests (None where the window holds none, as a
    measured level would). ``capacity`` requests run at once on one engine
    (``capacity_reason`` limits it); data parallel replicas get the requests as vLLM's
    load balancer routes them (:class:`app.engine.balance.DpBalancer`). The knee is
    :func:`app.loadgen.stats.find_knee` of those levels (reason "step time" below the
    engines' capacity, else ``capacity_reason``); without one, the capacity. Levels
    default to 1, 2, 4 … up to twice the total capacity."""
    total = capacity * p.dp
    levels = list(w.levels) if w.levels else default_levels(total)
    pred = predict_ramp(p.perf, p.engine_limits(), w.ramp_spec(levels))
    nan = float("nan")
    pts = []
    for st in pred.steps:
        n = int(st.level)
        run = min(n, total)
        pts.append(CurvePoint(n, run, n - run, st.output_tps, st.output_tps / n,
                              st.ttft_mean if st.ttft_mean is not None else nan,
                              st.tpot_mean if st.tpot_mean is not None else nan,
                              st.e2e_mean if st.e2e_mean is not None else nan,
                              st.ttft_p99, st.tpot_p99, st.e2e_p99, st.n_ok, st.steady and st.n_ok > 0))
    knee = find_knee(pred.steps)
    if knee is not None:
        k = int(knee.level)
        return Curve(pts, k, "step time" if k < total else capacity_reason, total, w.prompt_tokens, w.output_tokens)
    return Curve(pts, total, capacity_reason, total, w.prompt_tokens, w.output_tokens)


def peak_output_tps(p: Plan, params: PerfParams | None = None) -> float | None:
    """Predicted output tokens/s of the whole server with every engine full at the
    workload (default :class:`Workload`): one engine at its capacity for the workload's
    requests (:func:`app.engine.steptime.predict_level`, the analytic steady state —
    fast enough to rank every candidate layout) × data_parallel_size. None when the plan
    has no KV cache or an invalid layer partition (nothing to predict)."""
    if p.partition_error is not None or not p.ranks or any(r.kv_tokens <= 0 for r in p.ranks):
        return None
    w = p.workload or Workload()
    cap, _ = p.concurrency_for(w.prompt_tokens, w.output_tokens)
    if cap <= 0:
        return None
    perf = build_step_model(p, params)
    return predict_level(perf, cap, w.prompt_tokens, w.output_tokens, cap).output_tps * p.dp


# ---------------------------------------------------------------------- entry point
def _build(cfg: ServerConfig, gpus: list[GpuSpec], model: ModelArch, workload: Workload | None,
           rules: VllmRules, host: HostPcie | None = None, rig: RigLayout | None = None) -> Plan:
    if not gpus:
        raise ValueError("plan needs at least one GPU: give --gpu NAME (and --count N)")
    tp, pp, dp = cfg.tensor_parallel_size or 1, cfg.pipeline_parallel_size or 1, cfg.data_parallel_size or 1
    world = tp * pp
    cards = [gpus[i % len(gpus)] for i in range(world * dp)]
    eff, part_err = effective_settings(cfg, model, cards[:world], rules)
    draft = draft_of(cfg, model, eff.dtype_bytes)
    ranks = []
    for r in range(dp):  # each data parallel replica on cards r·world … (vllm/v1/engine/utils.py)
        ranks += [replace(x, rank=x.rank + r * world)
                  for x in plan_ranks(model, eff, cards[r * world:(r + 1) * world], draft)]
    p = Plan(cfg, model, list(gpus), cards, rules, eff, ranks, workload, part_err, host=host, draft=draft, rig=rig)
    p.findings = [f for f in (c(p) for c in CHECKS) if f is not None]
    return p


def _fixed_passes(q: Plan, problem: str, errors_before: frozenset[str] = frozenset()) -> bool:
    """Whether ``q`` (a plan with a candidate fix applied) no longer shows ``problem``
    and has no error that the unfixed plan did not have (``errors_before``): with two
    errors, each one's fix is offered, not "none" because the other error remains."""
    new_errors = {f.problem for f in q.findings if f.verdict == "error"} - errors_before
    return not new_errors and problem not in q.problems()


def _passes(cfg: ServerConfig, gpus: list[GpuSpec], model: ModelArch, workload: Workload | None,
            rules: VllmRules, problem: str, errors_before: frozenset[str] = frozenset(),
            host: HostPcie | None = None, rig: RigLayout | None = None) -> bool:
    """:func:`_fixed_passes` for the plan of ``cfg`` (False when it cannot be planned)."""
    try:
        q = _build(cfg, gpus, model, workload, rules, host, rig)
    except ValueError:
        return False
    return _fixed_passes(q, problem, errors_before)


def _rank_layouts(config: ServerConfig, f: Finding, gpus: list[GpuSpec], model: ModelArch,
                  workload: Workload | None, rules: VllmRules, errors: frozenset[str], host: HostPcie | None,
                  params_for: Any, rig: RigLayout | None = None) -> list[tuple[dict[str, Any], float]]:
    """``f.layouts`` whose plan passes (:func:`_fixed_passes`) and fits the cards (a KV
    cache on every rank, a valid layer partition), with their :func:`peak_output_tps`,
    highest first (ties: fewer cards, then the order of ``f.layouts``)."""
    out = []
    for i, cand in enumerate(f.layouts):
        try:
            q = _build(apply_fix(config, cand), gpus, model, workload, rules, host, rig)
        except ValueError:
            continue
        if not _fixed_passes(q, f.problem, errors):
            continue
        tps = peak_output_tps(q, params_for(q))
        if tps is not None:
            out.append((len(q.cards), i, cand, tps))
    out.sort(key=lambda x: (-x[3], x[0], x[1]))
    return [(cand, tps) for _, _, cand, tps in out]


def plan_for(engine: Engine | str, config: ServerConfig, gpus: list[GpuSpec], model: ModelArch,
             workload: Workload | None = None, vllm_version: str | None = None, *, host: HostPcie | None = None,
             spec_acceptance: float | None = None, rig: RigLayout | None = None, predict: bool = True,
             use_calibration: bool = True, params: PerfParams | None = None) -> Plan:
    """The one composition of a plan for a launch of ``engine`` (an
    :class:`app.engines.Engine` or its name): :func:`plan` with the engine's vLLM rules
    (``engine.plan_version(vllm_version)``: the sim's pinned rules, else ``vllm_version``,
    the server's version; None → the newest known) and its calibration (a saved one for
    the cards only where ``engine.spec.calibrated`` and ``use_calibration``; the sim's
    step times are its own defaults). The window, ``vllm-dyno run``/``plan``/``calibrate``
    and a profile's plan (:func:`app.run.profile_run.plan_profile`) all plan through it.
    Other arguments as :func:`plan`."""
    eng = Engine(engine)
    return plan(config, gpus, model, workload, eng.plan_version(vllm_version), params=params,
                use_calibration=use_calibration and eng.spec.calibrated, host=host, predict=predict,
                spec_acceptance=spec_acceptance, rig=rig)


def check(config: ServerConfig, gpus: list[GpuSpec], model: ModelArch, workload: Workload | None = None,
          vllm_version: str | None = None, rig: RigLayout | None = None) -> Plan:
    """The plan's memory and its findings without the search for fixes, the step model
    or the prediction: a few milliseconds, for a search over many configurations (the
    tuner's pruning). ``findings`` carry no ``fix``. Raises ValueError when ``gpus`` is
    empty."""
    return _build(config, gpus, model, workload, rules_for(vllm_version), rig=rig)


def plan(config: ServerConfig, gpus: list[GpuSpec], model: ModelArch, workload: Workload | None = None,
         vllm_version: str | None = None, params: PerfParams | None = None,
         use_calibration: bool = True, host: HostPcie | None = None, predict: bool = True,
         spec_acceptance: float | None = None, rig: RigLayout | None = None) -> Plan:
    """Plan ``config`` on ``gpus`` (one GpuSpec per card, in CUDA order; mixed cards
    allowed: pipeline stage s runs on cards s·TP … s·TP+TP−1; data parallel replica r
    on the next TP × PP cards) for ``model``.

    ``vllm_version`` selects version rules (None → the newest known; callers that know
    the installed version pass it, see app.planner.versions.installed_version).
    ``params`` overrides the performance parameters; otherwise a saved calibration for
    these cards is used when ``use_calibration``, else the per-class defaults.
    ``host``: the IOMMU/ACS of the machine the cards are in
    (:func:`app.planner.pcie.read_host_pcie` for this one; None: unknown). ``rig``: the
    hosts the cards sit in and the link between them (:func:`app.planner.gpus.rig_layout`;
    None: one host) — the step model sends what crosses hosts over the link, the checks
    warn when a TP group spans hosts, and a calibration is looked up for the rig
    (:func:`app.planner.calibrate.hardware_fingerprint`).

    Each finding gets the first of its ``candidates`` that passes; failing that, of
    its ``layouts`` (parallel splits) the one with the highest predicted peak output
    tokens/s (:func:`peak_output_tps`) among those that pass and fit the cards
    (``alternatives`` keeps them all, ranked). Raises ValueError when ``gpus`` is empty.

    With ``predict`` (and a plan that fits), the curve and the predicted users at the
    workload's SLO come from the step-level engine (:func:`engine_curve`,
    :func:`app.planner.predict.predict_ramp`): about 0.1–2 s, cached; ``predict=False``
    leaves ``curve`` and ``capacity`` None (the sim's own plan, the diagnosis).
    ``spec_acceptance``: with a speculative config, the chance each draft position is
    accepted given the one before, for the prediction (None: :data:`DEFAULT_ACCEPTANCE`).
    """
    rules = rules_for(vllm_version)
    p = _build(config, gpus, model, workload, rules, host, rig)
    if spec_acceptance is not None:
        p.spec_acceptance = spec_acceptance
    errors = frozenset(f.problem for f in p.findings if f.verdict == "error")
    calibrations: dict[str, PerfParams | None] = {}

    def params_for(q: Plan) -> PerfParams | None:
        if params is not None or not use_calibration:
            return params
        key = hardware_fingerprint(q.cards, rig)
        if key not in calibrations:
            calibrations[key] = load_calibration(key)
        return calibrations[key]

    for f in p.findings:
        for cand in f.candidates:
            try:
                fixed = apply_fix(config, cand)
            except ValueError:
                continue
            if _passes(fixed, gpus, model, workload, rules, f.problem, errors, host, rig):
                f.fix = cand
                break
        if f.fix is None and f.layouts:
            f.alternatives = _rank_layouts(config, f, gpus, model, workload, rules, errors, host, params_for, rig)
            if f.alternatives:
                f.fix = f.alternatives[0][0]
    own = params_for(p)
    if all(r.kv_tokens > 0 for r in p.ranks) and p.partition_error is None:
        p.perf = build_step_model(p, own)
        w = workload or Workload()
        cap, why = p.concurrency_for(w.prompt_tokens, w.output_tokens)
        if cap > 0 and predict:
            p.curve = engine_curve(p, w, cap, why)
            search = w.search_spec()
            if search is not None:
                p.capacity = predict_ramp(p.perf, p.engine_limits(), search).capacity
    return p
