"""Step-time model, predicted curves, calibration (fit on half a ramp, predict the rest).

Published curves (docs/perf-model.md, "Reference curves") are only reported (run with -s to see the errors);
their workloads are partly unknown, so nothing is asserted on them."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.planner.calibrate import (MeasuredLevel, fit, hardware_fingerprint, level_errors, load_calibration,
                                   save_calibration)
from app.planner.gpus import cpu_device, lookup_gpu
from app.planner.models import from_catalog, resolve_model
from app.engine.steptime import PerfParams
from app.planner.plan import Workload, plan

#: docs/vllm-facts.md "Measured ramp": CPU build, tiny model, max_num_seqs 8, 128 output tokens
CPU_RAMP = {1: 134, 2: 293, 4: 551, 8: 857, 16: 945}
CPU_PROMPT = 32  # not stated with the measurement: assumed


def rig(gpu: str, n: int, model: str, quant: str | None = None, **kw):
    cfg = ServerConfig(model=model, tensor_parallel_size=n, quantization=quant, **kw)
    return plan(cfg, [lookup_gpu(gpu)] * n, from_catalog(model), Workload.of(512, 128), use_calibration=False)


def test_step_times_grow_with_batch_context_and_prompt():
    m = rig("RTX 4090", 1, "Mistral-7B").perf
    assert 0 < m.step_time_decode(1, 512) < m.step_time_decode(32, 512) < m.step_time_decode(32, 4096)
    assert m.step_time_prefill(256) < m.step_time_prefill(2048) < m.step_time_prefill(8192)
    # 8192 tokens = 4 chunks of max_num_batched_tokens 2048
    assert m.max_num_batched_tokens == 2048
    assert m.step_time_mixed(32, 512, 0) == pytest.approx(m.step_time_decode(32, 512))
    # batch 1 decode of a 7B bf16 model on a 4090 is bandwidth-bound: ≈ 14.5 GB / (η_mem · 1008 GB/s), no
    # faster than the card's spec-sheet bandwidth (14.4 ms); the CPU's part hides behind it with async
    # scheduling (vLLM's default from 0.29), so only the floor and a ceiling are asserted
    assert 14.5 / 1008 < m.step_time_decode(1, 512) < 0.030


def test_allreduce_nvlink_vs_pcie_without_p2p():
    nv = rig("H100 SXM", 8, "Llama-3-70B").perf
    pc = rig("RTX 5090", 8, "Llama-3-70B", "awq").perf
    assert nv.params.allreduce_alpha_s == pytest.approx(25e-6)
    assert pc.params.allreduce_alpha_s == pytest.approx(80e-6)  # 40 + 5·8 µs, docs/perf-model.md: 60–100 at TP8
    assert pc.allreduce_s(16384) > 3 * nv.allreduce_s(16384)
    assert rig("RTX 5090", 1, "Llama-3-8B").perf.allreduce_s(16384) == 0.0


def test_nccl_kept_off_p2p_all_reduces_through_the_host_whatever_the_nvlink():
    """NCCL_P2P_DISABLE=1 (the fix the planner proposes for P2P hangs) or NCCL_P2P_LEVEL=LOC keep NCCL
    off P2P (src/graph/paths.cc ncclGetLevel): the all-reduce takes the no-P2P path even on NVLink
    cards, so TP decode is slower than with P2P; NCCL_P2P_DISABLE=0 is the same as unset."""
    from app.planner.checks import nccl_p2p_disabled

    assert nccl_p2p_disabled({"NCCL_P2P_DISABLE": "1"}) and nccl_p2p_disabled({"NCCL_P2P_LEVEL": "LOC"})
    assert nccl_p2p_disabled({"NCCL_P2P_LEVEL": "0"})
    assert not nccl_p2p_disabled({}) and not nccl_p2p_disabled({"NCCL_P2P_DISABLE": "0"})
    assert not nccl_p2p_disabled({"NCCL_P2P_LEVEL": "SYS"})
    nv = rig("A100 80GB SXM", 2, "Llama-3-8B").perf
    off = rig("A100 80GB SXM", 2, "Llama-3-8B", env={"NCCL_P2P_DISABLE": "1"}).perf
    assert nv.params.source == "default (NVLink)" and off.params.source == "default (PCIe without P2P)"
    assert off.params.allreduce_alpha_s == pytest.approx(50e-6) and off.params.link_gbs == 9.0  # PCIe 4.0
    assert off.step_time_decode(64, 1024) > nv.step_time_decode(64, 1024)


def test_the_output_head_multiplies_sampled_rows_only():
    """vLLM computes logits at the sampled positions only (gpu_model_runner.py:4241 @ 0.32.0): a prompt's
    prefill multiplies the lm_head once, not per token, so a compute-bound prefill of a large-vocabulary
    model costs 2·(params − head)·tokens, while each decoding sequence pays the whole head."""
    import dataclasses

    m = rig("RTX 4090", 1, "Llama-3-8B").perf
    st = m.stages[0]
    assert st.head_params == pytest.approx(128256 * 4096)
    no_head = dataclasses.replace(m, stages=[dataclasses.replace(st, head_params=0.0)])
    # 2048 prompt tokens on one 4090 are compute-bound (≈ 0.28 s of GEMMs against ≈ 0.02 s of reads)
    saved = 2 * st.head_params * (2048 - 1) / (m.params.eta_compute * st.gpu.tflops_bf16 * 1e12)
    assert no_head.step_time_prefill(2048) - m.step_time_prefill(2048) == pytest.approx(saved, rel=1e-6)
    # a decode step multiplies the head for every sequence: no saving, also where compute binds it
    assert m.step_time_decode(2048, 16) == pytest.approx(no_head.step_time_decode(2048, 16))
    assert m.step_time_decode(2048, 16) > 2 * m.step_time_decode(32, 16)


def test_v0_versions_plan_with_v0s_defaults_and_prefill_first_steps():
    """Before 0.8 the V0 engine: max_num_seqs 256 and max_num_batched_tokens max(max_model_len, 2048)
    without chunked prefill, 512 with it (vllm/config.py SchedulerConfig); chunked prefill on by
    itself only past 32K of max_model_len (vllm/engine/arg_utils.py); prefix caching off by default."""
    from app.planner.versions import chunked_prefill_default, v0_batch_defaults, v0_engine

    assert v0_engine("0.5.4") and v0_engine("0.7.3") and not v0_engine("0.8.0") and not v0_engine(None)
    assert not chunked_prefill_default("0.6.0", 8192) and chunked_prefill_default("0.6.0", 131072)
    assert not chunked_prefill_default("0.6.0", 131072, sliding_window=True)
    assert chunked_prefill_default("0.10.1", 8192)
    assert v0_batch_defaults(4096, False) == (256, 4096) and v0_batch_defaults(1024, False) == (256, 2048)
    assert v0_batch_defaults(131072, True) == (256, 512)

    def eff(version, **kw):
        cfg = ServerConfig(model="Llama-3-8B", max_model_len=4096, **kw)
        return plan(cfg, [lookup_gpu("H100 SXM")], from_catalog("Llama-3-8B"), Workload.of(512, 128),
                    use_calibration=False, vllm_version=version).effective

    old, new = eff("0.5.4"), eff("0.10.1")
    assert (old.max_num_seqs, old.max_num_batched_tokens, old.prefill_first, old.prefix_caching) == (256, 4096, True, False)
    assert new.max_num_seqs == 1024 and not new.prefill_first and new.prefix_caching
    chunked = eff("0.5.4", extra_args=["--enable-chunked-prefill"])
    assert (chunked.max_num_batched_tokens, chunked.prefill_first) == (512, False)


def test_seed_scenario_shape():
    """docs/perf-model.md: with its parameters the model gives ≈ 40–60 tok/s for one user on
    either rig and ≈ 180–300 at 10 users; 8 cards barely beat 4 for a single user."""
    p4 = rig("RTX 5090", 4, "Llama-3-70B", "awq", max_model_len=8192)
    p8 = rig("RTX 5090", 8, "Llama-3-70B", "awq", max_model_len=8192)
    from app.engine.steptime import predict_curve

    c4 = predict_curve(p4.perf, 512, 128, 256, levels=[1, 10, 30])
    c8 = predict_curve(p8.perf, 512, 128, 256, levels=[1, 10, 30])
    for c in (c4, c8):
        assert 35 < c.at(1).output_tps < 65
        assert 150 < c.at(10).output_tps < 350
        assert c.at(30).output_tps > c.at(10).output_tps
    assert c8.at(1).output_tps < 1.3 * c4.at(1).output_tps
    print(f"\nseed 4× vs 8× RTX 5090: " + ", ".join(
        f"{n} users {c4.at(n).output_tps:.0f} vs {c8.at(n).output_tps:.0f} tok/s" for n in (1, 10, 30)))


def test_curve_knee_at_max_num_seqs_on_cpu(tiny_model):
    cfg = ServerConfig(model=str(tiny_model), max_num_seqs=8, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    p = plan(cfg, [cpu_device(24, 2)], resolve_model(str(tiny_model)), Workload.of(CPU_PROMPT, 128, (1, 2, 4, 8, 16)),
             use_calibration=False)
    c = p.curve
    assert c.knee == 8 and c.knee_reason == "max_num_seqs"
    assert c.at(16).running == 8 and c.at(16).queued == 8
    assert c.at(16).ttft_s > 5 * c.at(8).ttft_s  # beyond the knee requests queue
    tps = [pt.output_tps for pt in c.points]
    assert tps == sorted(tps)


def test_calibration_fit_half_predict_half(tiny_model, capsys):
    """Fit on levels 1, 4, 16 of the measured CPU ramp (docs/vllm-facts.md; the live
    ramp is in tests/e2e/test_planner_e2e.py), predict 2 and 8, report every level."""
    cfg = ServerConfig(model=str(tiny_model), max_num_seqs=8, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    p = plan(cfg, [cpu_device(24, 2)], resolve_model(str(tiny_model)), Workload.of(CPU_PROMPT, 128),
             use_calibration=False)
    levels = [MeasuredLevel(c, t) for c, t in CPU_RAMP.items()]
    train = [lv for lv in levels if lv.concurrency in (1, 4, 16)]
    cap = 8
    before = level_errors(p.perf, levels, CPU_PROMPT, 128, cap)
    params = fit(p.perf, train, CPU_PROMPT, 128, cap)
    after = level_errors(p.perf.with_params(params), levels, CPU_PROMPT, 128, cap)
    with capsys.disabled():
        print("\nCPU ramp (docs/vllm-facts.md), fit on 1/4/16, error per level (default → calibrated):")
        for b, a in zip(before, after):
            tag = "fit" if b.concurrency in (1, 4, 16) else "predicted"
            print(f"  c={b.concurrency:>2} measured {b.measured_tps:5.0f}  default {b.predicted_tps:5.0f} "
                  f"({b.tps_error_pct:+5.1f} %)  calibrated {a.predicted_tps:5.0f} ({a.tps_error_pct:+5.1f} %) [{tag}]")
    train_err = [abs(e.tps_error_pct) for e in after if e.concurrency in (1, 4, 16)]
    assert max(train_err) < 10
    assert sum(train_err) < sum(abs(e.tps_error_pct) for e in before if e.concurrency in (1, 4, 16))
    assert all(abs(e.tps_error_pct) < 25 for e in after)  # held-out levels 2 and 8 included
    assert params.source.startswith("calibrated")


def test_calibration_saved_per_fingerprint_and_reused(tiny_model, dyno_home):
    cards = [lookup_gpu("RTX 5090")] * 4
    fp = hardware_fingerprint(cards)
    assert fp == "4x RTX 5090 31.8GiB"
    assert load_calibration(fp) is None
    mine = PerfParams(0.61, 0.45, 0.003, 3e-5, 70e-6, 14.0, 0.004, source="calibrated test")
    path = save_calibration(fp, mine, {"note": "test"})
    assert path.parent == dyno_home / "calibration" and not list(path.parent.glob("*.tmp"))
    assert load_calibration(fp) == mine
    p = plan(ServerConfig(model="m", tensor_parallel_size=4, quantization="awq"), cards, from_catalog("Llama-3-70B"))
    assert p.perf.params == mine
    other = plan(ServerConfig(model="m", tensor_parallel_size=2), [lookup_gpu("H100 SXM")] * 2, from_catalog("Llama-3-8B"))
    assert other.perf.params.source.startswith("default")


def test_published_curves_report_only(capsys):
    """Report (no assertion) the per-level error of default parameters on the published curves."""
    cases = [
        ("H100 SXM", "Llama-3.1-8B", None, {1: 122, 4: 580, 16: 1384, 64: 1312}),
        ("RTX 4090", "Mistral-7B", None, {4: 210, 8: 377, 16: 644, 32: 975, 48: 1190}),
    ]
    with capsys.disabled():
        for gpu, model, q, meas in cases:
            p = rig(gpu, 1, model, q, max_model_len=4096)
            cap, _ = p.concurrency_for(512, 128)
            errs = level_errors(p.perf, [MeasuredLevel(c, t) for c, t in meas.items()], 512, 128, cap)
            print(f"\n{gpu} {model} (512 in / 128 out assumed), default parameters:")
            for e in errs:
                print(f"  c={e.concurrency:>3} measured {e.measured_tps:6.0f}  predicted {e.predicted_tps:6.0f} "
                      f"({e.tps_error_pct:+6.1f} %)")


# ---------------------------------------------------------------------- rigs of several hosts (issue 21)
def _rig_plan(tp: int, pp: int, dp: int, hosts: int, per_host: int, link: str | None, model: str = "Llama-3-8B"):
    from app.planner.gpus import rig_layout
    cfg = ServerConfig(model=model, tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp)
    r = rig_layout(hosts, per_host, link) if link else None
    return plan(cfg, [lookup_gpu("RTX 4090")] * (tp * pp * dp), from_catalog(model), Workload.of(512, 128),
                use_calibration=False, rig=r, predict=False)


def test_a_stage_boundary_between_hosts_costs_the_links_latency_and_bandwidth():
    """PP 4 over 4 hosts × 1 card: the three sends go over the network — each α + λ +
    S/min(B_intra, B_link) against α + S/B_intra on one host; 10 GbE is slower than
    InfiniBand HDR by the difference of their λ and S/B."""
    from app.planner.gpus import lookup_link
    one = _rig_plan(1, 4, 1, 1, 4, None).perf
    ib = _rig_plan(1, 4, 1, 4, 1, "ib-hdr200").perf
    eth = _rig_plan(1, 4, 1, 4, 1, "10gbe").perf
    assert [eth.boundary_crosses_hosts(i) for i in range(3)] == [True] * 3
    assert not any(one.boundary_crosses_hosts(i) for i in range(3))
    b, c = 32, 576
    s = b * eth.hidden * 2  # activations of the batch, bytes
    p = one.params
    for link, m in (("ib-hdr200", ib), ("10gbe", eth)):
        lk = lookup_link(link)
        bw = min(lk.bandwidth_gbs, p.link_gbs) * 1e9
        want = 3 * ((lk.latency_s + s / bw) - s / (p.link_gbs * 1e9))
        assert m.step_time_decode(b, c) - one.step_time_decode(b, c) == pytest.approx(want, rel=1e-6)
    assert one.step_time_decode(b, c) < ib.step_time_decode(b, c) < eth.step_time_decode(b, c)
    assert one.link_share_decode(b, c) == 0.0 < ib.link_share_decode(b, c) < eth.link_share_decode(b, c) < 1


def test_pp_stages_two_hosts_of_two_cards_cross_once():
    m = _rig_plan(1, 4, 1, 2, 2, "25gbe").perf
    assert [m.boundary_crosses_hosts(i) for i in range(3)] == [False, True, False]
    assert m.tp_hosts == 1


def test_a_tp_group_across_hosts_is_bound_by_the_network_ring():
    """TP 4 over 4 hosts: NCCL's ring (src/graph/tuning.cc) — 2(h−1) network steps at the
    link's latency and the bus bandwidth of the slowest hop."""
    from app.planner.gpus import lookup_link
    one = _rig_plan(4, 1, 1, 1, 4, None).perf
    m = _rig_plan(4, 1, 1, 4, 1, "10gbe").perf
    assert m.tp_hosts == 4 and one.tp_hosts == 1
    lk, s, p = lookup_link("10gbe"), 1e6, m.params
    bw = min(p.link_gbs, lk.bandwidth_gbs) * 1e9
    assert m.allreduce_s(s) == pytest.approx(p.allreduce_alpha_s + 6 * lk.latency_s + 1.5 * s / bw)
    assert one.allreduce_s(s) == pytest.approx(p.allreduce_alpha_s + 1.5 * s / (p.link_gbs * 1e9))
    assert m.step_time_decode(16, 576) > one.step_time_decode(16, 576)
    # TP 2 within each of 2 hosts × 2 cards: no network in the all-reduce, one send between hosts
    within = _rig_plan(2, 2, 1, 2, 2, "10gbe").perf
    assert within.tp_hosts == 1 and within.boundary_crosses_hosts(0)


def test_data_parallel_replicas_on_their_own_hosts_add_nothing_per_step():
    one = _rig_plan(1, 1, 4, 1, 4, None).perf
    four = _rig_plan(1, 1, 4, 4, 1, "10gbe").perf
    assert four.step_time_decode(32, 576) == one.step_time_decode(32, 576)
    assert four.link_share_decode(32, 576) == 0.0


def test_a_rigs_calibration_is_its_own_fingerprint():
    from app.planner.gpus import rig_layout
    cards = [lookup_gpu("RTX 4090")] * 4
    assert hardware_fingerprint(cards, rig_layout(1, 4, None)) == hardware_fingerprint(cards)
    assert hardware_fingerprint(cards, rig_layout(4, 1, "ib-hdr200")).endswith("@ 4 hosts x 1, ib-hdr200")


# ---------------------------------------------------------------------- pipeline parallel batches in flight
def test_pipeline_step_time_is_the_full_pass_and_the_slowest_stage():
    """PP 4 (4 hosts × 1 card, InfiniBand): a step's latency is its pass through every
    stage (:meth:`step_time`, unchanged); its interval — when the next batch can follow
    it (vLLM's batch queue, vllm/v1/engine/core.py step_with_batch_queue, 0.32.0) — is the
    slowest stage with its send, or the step's CPU work if longer (the engine core works
    while the stages compute; the end stages, which hold the
    embeddings and the LM head, are the slow ones). One stage: both are the step time."""
    m = _rig_plan(1, 4, 1, 4, 1, "ib-hdr200").perf
    p = m.params
    b, ctx = 16, 16 * 576
    lat, gap = m.pipeline_step_time(b, ctx, 0)
    assert lat == m.step_time(b, ctx, 0)
    cpu = p.t_cpu_s + p.t_cpu_seq_s * b
    stages = []
    for i, st in enumerate(m.stages):
        mem, comp, comm = m._stage(st, b, 576, 0, 0)
        stages.append(max(mem, comp) + comm + (m.send_s(i, b * m.hidden * 2) if i < 3 else 0.0))
    assert lat == pytest.approx(sum(stages) + cpu, rel=1e-9)
    assert gap == pytest.approx(max(max(stages), cpu), rel=1e-9) and max(stages) > cpu
    assert max(stages[0], stages[3]) > stages[1] == stages[2] and lat / 4 < gap < lat / 2
    assert m.engine_step_time == m.pipeline_step_time and m.pipeline_parallel_size == 4
    one = _rig_plan(1, 1, 1, 1, 1, None).perf
    assert one.pipeline_step_time(b, ctx, 0) == (one.step_time(b, ctx, 0),) * 2
    assert one.engine_step_time == one.step_time


def test_analytic_level_runs_pipeline_batches_in_flight_as_the_engine_does():
    """The analytic steady state (the tuner's screen, :func:`predict_level`) decodes a
    PP rig's running requests as up to PP batches in flight, as the step-level engine does
    (vLLM 0.32 ``step_with_batch_queue``): a sequence's token comes every max(latency,
    k × interval) of its own batch of b/k (:meth:`StepTimeModel.decode_cycle`). One stage:
    the step of the whole batch. Against the engine's closed-loop levels (fixed lengths
    512/128, PP 4 over 4 hosts on InfiniBand) the analytic throughput is within 10 % at 16
    users and 30 % at 64, and closer there than decoding the batch serially (−32 %)."""
    from app.engine.steptime import predict_level
    from app.loadgen.spec import RampSpec
    from app.planner.predict import predict_ramp
    one = _rig_plan(1, 1, 1, 1, 1, None).perf
    assert one.decode_cycle(16, 576) == (one.step_time_decode(16, 576), 16)
    p = _rig_plan(1, 4, 1, 4, 1, "ib-hdr200")
    m = p.perf
    lat, gap = m.pipeline_step_time(4, 4 * 576, 0)
    assert m.decode_cycle(16, 576) == (pytest.approx(max(lat, 4 * gap)), 4)
    assert m.decode_cycle(2, 576)[1] == 1  # two users: two batches of one
    cap, _ = p.concurrency_for(512, 128)
    spec = RampSpec(url="http://127.0.0.1:1", levels=[16, 64], prompt_tokens=512, output_tokens=128, length_spread=0.0)
    engine = {int(st.level): st.output_tps for st in predict_ramp(m, p.engine_limits(), spec).steps}
    ana = {n: predict_level(m, n, 512, 128, cap).output_tps for n in (16, 64)}
    assert abs(ana[16] / engine[16] - 1) < 0.10 and abs(ana[64] / engine[64] - 1) < 0.30
    # serially: the whole batch of 64 through every stage per token (the model before)
    o, c = 128, 512 + 64
    step = m.step_time_decode(64, c) + m.prefill_marginal(63, c, 512) * 64 / o
    serial = 64 * o / (m.step_time_decode(64, c) + m.prefill_marginal(63, c, 512) + m.params.t_request_s + (o - 1) * step)
    assert abs(ana[64] / engine[64] - 1) < abs(serial / engine[64] - 1)
