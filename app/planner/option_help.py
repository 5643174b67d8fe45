"""What each vLLM option of the form means for this rig (issue 19, item 5): vLLM's default
for the installed version on these cards, and the planner's advice for the current
configuration — the text of the form's tooltips, computed from a :class:`Plan` so that
the tooltip and the plan cannot disagree.

Defaults (vLLM 0.32.0 unless noted; the version data in ``data/vllm_versions.yaml``):
``max_num_seqs``/``max_num_batched_tokens`` by card memory and the CPU build
(``vllm/engine/arg_utils.py`` ``get_batch_defaults``), ``gpu_memory_utilization``
(``vllm/config/cache.py``), ``max_model_len`` the model's ``max_position_embeddings``
(``vllm/config/model.py``), ``dtype`` auto: the checkpoint's ``torch_dtype`` (float16
below compute capability 8.0), ``kv_cache_dtype`` auto: the model's dtype, prefix
caching on for generative models (V1 engine), CUDA graphs on, the executor ``mp`` for
more than one rank of a node (``vllm/config/parallel.py``), ``uni`` for one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.config import VLLM_OPTIONS
from app.engine.specdecode import DEFAULT_ACCEPTANCE
from app.planner.plan import Plan
from app.planner.versions import option_accepted, v0_batch_defaults, v0_engine

#: fields whose default does not depend on the rig, in words
_STATIC_DEFAULTS = {
    "tensor_parallel_size": "1",
    "pipeline_parallel_size": "1",
    "data_parallel_size": "1",
    "quantization": "the checkpoint's own (none for a 16-bit checkpoint)",
    "enforce_eager": "off (CUDA graphs are captured)",
    "disable_custom_all_reduce": "off (vLLM's custom all-reduce where the cards allow it)",
    "enable_prefix_caching": "on for generative models (vLLM's V1 engine)",
    "served_model_name": "the model's name or path",
    "host": "vLLM: 0.0.0.0 (every interface); this app: 127.0.0.1 unless you expose it",
    "port": "vLLM: 8000; this app: a free port chosen at launch",
    "speculative_config": "off (one token per step); ngram needs no draft model, eagle/eagle3/medusa/draft_model "
                          "need one in \"model\", mtp uses the model's own next-token layers "
                          "(vllm/config/speculative.py); the CPU build runs it too (vLLM 0.32, ngram measured)",
}


@dataclass
class OptionNote:
    """One option's tooltip facts: ``default`` in words (for the rig and version of the
    plan), ``advice``: the planner's sentences about it (each with its fix, if any)."""

    default: str
    advice: list[str] = field(default_factory=list)


def _fmt(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def option_defaults(plan: Plan) -> dict[str, str]:
    """vLLM's default of each form option for the plan's cards and vLLM version."""
    e, r = plan.effective, plan.rules
    card = min(plan.cards or plan.gpus, key=lambda g: g.memory_gib)
    cpu = card.kind == "cpu"
    seqs, mnbt = r.batch_defaults(card.memory_gib, card.name, e.tp * e.pp if cpu else 0)
    if v0_engine(r.version) and not cpu:  # the V0 engine's, whatever the card
        seqs, mnbt = v0_batch_defaults(e.max_model_len, not e.prefill_first)
    where = f"vLLM {r.version}, " + ("the CPU build" if cpu else f"{card.name} {card.memory_gib:.0f} GiB")
    out = dict(_STATIC_DEFAULTS)
    out.update({
        "max_num_seqs": f"{seqs:,} ({where})",
        "max_num_batched_tokens": f"{mnbt:,} ({where})",
        "gpu_memory_utilization": f"{r.default_utilization:.2f} (vLLM {r.version})"
                                  + ("; the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE"
                                     if cpu and not e.cpu_budget_from_utilization else ""),
        "max_model_len": f"{plan.model.max_position:,} tokens (the model's max_position_embeddings)",
        "dtype": f"auto → {e.dtype} for this model on these cards",
        "kv_cache_dtype": f"auto → the model's dtype ({e.dtype_bytes} bytes an element)",
        "distributed_executor_backend": "mp (worker processes) for more than one rank, else uni"
                                        + (" — the app picks uni on the CPU build" if cpu else ""),
    })
    # admission control: unset in vLLM's SchedulerConfig (vllm/config/scheduler.py @ 0.32.0)
    for key, unset in (("max_num_active_seqs", f"max_num_seqs ({seqs:,}): every running slot is used"),
                       ("max_num_queued_reqs", "no cap: every request is queued (none gets HTTP 503)"),
                       ("max_num_queued_tokens", "no cap: every prompt is queued (none gets HTTP 503)")):
        opt = VLLM_OPTIONS[key]
        out[key] = (f"{unset} (vLLM {r.version})" if option_accepted(opt, r.version)
                    else f"not in vLLM {r.version} (from {opt.min_vllm}): the launch refuses it")
    return out


def _figures(plan: Plan) -> dict[str, list[str]]:
    """The plan's own numbers that bear on an option."""
    e = plan.effective
    out: dict[str, list[str]] = {}
    kv = plan.kv_cache_tokens
    if kv > 0:
        out.setdefault("gpu_memory_utilization", []).append(
            f"at {e.utilization:.2f} the KV cache holds {kv:,} tokens per engine")
        out.setdefault("max_model_len", []).append(
            f"{plan.max_concurrency:.1f} requests of {e.max_model_len:,} tokens fit in the KV cache at once")
        out.setdefault("kv_cache_dtype", []).append(
            f"{plan.kv_bytes_per_token:,} bytes of KV cache per token; fp8 halves it (twice the tokens)")
    if plan.workload is not None:
        n, limit = plan.concurrency_for(plan.workload.prompt_tokens, plan.workload.output_tokens)
        out.setdefault("max_num_seqs", []).append(
            f"{n:,} requests of the ramp's shape run at once per engine, limited by {limit}")
    d = plan.draft
    if d is not None and plan.ranks:
        last = plan.ranks[-1]
        out.setdefault("speculative_config", []).append(
            f"{d.method}, {d.k} draft tokens a step: {d.note}; {last.draft_weights_gib:.2f} GiB of draft weights and "
            f"{last.draft_kv_bytes_per_token:,} B/token of draft KV cache per card come off the KV budget "
            f"({plan.kv_cache_tokens:,} KV tokens left)")
        if plan.curve is not None and plan.curve.points:
            p0 = plan.curve.points[0]
            out["speculative_config"].append(
                f"predicted at 1 user: {p0.output_tps:.0f} output tok/s, TPOT {p0.tpot_s * 1000:.1f} ms, with each "
                f"draft position accepted at {plan.spec_acceptance:g} of the one before (the sim's "
                f"--sim-spec-acceptance; default {DEFAULT_ACCEPTANCE})")
    if plan.capacity is not None:
        out.setdefault("max_num_seqs", []).append(
            f"predicted {plan.capacity.users:g} concurrent users at the Ramp tab's SLO")
    return out


def option_notes(plan: Plan) -> dict[str, OptionNote]:
    """Every option's default and the planner's advice: the findings whose fix sets it
    ("Fix: max_model_len 49,296") and the plan's figures that depend on it."""
    notes = {k: OptionNote(v) for k, v in option_defaults(plan).items()}
    for f in plan.findings:
        for key, val in (f.fix or {}).items():
            if key in notes and f.verdict in ("warn", "error"):
                notes[key].advice.append(f"{f.message} Fix: {key} {_fmt(val)}.")
    for key, lines in _figures(plan).items():
        notes[key].advice.extend(lines)
    return notes
