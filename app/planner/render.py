"""Plain-text rendering of a :class:`~app.planner.plan.Plan` (the ``vllm-dyno plan`` output)."""
from __future__ import annotations

from app.loadgen.capacity import fmt_users, slo_text
from app.planner.model_error import statement_for_plan
from app.planner.plan import Plan, Workload, fix_to_flags


def _q(p: Plan) -> str:
    e, m = p.effective, p.model
    if not e.quantization:
        return e.dtype
    if e.quantization == m.quant_method and m.quant_bits:
        g = f" g{m.quant_group_size}" if m.quant_group_size else ""
        return f"{e.quantization} {m.quant_bits}-bit{g}, activations {e.dtype}"
    if e.quantization in ("awq", "awq_marlin", "gptq", "gptq_marlin") and not m.quant_method:
        return f"{e.quantization} 4-bit g128 (assumed: no quantization_config), activations {e.dtype}"
    return f"{e.quantization}, activations {e.dtype}"


def _predicted(alternatives: list[tuple[dict, float]], shown: int = 3) -> str:
    """" — predicted peak 1,234 output tok/s; next: --tensor-parallel-size 2 (987)" for a
    fix chosen among parallel layouts by predicted throughput; "" otherwise."""
    if not alternatives:
        return ""
    text = f" — predicted peak {alternatives[0][1]:,.0f} output tok/s"
    rest = [f"{fix_to_flags(a)} ({tps:,.0f})" for a, tps in alternatives[1:shown]]
    return text + (f"; next: {'; '.join(rest)}" if rest else "")


def _ms(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x * 1e3, fmt)


def users_at_slo_text(p: Plan) -> str:
    """``4 (TTFT p99 ≤ 2 s and TPOT p99 ≤ 100 ms; 5 users broke it: ttft) — 108 output
    tok/s`` from the plan's predicted capacity ("" without one)."""
    c = p.capacity
    if c is None:
        return ""
    s = f"{c.users:g} ({slo_text(c.slo)}"
    if c.limited_by == "max_level":
        s += "; every level probed met it)"
    elif c.next_users is not None:
        s += f"; {fmt_users(c.next_users)} broke it: {c.limited_by})"
    else:
        s += ")"
    if c.output_tps is not None and c.users > 0:
        s += f" — {c.output_tps:,.0f} output tok/s"
    return s


def model_error_text(p: Plan) -> str:
    """The model's measured error against published GPU runs for this plan's cards, load,
    world size and quantization (:func:`app.planner.model_error.statement_for_plan`); ""
    without a prediction or on the CPU build."""
    if p.curve is None and p.capacity is None:
        return ""
    st = statement_for_plan(p)
    return st.text if st is not None else ""


def render_plan(p: Plan) -> str:
    """The per-GPU memory table, capacity, predicted curve and verdict, as text."""
    e, m = p.effective, p.model
    lines: list[str] = []
    cards = ", ".join(sorted({g.name for g in p.gpus}))
    lines.append(f"Plan: {m.name} on {len(p.gpus)}× {cards} — TP {e.tp}, PP {e.pp}"
                 + (f", DP {p.dp}" if p.dp > 1 else "") + f" (vLLM {p.rules.version} rules)")
    lines.append(f"  model: {m.source or 'given'}; {m.total_params() / 1e9:.1f} B parameters"
                 + (f" ({m.active_params() / 1e9:.1f} B active, MoE {m.experts_per_tok}/{m.experts})" if m.is_moe else "")
                 + (", MLA" if m.is_mla else "") + f"; {_q(p)}")
    lines.append(f"  weights {p.weights_gib_total:.2f} GiB in all; KV cache {p.kv_bytes_per_token:,} B/token "
                 f"({p.ranks[0].kv_bytes_per_token:,} on each GPU of stage 0)")
    if not p.kv_layout.uniform:
        lines.append(f"  {p.kv_layout.describe()} — a window holds only its window "
                     f"(block {p.kv_layout.block_size} tokens; the B/token above counts every layer as full attention)")
    lines.append(f"  settings: max_model_len {e.max_model_len:,} · max_num_seqs {e.max_num_seqs} · "
                 f"max_num_batched_tokens {e.max_num_batched_tokens:,} · gpu_memory_utilization {e.utilization} · "
                 f"kv dtype {'fp8' if e.kv_dtype_bytes == 1 else e.dtype}" + (" · enforce_eager" if e.enforce_eager else ""))
    if p.host is not None and e.world > 1:
        lines.append(f"  host PCIe: {p.host.describe()}")
    if p.rig is not None and p.rig.multi_host:
        share = p.link_share
        lines.append(f"  rig: {p.rig.describe()}" + (f" — the link's share of a decode step: {share * 100:.1f} %"
                                                     if share is not None else ""))
    if p.draft is not None:
        d, last = p.draft, p.ranks[-1]
        lines.append(f"  speculative decoding: {d.method}, {d.k} draft tokens a step — {d.note}; draft weights "
                     f"{last.draft_weights_gib:.2f} GiB and draft KV {last.draft_kv_bytes_per_token:,} B/token on each "
                     "GPU of the last stage (in 'weights' and 'KV' below); the ramp below predicted with each draft "
                     f"position accepted at {p.spec_acceptance:g} of the one before (--spec-acceptance)")
    lines.append("")
    hdr = f"  {'GPU':>3} {'card':<16} {'stage':>5} {'total':>7} {'budget':>7} {'weights':>8} {'activ.':>7} {'other':>6} " \
          f"{'KV':>7} {'KV tokens':>11} {'graphs':>7} {'above':>6}"
    lines.append("  memory per GPU (GiB; 'other' = non-torch, 'above' = memory above the budget):")
    lines.append(hdr)
    for r in p.ranks:
        lines.append(f"  {r.rank:>3} {r.gpu.name[:16]:<16} {r.stage:>5} {r.total_gib:7.2f} {r.budget_gib:7.2f} "
                     f"{r.weights_gib:8.2f} {r.activation_gib:7.2f} {r.non_torch_gib:6.2f} {r.kv_gib:7.2f} "
                     f"{r.kv_tokens:11,} {r.cuda_graphs_gib:7.2f} {r.headroom_gib:6.2f}")
    lines.append("")
    lines.append(f"  capacity: KV cache size {p.kv_cache_tokens:,} tokens; maximum concurrency for "
                 f"{e.max_model_len:,} tokens per request: {p.max_concurrency:.2f}x")
    if p.workload is not None:
        n, why = p.concurrency_for(p.workload.prompt_tokens, p.workload.output_tokens)
        lines.append(f"  workload {p.workload.prompt_tokens} in / {p.workload.output_tokens} out: {n} requests at "
                     f"once (limited by {why})" + (f" on each of {p.dp} engines" if p.dp > 1 else ""))
    if p.curve is not None and p.perf is not None:
        c, pr = p.curve, p.perf.params
        w = p.workload or Workload()
        lines.append("")
        lines.append(f"  predicted closed-loop ramp on the step-level engine ({w.ramp_spec([1]).shape}; levels of "
                     f"{w.warmup_s:g} s warm-up + {w.step_s:g} s; parameters {pr.source}: η_mem {pr.eta_mem:.2f}, "
                     f"η_c {pr.eta_compute:.2f}, t_cpu {pr.t_cpu_s * 1e3:.1f} ms, all-reduce α "
                     f"{pr.allreduce_alpha_s * 1e6:.0f} µs @ {pr.link_gbs:.0f} GB/s):")
        lines.append(f"  {'users':>6} {'running':>8} {'tok/s':>9} {'tok/s/user':>11} {'TTFT p99 ms':>12} "
                     f"{'TPOT p99 ms':>12} {'requests':>9}")
        for pt in c.points:
            lines.append(f"  {pt.concurrency:>6} {pt.running:>8} {pt.output_tps:9.0f} {pt.per_user_tps:11.1f} "
                         f"{_ms(pt.ttft_p99_s, '.0f'):>12} {_ms(pt.tpot_p99_s, '.1f'):>12} {pt.requests or 0:>9}")
        short = [pt.concurrency for pt in c.points if not pt.steady]
        if short:
            lines.append(f"  levels {', '.join(map(str, short))}: the {w.step_s:g} s step is shorter than a request "
                         "there — a start-up transient, as a ramp with these steps would measure it")
        if c.knee_reason == "step time":
            lines.append(f"  knee: {c.knee} users — beyond it a doubling of users adds < 15 % throughput "
                         f"while TTFT p99 grows; the engine queues beyond {c.capacity}")
        else:
            lines.append(f"  knee: {c.knee} users (limited by {c.knee_reason}); beyond it requests queue and TTFT grows")
    if p.capacity is not None:
        lines.append(f"  predicted users at SLO: {users_at_slo_text(p)}")
    err = model_error_text(p)
    if err:
        lines.append(f"  {err}")
    lines.append("")
    lines.append(f"  verdict: {p.verdict.upper()}" + (f" — {p.problem}" if p.problem else ""))
    for f in p.findings:
        lines.append(f"    {f.verdict:<5} {f.problem}: {f.message}")
        if f.fix is not None:
            lines.append(f"          fix: {fix_to_flags(f.fix)}" + _predicted(f.alternatives))
        elif f.verdict in ("warn", "error"):
            lines.append("          fix: no option change fixes it on these cards (see above)")
    assumed = sorted({f"{g.name}: {', '.join(g.assumed)}" for g in p.gpus if g.assumed})
    if assumed:
        lines.append("  assumed figures (not checked against a datasheet): " + "; ".join(assumed))
    return "\n".join(lines)
