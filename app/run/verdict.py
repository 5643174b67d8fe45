"""The verdict: *N users at your SLO, with these flags* — one object and one sentence for
every finished ramp or capacity search (issue 17).

Inputs: the levels (StepStats, rig seconds) and their requests, the SLO, what the server
and the cards showed while the level above the capacity ran (:class:`LevelObservation`:
``/metrics`` queue and KV figures, NVML throttle reasons), the level's energy, the
server's options, the rig and the prices from Settings. Output: :class:`Verdict`.

What limits the capacity is read from the first level that broke the SLO, in this order:
failures; admission control (the server refused more than ``--slo-rejection-rate`` of the
requests with HTTP 503: its ``--max-num-queued-reqs`` / ``--max-num-queued-tokens``); KV capacity (preemptions, or the KV cache ≥ 98 % full); ``max_num_seqs``
(requests queued while the running batch was at ``max_num_seqs``); GPU throttling
(NVML's limiting clock-event reasons, app.telemetry.throttle.LIMITING); then the bound
it broke: TTFT (prefills queue), TPOT or e2e (decode speed). The next thing to try
follows from it, with option values as ``ServerConfig`` fields where one applies.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from pydantic import BaseModel

from app.loadgen.capacity import Capacity, fmt_users, slo_text
from app.loadgen.server_stats import ttft_cause
from app.loadgen.stats import StepStats
from app.settings import Pricing
from app.telemetry import names
from app.telemetry.derived import cost_per_mtok
from app.telemetry.throttle import LIMITING, decode

#: a KV cache this full (0–1) at the level above the capacity counts as the limit
KV_FULL = 0.98
#: the running batch counts as pinned at max_num_seqs from this fraction of it
SEQS_PINNED = 0.9

#: server options the sentence names when set (in this order; tensor_parallel_size always)
FLAG_FIELDS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "quantization",
               "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
               "max_model_len", "enable_prefix_caching", "enforce_eager", "speculative_config",
               "max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens")


#: the limit codes in words
LIMIT_NAMES = {"failures": "failures", "rejections": "admission control (HTTP 503)", "kv_cache": "KV cache capacity", "max_num_seqs": "max_num_seqs",
               "throttling": "GPU throttling", "ttft": "time to first token (TTFT)",
               "ttfa": "time to first answer token (TTFA, after the reasoning)", "tpot": "decode speed (TPOT)",
               "e2e": "end-to-end latency", "max_level": "the highest level probed", "none": "nothing measured"}


@dataclass(frozen=True)
class LevelObservation:
    """What the server and the cards showed during one level's window: mean requests
    running and waiting (``/metrics``), the KV cache's highest use (0–1), preemptions
    in the window (count), and the limiting NVML clock-event reasons seen (names).
    None where the series was not there (attach without /metrics, the CPU build)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage_max: float | None = None
    preemptions: float | None = None
    throttle: tuple[str, ...] = ()


def _window(bank: Any, source: str, name: str, t0: float, t1: float) -> np.ndarray:
    t, v = bank.get(source, name)
    if t.size == 0:
        return np.empty(0)
    v = v[(t >= t0) & (t <= t1)]
    return v[np.isfinite(v)]


def observe(bank: Any, st: StepStats, time_scale: float = 1.0) -> LevelObservation:
    """The :class:`LevelObservation` of level ``st`` (rig seconds) from a live
    :class:`app.telemetry.series.SeriesBank` on the session clock (wall seconds: the
    window ÷ ``time_scale``). Source ``metrics`` for the server, ``gpuN`` for cards."""
    k = time_scale or 1.0
    t0, t1 = st.window_start / k, st.window_end / k

    def mean(name: str) -> float | None:
        v = _window(bank, "metrics", name, t0, t1)
        return float(v.mean()) if v.size else None

    kv = _window(bank, "metrics", names.KV_CACHE_USAGE_MAX, t0, t1)
    if not kv.size:
        kv = _window(bank, "metrics", names.KV_CACHE_USAGE, t0, t1)
    pre = _window(bank, "metrics", names.PREEMPTIONS_TOTAL, t0, t1)
    reasons: list[str] = []
    for src, name in bank.keys():
        if name == names.THROTTLE_REASONS and src.startswith("gpu"):
            for m in _window(bank, src, name, t0, t1):
                for r in decode(int(m) & LIMITING) or []:
                    if r not in reasons:
                        reasons.append(r)
    return LevelObservation(running=mean(names.RUNNING), waiting=mean(names.WAITING),
                            kv_usage_max=float(kv.max()) if kv.size else None,
                            preemptions=float(pre[-1] - pre[0]) if pre.size > 1 else None,
                            throttle=tuple(reasons))


class Verdict(BaseModel):
    """The answer for one ramp. ``users`` (None without an SLO), ``users_low`` /
    ``users_high`` its interval, ``repeats``; ``rig`` ("8× RTX 4090 (sim)"), ``model``;
    ``slo`` the bounds; at the capacity level: ``output_tps`` (tokens/s), ``j_per_token``
    (J, None without power readings), ``cost_per_mtok`` (``currency`` per million output
    tokens, rented + energy: app.telemetry.derived.cost_per_mtok; None without prices); ``flags`` the server options in force; ``limited_by`` a code
    (``failures``, ``rejections``, ``kv_cache``, ``max_num_seqs``, ``throttling``, ``ttft``, ``ttfa``, ``tpot``,
    ``e2e``, ``max_level``, ``none``) and ``limit`` its evidence in words; ``next_try``
    what to change and ``next_fix`` it as option values (or None); ``sentence`` all of it
    in one line; ``few_requests`` when the capacity's p99 came from < 100 requests;
    ``indicative`` when a fixed ramp's short levels gave it (:func:`is_indicative`)."""

    users: float | None = None
    users_low: float | None = None
    users_high: float | None = None
    repeats: int = 1
    mode: str = "concurrency"
    rig: str = ""
    model: str = ""
    slo: dict = {}
    output_tps: float | None = None
    j_per_token: float | None = None
    cost_per_mtok: float | None = None
    currency: str = "$"
    flags: dict = {}
    limited_by: str = "none"
    limit: str = ""
    next_try: str = ""
    next_fix: dict | None = None
    few_requests: bool = False
    requests: int = 0
    indicative: bool = False
    sentence: str = ""


#: what a verdict from short fixed levels says of itself (the window's exploratory ramp,
#: ``vllm-dyno ramp --levels``, ``run`` of a profile with levels): issue 37 item 1
INDICATIVE_NOTE = ("Indicative only: a fixed ramp's p99 from few requests a level, its start-up burst "
                   "included — the number to plan with is a capacity search's (Run ramp's default, "
                   "ramp --find-capacity)")


def is_indicative(spec: Any, cap: Capacity) -> bool:
    """Whether a ramp's users at the SLO are indicative only: a fixed ramp (no
    ``search``) whose capacity level's p99 came from fewer than P99_MIN_REQUESTS requests
    or whose levels counted their users' first requests (the start-up burst: not
    ``settles``). A capacity search's answer, or a fixed ramp with settled levels of ≥ 100
    requests (``benchmarks/capacity_search.py``'s ``fixed→stop``), is not."""
    if getattr(spec, "search", None) is not None or getattr(spec, "mode", "concurrency") != "concurrency":
        return False
    return bool(cap.few_requests or not spec.settles)


def model_label(model: str) -> str:
    """A model id or path as the sentence names it: ``meta-llama/Llama-3-70B`` → the id
    as given, a local folder → its name (``build/tiny-llama`` → ``tiny-llama``)."""
    m = model.rstrip("/")
    if m.startswith(("/", ".", "~")) or m.count("/") > 1 or Path(m).expanduser().is_dir():
        return m.rsplit("/", 1)[-1]
    return m


def _flags(config: Mapping[str, Any] | None) -> dict[str, Any]:
    if not config:
        return {}
    out = {k: config[k] for k in FLAG_FIELDS if config.get(k) not in (None, False)}
    out.setdefault("tensor_parallel_size", config.get("tensor_parallel_size") or 1)
    return {k: out[k] for k in FLAG_FIELDS if k in out}


def _spec_text(v: Any) -> str:
    """A ``--speculative-config`` value (its dict, or the JSON text a vLLM config holds) in
    words: ``speculative decoding (ngram, 3 draft tokens)``."""
    d = v
    if isinstance(v, str):
        try:
            d = json.loads(v)
        except ValueError:
            return f"speculative_config {v}"
    if not isinstance(d, dict):
        return f"speculative_config {v}"
    m = d.get("method") or ("ngram" if d.get("model") in ("ngram", "[ngram]") else "draft_model")
    what = f"{m} {d['model']}" if d.get("model") and m not in ("ngram", "suffix") else str(m)
    k = d.get("num_speculative_tokens")
    return f"speculative decoding ({what}" + (f", {k} draft tokens)" if k else ")")


def _flag_text(flags: Mapping[str, Any]) -> str:
    return ", ".join(_spec_text(v) if k == "speculative_config" else
                     k if v is True else f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in flags.items())


def flags_text(config: Mapping[str, Any] | None) -> str:
    """The server options the verdict's sentence names for ``config`` (a ServerConfig
    dump or a vLLM config mapping), in words: ``tensor_parallel_size 8, …``."""
    return _flag_text(_flags(config))


def _limit(cap: Capacity, nxt: StepStats | None, obs: LevelObservation | None, flags: Mapping[str, Any],
           plan: Mapping[str, Any] | None, mean_tokens: float | None, gpus: int) -> tuple[str, str, str, dict | None]:
    """(code, evidence, next thing to try, its option values) for the level above the capacity."""
    eff = (plan or {}).get("effective") or {}
    seqs = flags.get("max_num_seqs") or eff.get("max_num_seqs")
    if nxt is None:
        if cap.users <= 0:
            return "none", "no level ran", "", None
        return ("max_level", f"every level probed met the SLO, up to {fmt_users(cap.users, cap.mode)}",
                "probe higher (--max-users) to find where it breaks", None)
    at = fmt_users(nxt.level, cap.mode)
    if "failures" in cap.limited_by:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(nxt.failures.items())) or "none counted"
        return ("failures", f"{nxt.failure_rate:.0%} of the requests failed at {at} ({kinds})",
                "read the server log around that level for the cause", None)
    if "rejections" in cap.limited_by:
        limits = ", ".join(f"{k} {flags[k]}" for k in ("max_num_queued_reqs", "max_num_queued_tokens") if flags.get(k))
        return ("rejections", f"the server refused {nxt.rejection_rate:.0%} of the requests with HTTP 503 at {at} "
                              f"({nxt.rejected} rejected; admission control{': ' + limits if limits else ''})",
                "the queue limit holds the TTFT by refusing: raise max_num_queued_reqs / max_num_queued_tokens to "
                "admit more (at a longer TTFT) or add capacity", None)
    o = obs or LevelObservation()
    if (o.preemptions or 0) > 0 or (o.kv_usage_max is not None and o.kv_usage_max >= KV_FULL):
        ev = f"the KV cache was {o.kv_usage_max:.0%} full" if o.kv_usage_max is not None else "the KV cache was full"
        if o.preemptions:
            ev += f" and vLLM preempted {o.preemptions:.0f} requests"
        fix: dict | None = None
        if flags.get("kv_cache_dtype") in (None, "auto"):
            fix = {"kv_cache_dtype": "fp8"}
            tip = "fit more KV: kv_cache_dtype fp8 (about twice the tokens), a higher gpu_memory_utilization or more cards"
        else:
            tip = "fit more KV: a higher gpu_memory_utilization, a shorter max_model_len or more cards"
        return "kv_cache", f"{ev} at {at}", tip, fix
    if seqs and o.running is not None and o.running >= SEQS_PINNED * seqs and (o.waiting or 0) >= 1:
        target = 2 * int(seqs)
        kv_tokens = (plan or {}).get("kv_cache_tokens")
        if kv_tokens and mean_tokens:
            target = min(target, int(kv_tokens // mean_tokens))
        ev = (f"at {at} the running batch held {o.running:.0f} of max_num_seqs {seqs} while "
              f"{o.waiting:.0f} requests waited")
        if target > seqs:
            return "max_num_seqs", ev, f"max_num_seqs is the limit: raise it to {target}", {"max_num_seqs": target}
        return "max_num_seqs", ev, "max_num_seqs is the limit, and the KV cache holds no more: add cards", None
    if o.throttle:
        return ("throttling", f"the GPUs were held back ({', '.join(o.throttle)}) at {at}",
                "check cooling, fan curves and the power limit (nvidia-smi -q -d PERFORMANCE)", None)
    broke = cap.limited_by.split(", ")
    if "ttft" in broke and "tpot" not in broke:
        batched = flags.get("max_num_batched_tokens") or eff.get("max_num_batched_tokens")
        cause = ttft_cause(nxt.server)
        if cause is None:  # no server figures: queueing and prefill cannot be told apart
            why, bound = "new requests wait for prefills (queueing or prefill: the server's /metrics would tell)", \
                "TTFT-bound"
        elif cause[0] == "queueing":
            why, bound = (f"mostly queueing (queue time {cause[1]:.0%} of the server's TTFT): new requests wait "
                          f"for a place in a step's token budget"), "queue-bound"
        else:
            why, bound = (f"mostly prefill (queue time {cause[1]:.0%} of the server's TTFT): the prompts' prefill "
                          f"itself is slow"), "prefill-bound"
        ev = f"TTFT p99 {nxt.ttft_p99:.3g} s at {at}: {why}" if nxt.ttft_p99 else f"{at}: {why}"
        if batched:
            return ("ttft", ev, f"{bound}: raise max_num_batched_tokens to {2 * int(batched)}",
                    {"max_num_batched_tokens": 2 * int(batched)})
        return "ttft", ev, f"{bound}: raise max_num_batched_tokens", None
    if "ttfa" in broke and "tpot" not in broke and "e2e" not in broke:
        think = f" after {nxt.reasoning_tokens_mean:.0f} reasoning tokens a request" \
            if nxt.reasoning_tokens_mean else ""
        ev = (f"time to first answer token p99 {nxt.ttfa_p99:.3g} s at {at}{think}" if nxt.ttfa_p99 else at)
        return ("ttfa", ev, "reasoning-bound: a thinking budget (vLLM 0.32's thinking_token_budget request field) "
                            "or faster decode (TPOT) brings the answer sooner", None)
    code = "tpot" if "tpot" in broke else "e2e"
    val = nxt.tpot_p99 if code == "tpot" else nxt.e2e_p99
    ev = f"{code.upper()} p99 {val:.3g} s at {at}: each decode step is too slow for the bound" if val else at
    if code == "tpot" and "ttft" in broke and nxt.ttft_p99:
        ev += f" (and TTFT p99 {nxt.ttft_p99:.3g} s: the steps that carry prefills slow every decode)"
    tp = int(flags.get("tensor_parallel_size") or 1)
    pp = int(flags.get("pipeline_parallel_size") or 1)
    if gpus > tp * pp and gpus % (2 * tp * pp) == 0:
        return (code, ev, f"decode-bound: spread each step over more cards — tensor_parallel_size {2 * tp}",
                {"tensor_parallel_size": 2 * tp})
    return code, ev, "decode-bound: a faster quantization, fewer sequences per step (max_num_seqs) or faster cards", None


def build_verdict(cap: Capacity, steps: Sequence[StepStats], *, rig: str, model: str, gpus: int,
                  config: Mapping[str, Any] | None = None, observation: LevelObservation | None = None,
                  j_per_token: float | None = None, pricing: Pricing | None = None,
                  plan: Mapping[str, Any] | None = None,
                  mean_tokens: float | None = None, has_slo: bool = True) -> Verdict:
    """The verdict of a finished ramp or search: ``cap`` its :class:`Capacity` (rig
    units), ``steps`` its levels, ``observation`` of the first level that broke the SLO,
    ``j_per_token`` at the capacity level, ``pricing`` from Settings, ``plan`` the planner's ``as_dict()`` (for the
    KV room behind a max_num_seqs raise), ``mean_tokens`` a request's mean prompt +
    output tokens, ``gpus`` the cards the server uses."""
    flags = _flags(config)
    if not has_slo:
        from app.loadgen.stats import peak_level  # deferred: only a ramp without an SLO needs the peak here
        best = peak_level(steps)
        v = Verdict(rig=rig, model=model, flags=flags, mode=cap.mode, limited_by="none",
                    output_tps=best.output_tps if best else None)
        if best is not None:
            v.sentence = (f"{rig} peaks at {best.output_tps:.0f} output tok/s at {fmt_users(best.level, cap.mode)} of "
                          f"{model}; no SLO was set, so no users-at-SLO answer: set a TTFT/TPOT p99 target.")
        else:
            v.sentence = f"No level of {model} on {rig} completed."
        v.next_try = "set an SLO (TTFT p99, TPOT p99) and run a capacity search"
        return v
    nxt = next((s for s in steps if s.level == cap.next_users), None) if cap.next_users is not None else None
    code, limit, tip, fix = _limit(cap, nxt, observation, flags, plan, mean_tokens, gpus)
    parts = [c for c in cost_per_mtok(cap.output_tps, gpus, j_per_token, pricing or Pricing()) if c is not None]
    cost = sum(parts) if parts else None
    v = Verdict(users=cap.users, users_low=cap.users_low, users_high=cap.users_high, repeats=cap.repeats,
                mode=cap.mode, rig=rig, model=model, slo=cap.slo, output_tps=cap.output_tps,
                j_per_token=j_per_token, cost_per_mtok=cost,
                currency=(pricing or Pricing()).currency, flags=flags, limited_by=code, limit=limit,
                next_try=tip, next_fix=fix, few_requests=cap.few_requests, requests=cap.requests)
    v.sentence = verdict_sentence(v)
    return v


@dataclass(frozen=True)
class Tried:
    """What a tune knows of the configuration a verdict's next step (``next_fix``) leads
    to: ``users`` at the SLO there (measured, else predicted; None when it cannot run:
    ``why``), ``measured``, and ``worse``: by the tune's objective, no better than the
    configuration the verdict is of."""

    users: float | None
    measured: bool
    worse: bool
    why: str = ""


def against_tune(v: Verdict, tried: Tried | None) -> Verdict:
    """``v`` with its next step held against what a tune measured or predicted of it
    (issue 37 item 4): a step to a configuration the tune measured or predicted worse
    (or found cannot run) is not proposed — the next step says it was tried and how it
    fared, and ``next_fix`` is dropped; one the tune predicted better but did not measure
    keeps its step and says so. ``v`` itself when it has no ``next_fix`` or the tune
    knows nothing of it (``tried`` None)."""
    if v.next_fix is None or tried is None:
        return v
    what = _flag_text(v.next_fix)
    here = f"{v.users:g}" if v.users is not None else "?"
    how = "measured" if tried.measured else "predicted"
    if tried.users is None:
        nxt, fix = f"not {what}: the tune found it cannot run here ({tried.why or 'no users at the SLO'})", None
    elif tried.worse:
        nxt, fix = (f"not {what}: the tune {how} it no better ({tried.users:g} users against {here}); "
                    f"these flags are the best the tune found"), None
    elif tried.measured:
        return v
    else:
        nxt, fix = f"{v.next_try} (the tune predicted {tried.users:g} users there but did not measure it)", v.next_fix
    out = v.model_copy(update={"next_try": nxt, "next_fix": fix})
    out.sentence = verdict_sentence(out)
    return out


def verdict_sentence(v: Verdict) -> str:
    """*"8× RTX 4090 (sim) serves 21 concurrent users of Llama-3-70B AWQ at TTFT p99 ≤ 2 s
    and TPOT p99 ≤ 100 ms — 410 output tok/s, 0.9 J/token, $0.31 per M tokens — with
    tensor_parallel_size 8, max_num_seqs 32 (±2 users, 3 repeats). Limited by …; next: …"*"""
    if v.users is None:
        return v.sentence
    rate = v.mode == "rate"
    if v.users <= 0:
        s = f"{v.rig} serves no level of {v.model} probed at {slo_text(v.slo)}"
    else:
        who = f"{v.users:.3g} requests/s" if rate else f"{v.users:g} concurrent user{'' if v.users == 1 else 's'}"
        s = f"{v.rig} serves {who} of {v.model} at {slo_text(v.slo)}"
    figs = []
    if v.output_tps is not None and v.users > 0:
        figs.append(f"{v.output_tps:.0f} output tok/s")
    if v.j_per_token is not None and v.users > 0:
        figs.append(f"{v.j_per_token:.2g} J/token")
    if v.cost_per_mtok is not None and v.users > 0:
        figs.append(f"{v.currency}{v.cost_per_mtok:.2f} per M tokens")
    if figs:
        s += " — " + ", ".join(figs) + (" —" if v.flags else "")
    if v.flags:
        s += f" with {_flag_text(v.flags)}"
    extra = []
    if v.users_low is not None and v.users_high is not None and (v.users_low != v.users or v.users_high != v.users):
        half = max(v.users - v.users_low, v.users_high - v.users)
        if math.isclose(v.users - v.users_low, v.users_high - v.users):
            extra.append(f"±{half:g}" + ("" if rate else " users"))
        else:
            extra.append(f"{v.users_low:g}–{v.users_high:g}" + ("" if rate else " users"))
    if v.repeats > 1:
        extra.append(f"{v.repeats} repeats")
    if v.few_requests:
        extra.append(f"p99 from {v.requests} requests")
    if extra:
        s += f" ({', '.join(extra)})"
    s += "."
    if v.indicative:
        s += f" {INDICATIVE_NOTE}."
    if v.limit:
        s += f" Limited by {LIMIT_NAMES.get(v.limited_by, v.limited_by)}: {v.limit}."
    if v.next_try:
        s += f" Next: {v.next_try}."
    return s
