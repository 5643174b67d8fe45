"""The server's own figures over a level's measuring window, and how they reconcile with
the client's (issue 20, items 3, 4 and 6).

The load generator reads ``/metrics`` (parsed by :func:`app.telemetry.metrics_parse.parse_metrics`)
at the start and at the end of each level's steady-state window; :func:`server_window`
turns the two snapshots into a :class:`ServerStats`: counter deltas and histogram deltas
over the window. Names are vLLM's (``vllm/v1/metrics/loggers.py``,
``vllm/v1/spec_decode/metrics.py``; docs/vllm-facts.md, "/metrics"):

- prefix-cache hit rate = Δ``vllm:prefix_cache_hits_total`` ÷ Δ``vllm:prefix_cache_queries_total``
  (tokens; ``vllm:gpu_prefix_cache_*`` up to 0.11); None when Δqueries is 0 (caching
  off, or nothing counted).
- spec-decode acceptance rate = Δ``vllm:spec_decode_num_accepted_tokens_total`` ÷
  Δ``vllm:spec_decode_num_draft_tokens_total``; mean accepted length = 1 + Δaccepted ÷
  Δ``vllm:spec_decode_num_drafts_total`` (the bonus token included, as vLLM's
  ``SpecDecodingLogging.log`` computes it); per position: Δ``…_num_accepted_tokens_per_pos``
  ÷ Δdrafts. None when the server does not speculate (the counters exist only with a
  ``--speculative-config``).
- TTFT, ITL, TPOT, queue time and e2e percentiles (p50/p90/p99, seconds) from the
  histogram deltas (Prometheus' ``histogram_quantile``). **A histogram quantile is only
  as fine as its buckets**: it is interpolated inside the bucket holding the rank, so
  the true value lies anywhere in that bucket — ``resolution`` gives the bucket
  ``[lower, upper]`` of every percentile (e.g. vLLM's TTFT buckets 0.1, 0.25, 0.5 s: a
  p50 of 0.18 s means "between 0.1 and 0.25 s"). The means (Δsum ÷ Δcount) are exact.
- Tokens: Δ``vllm:prompt_tokens_total`` and Δ``vllm:generation_tokens_total`` against the
  client's counts (:func:`client_tokens`).

Window edges. The server counts as things happen: a generated token when its engine
step ends, a request's prompt tokens and TTFT when its first token comes out
(``IterationStats.update_from_output``, ``is_prefilling``), ITL per engine step, queue
time and e2e when the request finishes. So the client's token counts are taken by the
same rule over the same two scrape instants: output tokens of the chunks that *arrived*
between the scrapes (each chunk weighted by its request's ``usage`` output tokens ÷ its
chunks) and prompt tokens of the requests whose *first chunk* arrived between them. The
client's latency percentiles keep their own rule (requests *sent* in the window): a
request straddling an edge can be in one set and not the other, so the two agree within
a bucket, not exactly. Time scale: the server's seconds are its own — a sim running
``k``× faster reports rig seconds, as the level's client figures do after
:func:`app.loadgen.stats.to_rig_time`; the scrape instants are session-clock seconds.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from pydantic import BaseModel

from app.telemetry.metrics_parse import MetricsSnapshot, histogram_delta, histogram_quantile, quantile_bucket

#: short name → vLLM histogram (without ``vllm:``; old names through metrics_parse.FALLBACKS).
#: ``tpot``: ``vllm:request_time_per_output_token_seconds`` (per request, decode time ÷
#: (output tokens − 1); not in every version: None when not exported)
HISTOGRAMS = {
    "ttft": "time_to_first_token_seconds",
    "itl": "inter_token_latency_seconds",
    "tpot": "request_time_per_output_token_seconds",
    "queue": "request_queue_time_seconds",
    "e2e": "e2e_request_latency_seconds",
}
#: percentiles reported per histogram
PERCENTILES = (50, 90, 99)


class ServerStats(BaseModel):
    """One level's server-side figures (:func:`server_window`); the module docstring
    gives every definition. Seconds are the server's own (rig seconds for a sim), token
    counts are tokens, rates are fractions (0–1).

    ``scrape_start``/``scrape_end``: session-clock seconds of the two ``/metrics``
    readings (each the midpoint of its request). ``prefix_cache_reset``: whether the
    prefix cache was reset (``POST /reset_prefix_cache``) before the level; None when
    the server does not offer it. ``resolution``: ``"ttft_p50"`` → the histogram bucket
    ``[lower, upper]`` (s) the percentile lies in. ``notes``: the reconciliation with the
    client's figures, in words (:func:`explain`)."""

    scrape_start: float
    scrape_end: float
    prefix_cache_reset: Optional[bool] = None
    prefix_cache_queries: Optional[float] = None
    prefix_cache_hits: Optional[float] = None
    prefix_cache_hit_rate: Optional[float] = None
    spec_decode_drafts: Optional[float] = None
    spec_decode_draft_tokens: Optional[float] = None
    spec_decode_accepted_tokens: Optional[float] = None
    spec_decode_acceptance_rate: Optional[float] = None
    spec_decode_mean_accepted_length: Optional[float] = None
    spec_decode_acceptance_per_position: Optional[list[float]] = None
    ttft_p50: Optional[float] = None
    ttft_p90: Optional[float] = None
    ttft_p99: Optional[float] = None
    ttft_mean: Optional[float] = None
    ttft_count: int = 0
    itl_p50: Optional[float] = None
    itl_p90: Optional[float] = None
    itl_p99: Optional[float] = None
    itl_mean: Optional[float] = None
    itl_count: int = 0
    tpot_p50: Optional[float] = None
    tpot_p90: Optional[float] = None
    tpot_p99: Optional[float] = None
    tpot_mean: Optional[float] = None
    tpot_count: int = 0
    queue_p50: Optional[float] = None
    queue_p90: Optional[float] = None
    queue_p99: Optional[float] = None
    queue_mean: Optional[float] = None
    queue_count: int = 0
    e2e_p50: Optional[float] = None
    e2e_p90: Optional[float] = None
    e2e_p99: Optional[float] = None
    e2e_mean: Optional[float] = None
    e2e_count: int = 0
    resolution: dict[str, list[float]] = {}
    prompt_tokens: Optional[float] = None
    generation_tokens: Optional[float] = None
    requests_finished: Optional[float] = None
    client_prompt_tokens: Optional[float] = None
    client_output_tokens: Optional[float] = None
    #: Δvllm:admission_rejections_total over the window: requests the API server refused with HTTP 503
    #: (vLLM 0.32's admission control, app.engine.admission); None when the server does not export it
    admission_rejections: Optional[float] = None
    notes: list[str] = []


def _delta(after: MetricsSnapshot, before: MetricsSnapshot, name: str) -> Optional[float]:
    """Δ of a counter between two snapshots; ``after`` alone when it went down (the
    server restarted); None when ``after`` does not export it."""
    b, a = before.counter(name), after.counter(name)
    if a is None:
        return None
    if b is None or a < b:
        return a
    return a - b


def server_window(before: MetricsSnapshot, after: MetricsSnapshot, *, scrape_start: float, scrape_end: float,
                  prefix_cache_reset: Optional[bool] = None) -> ServerStats:
    """The server's figures between two ``/metrics`` snapshots (module docstring)."""
    s = ServerStats(scrape_start=scrape_start, scrape_end=scrape_end, prefix_cache_reset=prefix_cache_reset)
    q, h = _delta(after, before, "prefix_cache_queries"), _delta(after, before, "prefix_cache_hits")
    s.prefix_cache_queries, s.prefix_cache_hits = q, h
    if q and h is not None:
        s.prefix_cache_hit_rate = h / q
    drafts = _delta(after, before, "spec_decode_num_drafts")
    draft_tok = _delta(after, before, "spec_decode_num_draft_tokens")
    acc = _delta(after, before, "spec_decode_num_accepted_tokens")
    s.spec_decode_drafts, s.spec_decode_draft_tokens, s.spec_decode_accepted_tokens = drafts, draft_tok, acc
    if draft_tok and acc is not None:
        s.spec_decode_acceptance_rate = acc / draft_tok
    if drafts and acc is not None:
        s.spec_decode_mean_accepted_length = 1.0 + acc / drafts
        pa = after.counter_by_position("spec_decode_num_accepted_tokens_per_pos")
        pb = before.counter_by_position("spec_decode_num_accepted_tokens_per_pos")
        if pa:
            s.spec_decode_acceptance_per_position = [
                (pa[p] - pb.get(p, 0.0) if pa[p] >= pb.get(p, 0.0) else pa[p]) / drafts for p in sorted(pa)]
    res: dict[str, list[float]] = {}
    for short, hname in HISTOGRAMS.items():
        ha = after.histogram(hname)
        if ha is None:
            continue
        d = histogram_delta(ha, before.histogram(hname))
        if d.count <= 0:
            continue
        b = sorted(d.buckets.items())
        upd: dict[str, Any] = {f"{short}_count": int(round(d.count)), f"{short}_mean": d.sum / d.count}
        for p in PERCENTILES:
            upd[f"{short}_p{p}"] = histogram_quantile(p / 100, b)
            bk = quantile_bucket(p / 100, b)
            if bk is not None:
                res[f"{short}_p{p}"] = [bk[0], bk[1]]
        for k, v in upd.items():
            setattr(s, k, v)
    s.resolution = res
    s.prompt_tokens = _delta(after, before, "prompt_tokens")
    s.generation_tokens = _delta(after, before, "generation_tokens")
    s.requests_finished = _delta(after, before, "request_success")
    s.admission_rejections = _delta(after, before, "admission_rejections")
    return s


def client_tokens(records: Sequence[Any], t0: float, t1: float) -> tuple[float, float]:
    """``(prompt tokens, output tokens)`` the client saw between session-clock instants
    ``t0`` and ``t1``, by the server's counting rule (module docstring): output tokens
    of the chunks arriving in ``[t0, t1]``, each weighted by its request's output tokens
    (``usage``) ÷ its chunks; prompt tokens of the requests whose first chunk arrived
    in it. ``records``: :class:`app.loadgen.records.RequestRecord`."""
    prompt = out = 0.0
    for r in records:
        n = r.chunk_offsets.size
        if not n:
            continue
        arr = r.t_start + r.chunk_offsets
        inside = int(((arr >= t0) & (arr <= t1)).sum())
        if inside:
            out += inside * (r.output_tokens / n if r.output_tokens else 1.0)
        if t0 <= arr[0] <= t1:
            prompt += r.prompt_tokens or 0
    return prompt, out


def _ms(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if abs(x) < 1 else f"{x:.2f} s"


#: a client and a server mean closer than this (s), or than REL_AGREE[metric] of the larger,
#: agree: TTFT carries the client's per-request overhead (HTTP, tokenization: a few ms, worth
#: naming even beside a long TTFT); ITL and TPOT carry none, a gap under 5 % is the window's edges
ABS_AGREE_S = 0.002
REL_AGREE = {"ttft": 0.01, "itl": 0.05, "tpot": 0.05}


def _get(st: Any, k: str) -> Any:
    return st.get(k) if isinstance(st, dict) else getattr(st, k, None)


#: the share of the server's mean TTFT spent in the waiting queue (0–1) from which TTFT
#: counts as mostly queueing rather than prefill (a majority)
QUEUE_MAJORITY = 0.5


def ttft_cause(server: Any) -> tuple[str, float] | None:
    """What the server's TTFT of one level is mostly: ``("queueing", share)`` when the
    mean time in vLLM's waiting queue (vllm:request_queue_time_seconds) is at least
    :data:`QUEUE_MAJORITY` of its mean TTFT (vllm:time_to_first_token_seconds), else
    ``("prefill", share)``; ``share`` = queue mean ÷ TTFT mean (0–1). None without both
    means. ``server``: a level's :class:`ServerStats` or its dict. The one analysis the
    client-vs-server note (:func:`explain`) and the verdict's limit
    (app.run.verdict) both read, so they cannot disagree (issue 37 item 4)."""
    if server is None:
        return None
    qm, tm = _get(server, "queue_mean"), _get(server, "ttft_mean")
    if qm is None or not tm:
        return None
    share = qm / tm
    return ("queueing" if share >= QUEUE_MAJORITY else "prefill"), share


def explain(st: Any, k: float = 1.0) -> list[str]:
    """The gap between the client's and the server's figures of one level, in words.

    ``st``: the level (:class:`app.loadgen.stats.StepStats` or its dict) in rig seconds,
    with ``server`` set. One line each for TTFT, ITL and TPOT (client mean − server
    mean: exact, both; positive = time outside the engine: HTTP, tokenization, SSE,
    network, the client; within :data:`ABS_AGREE_S` or :data:`REL_AGREE` they agree),
    one for the queue's share of the server's TTFT p99 (queueing vs prefill) and one per
    token count (client vs server Δ over the same instants). ``k``: the sim's time scale
    (the client's overhead is wall time, × k in rig seconds: said so). Empty without
    ``server``."""
    sv = _get(st, "server")
    if sv is None:
        return []
    if not isinstance(sv, dict):
        sv = sv.model_dump()
    res = sv.get("resolution") or {}
    out: list[str] = []
    for short, name in (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT")):
        c, s = _get(st, f"{short}_mean"), sv.get(f"{short}_mean")
        if c is None or s is None:
            continue
        gap = c - s
        p50 = ""
        if _get(st, f"{short}_p50") is not None and sv.get(f"{short}_p50") is not None:
            bk = res.get(f"{short}_p50")
            within = bk is not None and bk[0] <= _get(st, f"{short}_p50") <= bk[1]
            p50 = (f"; p50 client {_ms(_get(st, f'{short}_p50'))}, server {_ms(sv[f'{short}_p50'])}"
                   + (f" (its bucket {_ms(bk[0])}–{_ms(bk[1])}{': the client p50 lies in it' if within else ''})"
                      if bk else ""))
        if abs(gap) <= max(ABS_AGREE_S, REL_AGREE[short] * max(abs(c), abs(s))):
            out.append(f"{name}: client and server agree (mean {_ms(c)} vs {_ms(s)}){p50}")
        elif gap > 0:
            why = ("HTTP, tokenization, streaming and network outside the engine" if short == "ttft"
                   else "chunks delayed or batched on their way to the client")
            scaled = f" (a sim {k:g}× faster: {_ms(gap / k)} of wall time)" if k != 1 else ""
            out.append(f"{name}: the client's mean exceeds the server's by {_ms(gap)} ({_ms(c)} vs {_ms(s)}): "
                       f"{why}{scaled}{p50}")
        else:
            out.append(f"{name}: the server's mean exceeds the client's by {_ms(-gap)} ({_ms(s)} vs {_ms(c)}): "
                       f"the server counted other requests (the window's edges, or other clients){p50}")
    q99, t99 = sv.get("queue_p99"), sv.get("ttft_p99")
    qm, tm = sv.get("queue_mean"), sv.get("ttft_mean")
    cause = ttft_cause(sv)
    if q99 is not None and t99 and cause is not None:
        kind, share = cause

        def p99(k: str) -> str:
            bk = res.get(k)
            return _ms(sv[k]) + (f" (bucket {_ms(bk[0])}–{_ms(bk[1])})" if bk else "")
        if kind == "queueing":
            out.append(f"queueing: queue time p99 {p99('queue_p99')} is most of the server's TTFT p99 "
                       f"{p99('ttft_p99')}; means {_ms(qm)} of {_ms(tm)} ({share:.0%}): requests wait for a "
                       f"place in the batch")
        else:
            out.append(f"prefill: queue time is {share:.0%} of the server's TTFT (means {_ms(qm)} of {_ms(tm)}; "
                       f"p99 {p99('queue_p99')} against {p99('ttft_p99')}): TTFT is mostly prefill, not queueing")
    for label, ck, sk, metric in (("output tokens", "client_output_tokens", "generation_tokens",
                                   "vllm:generation_tokens_total"),
                                  ("prompt tokens", "client_prompt_tokens", "prompt_tokens",
                                   "vllm:prompt_tokens_total")):
        c, s = sv.get(ck), sv.get(sk)
        if c is None or s is None:
            continue
        d = s - c
        if abs(d) <= max(2.0, 0.02 * max(c, s)):
            out.append(f"{label}: client {c:.0f} (usage) and server {s:.0f} (Δ{metric}) agree")
        elif d > 0:
            out.append(f"{label}: the server counted {d:.0f} more than the client ({s:.0f} vs {c:.0f}): other "
                       f"clients, requests the client gave up on, or steps counted just before a scrape")
        else:
            out.append(f"{label}: the client counted {-d:.0f} more than the server ({c:.0f} vs {s:.0f}): "
                       f"tokens counted by the server just before the first scrape arrived after it")
    return out


def with_notes(st: Any, k: float = 1.0) -> Any:
    """A copy of level ``st`` (StepStats, in rig seconds; ``k`` the sim's time scale)
    whose ``server.notes`` are :func:`explain`'s; ``st`` itself when it has no server
    figures."""
    if getattr(st, "server", None) is None:
        return st
    return st.model_copy(update={"server": st.server.model_copy(update={"notes": explain(st, k)})})


def server_summary(levels: Sequence[Any]) -> list[str]:
    """What to say once about a ramp's server figures (CLI line, GUI note): that the
    server has no ``/metrics``, or that it has prefix caching but its prefix cache could
    not be reset between levels. ``levels``: StepStats or their dicts."""
    levels = list(levels)
    if not levels:
        return []
    servers = [_get(x, "server") for x in levels]
    servers = [s if isinstance(s, dict) or s is None else s.model_dump() for s in servers]
    if all(s is None for s in servers):
        problems = [p for p in (_get(x, "server_problem") for x in levels) if p]
        if not problems:  # not asked (a run recorded before the levels had server figures, aborted levels)
            return []
        return [f"the server's /metrics did not answer ({problems[0]}; not vLLM?): the levels have no "
                f"server-side figures"]
    out = []
    cached = any((s or {}).get("prefix_cache_queries") for s in servers)
    if cached and any(s is not None and s.get("prefix_cache_reset") is None for s in servers):
        out.append("the prefix cache was not reset between levels: the server does not offer POST "
                   "/reset_prefix_cache (vLLM serves it with VLLM_SERVER_DEV_MODE=1), so a level may hit "
                   "what the level before it cached")
    failed = [f"{_get(x, 'level'):g}" for x, s in zip(levels, servers)
              if s is not None and s.get("prefix_cache_reset") is False]
    if failed:
        out.append(f"the prefix cache reset failed before level(s) {', '.join(failed)} (the server still held "
                   f"blocks): those levels may hit what the level before them cached")
    return out


#: marks a server-side percentile: interpolated inside a histogram bucket, only as fine as it
BUCKET_MARK = "‡"
#: the server table's columns (:func:`server_rows`)
SERVER_COLUMNS = ("Level", "Cache reset", "Prefix hit", "Spec accept", "Accept len", "TTFT p50 ms c/s",
                  "TTFT p99 ms c/s", "ITL p50 ms c/s", "TPOT p50 ms c/s", "Queue p99 ms", "Out tok c/s",
                  "Prompt tok c/s")
SERVER_LEGEND = ("c/s: the client's figure / the server's own (its /metrics over the same window); "
                 f"{BUCKET_MARK} a percentile from the server's histogram buckets, only as fine as the bucket it "
                 "falls in (e.g. vLLM's TTFT buckets 100–250 ms); prefix hit: Δhits ÷ Δqueries; spec accept: "
                 "Δaccepted ÷ Δdraft tokens; accept len: 1 + Δaccepted ÷ Δdrafts; tokens: client (usage) / server "
                 "(Δvllm:generation_tokens_total, Δvllm:prompt_tokens_total) counted by the server's rule")


def server_rows(levels: Sequence[Any]) -> list[list[str]]:
    """One row of :data:`SERVER_COLUMNS` per level that has server figures (StepStats or
    their dicts, rig seconds): the client's figure beside the server's, latencies in ms,
    rates in %, server percentiles marked :data:`BUCKET_MARK`."""
    def ms(v: Any) -> str:
        return "—" if v is None else f"{v * 1e3:.0f}"

    def pct(v: Any) -> str:
        return "—" if v is None else f"{v * 100:.0f}%"

    def tok(v: Any) -> str:
        return "—" if v is None else f"{v:.0f}"

    rows = []
    for st in levels:
        sv = _get(st, "server")
        if sv is None:
            continue
        if not isinstance(sv, dict):
            sv = sv.model_dump()

        def pair(k: str) -> str:
            s = sv.get(k)
            return f"{ms(_get(st, k))} / {ms(s)}{BUCKET_MARK if s is not None else ''}"
        lvl = f"{_get(st, 'level'):g}" + ("/s" if _get(st, "mode") == "rate" else "")
        reset = {True: "yes", False: "failed", None: "no"}[sv.get("prefix_cache_reset")]
        acc_len = sv.get("spec_decode_mean_accepted_length")
        q99 = sv.get("queue_p99")
        rows.append([lvl, reset, pct(sv.get("prefix_cache_hit_rate")), pct(sv.get("spec_decode_acceptance_rate")),
                     "—" if acc_len is None else f"{acc_len:.2f}", pair("ttft_p50"), pair("ttft_p99"),
                     pair("itl_p50"), pair("tpot_p50"), ms(q99) + (BUCKET_MARK if q99 is not None else ""),
                     f"{tok(sv.get('client_output_tokens'))} / {tok(sv.get('generation_tokens'))}",
                     f"{tok(sv.get('client_prompt_tokens'))} / {tok(sv.get('prompt_tokens'))}"])
    return rows
