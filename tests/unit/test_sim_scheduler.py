"""The sim's scheduler, step model adapter, closed-loop curve and virtual telemetry —
pure rig time, no processes."""
from __future__ import annotations

import pytest

from app.config import ServerConfig
from app.sim import model_adapter as ma
from app.sim.gpus import GpuBank, cooling_factor
from app.engine.offline import closed_loop
from app.engine.scheduler import Request, Scheduler


def flat_step(b, ctx, n, pctx):
    """10 ms per step plus 1 µs per prefill token (a simple, known timing)."""
    return 0.010 + 1e-6 * n


class Rec:
    def __init__(self):
        self.tokens, self.done = 0, False

    def on_token(self, r, t):
        self.tokens += 1

    def on_finish(self, r, t):
        self.done = True


def drive(s: Scheduler, t: float = 0.0, limit: int = 100000) -> float:
    for _ in range(limit):
        st = s.schedule(t)
        if st is None:
            return t
        t += st.dt
        s.complete(st, t)
    raise AssertionError("scheduler did not drain")


def test_exact_token_counts_and_block_accounting():
    s = Scheduler(num_blocks=100, max_num_seqs=4, max_num_batched_tokens=64, step_time=flat_step)
    recs = [Rec() for _ in range(6)]
    for i, r in enumerate(recs):
        s.add(Request(f"r{i}", prompt_len=40, max_tokens=10 + i, arrival=0.0, sink=r))
    drive(s)
    assert [r.tokens for r in recs] == [10 + i for i in range(6)]
    assert all(r.done for r in recs)
    assert s.free_blocks == 100 and s.generation_tokens == sum(10 + i for i in range(6))


def test_max_num_seqs_and_chunked_prefill_budget():
    s = Scheduler(num_blocks=1000, max_num_seqs=3, max_num_batched_tokens=50, step_time=flat_step)
    for i in range(5):
        s.add(Request(f"r{i}", prompt_len=120, max_tokens=4, arrival=0.0))
    st = s.schedule(0.0)
    assert sum(n for _, n in st.work) <= 50
    assert st.work[0][1] == 50  # the first prompt is chunked to the budget
    t = 0.0
    for _ in range(200):
        st = s.schedule(t)
        if st is None:
            break
        assert len(s.running) <= 3
        assert sum(n for _, n in st.work) <= 50
        t += st.dt
        s.complete(st, t)
    assert not s.has_work


def test_decode_interleaves_with_chunked_prefill():
    s = Scheduler(num_blocks=1000, max_num_seqs=8, max_num_batched_tokens=64, step_time=flat_step)
    s.add(Request("a", prompt_len=10, max_tokens=50, arrival=0.0))
    t = drive_steps(s, 0.0, 3)  # a is decoding
    s.add(Request("b", prompt_len=500, max_tokens=5, arrival=t))
    st = s.schedule(t)
    kinds = {r.rid: n for r, n in st.work}
    assert kinds == {"a": 1, "b": 63}  # one decode + the rest of the budget for b's chunk
    assert st.decode_batch == 1 and st.prefill_tokens == 63


def test_v0_prefill_first_stalls_every_decode_for_a_whole_prompt():
    """V0 without chunked prefill (vllm/core/scheduler.py ``_schedule_default``, 0.4–0.7): waiting
    prompts go first, whole, in a step of their own — "Don't schedule decodes if prefills are
    scheduled" — and only a step that admits none decodes; a prompt does not fit a step beside
    another when the budget is spent, and ``max_num_seqs`` still bounds the running."""
    s = Scheduler(num_blocks=1000, max_num_seqs=3, max_num_batched_tokens=600, step_time=flat_step,
                  prefill_first=True)
    s.add(Request("a", prompt_len=10, max_tokens=50, arrival=0.0))
    t = drive_steps(s, 0.0, 3)  # a's prefill, then two decodes
    s.add(Request("b", prompt_len=500, max_tokens=5, arrival=t))
    s.add(Request("c", prompt_len=200, max_tokens=5, arrival=t))
    st = s.schedule(t)
    assert {r.rid: n for r, n in st.work} == {"b": 500}  # whole, alone: c does not fit the budget left
    assert st.decode_batch == 0 and st.prefill_tokens == 500
    t += st.dt
    s.complete(st, t)
    st = s.schedule(t)
    assert {r.rid: n for r, n in st.work} == {"c": 200}  # the next waiting prompt before any decode
    t += st.dt
    s.complete(st, t)
    s.add(Request("d", prompt_len=20, max_tokens=5, arrival=t))
    st = s.schedule(t)  # three running: d waits, and the step decodes all three
    assert {r.rid: n for r, n in st.work} == {"a": 1, "b": 1, "c": 1} and st.prefill_tokens == 0
    recs = Rec()
    s.add(Request("e", prompt_len=30, max_tokens=7, arrival=t, sink=recs))
    drive(s, t)
    assert recs.tokens == 7 and recs.done and s.free_blocks == 1000
    # the same arrivals with V1's mixing: b's prompt is chunked into a step beside a's decode
    v1 = Scheduler(num_blocks=1000, max_num_seqs=3, max_num_batched_tokens=600, step_time=flat_step)
    v1.add(Request("a", prompt_len=10, max_tokens=50, arrival=0.0))
    t = drive_steps(v1, 0.0, 3)
    v1.add(Request("b", prompt_len=500, max_tokens=5, arrival=t))
    assert v1.schedule(t).decode_batch == 1


def drive_steps(s, t, n):
    for _ in range(n):
        st = s.schedule(t)
        t += st.dt
        s.complete(st, t)
    return t


def test_preemption_by_recompute_when_kv_runs_out():
    # 20 blocks = 320 tokens; 4 requests of 64 + 100 tokens cannot all finish together
    s = Scheduler(num_blocks=20, max_num_seqs=8, max_num_batched_tokens=512, step_time=flat_step)
    recs = [Rec() for _ in range(4)]
    for i, r in enumerate(recs):
        s.add(Request(f"r{i}", prompt_len=64, max_tokens=100, arrival=0.0, sink=r))
    drive(s)
    assert s.num_preemptions > 0
    assert all(r.tokens == 100 and r.done for r in recs)  # recompute loses no tokens
    assert s.free_blocks == 20


def test_abort_frees_blocks():
    s = Scheduler(num_blocks=50, max_num_seqs=4, max_num_batched_tokens=256, step_time=flat_step)
    a = Request("a", 100, 100, 0.0)
    s.add(a)
    drive_steps(s, 0.0, 2)
    assert s.free_blocks < 50
    s.abort(a)
    assert s.free_blocks == 50 and not s.has_work and a.finish_reason == "abort"


RIG = ServerConfig(model="meta-llama/Meta-Llama-3-70B-Instruct-AWQ", tensor_parallel_size=8, max_num_seqs=64)


def test_plan_figures_for_the_70b_awq_rig():
    p = ma.plan_rig(RIG, "RTX 4090", 8)
    assert p.kv_bytes_per_token == 40960  # 327,680 B/token / TP 8 (docs/perf-model.md)
    assert p.weights_bytes / ma.GIB == pytest.approx(39.8e9 / 8 / ma.GIB, rel=0.03)
    assert p.max_num_seqs == 64 and p.max_num_batched_tokens == 2048
    assert p.kv_tokens == p.num_blocks * 16 > 300_000


def test_refusals_carry_vllms_text():
    with pytest.raises(ma.Refusal, match=r"World size \(8\) is larger than the number of available GPUs \(4\)"):
        ma.plan_rig(RIG, "RTX 4090", 4)
    with pytest.raises(ma.Refusal, match=r"attention heads \(64\) must be divisible by tensor parallel size \(3\)"):
        ma.plan_rig(RIG.model_copy(update={"tensor_parallel_size": 3}), "RTX 4090", 4)
    with pytest.raises(ma.Refusal, match="No available memory for the cache blocks"):
        ma.plan_rig(ServerConfig(model="meta-llama/Meta-Llama-3-8B-Instruct", gpu_memory_utilization=0.6),
                    "RTX 4090", 1)
    with pytest.raises(KeyError, match="not in the catalog"):
        ma.plan_rig(RIG, "RTX 9999", 8)


def test_pcie_without_p2p_is_slower_per_step_than_nvlink():
    cfg = ServerConfig(model="meta-llama/Meta-Llama-3-70B-Instruct", tensor_parallel_size=8)
    h100 = ma.StepModel(ma.plan_rig(cfg, "H100 SXM", 8))
    l40s = ma.StepModel(ma.plan_rig(cfg, "L40S", 8))  # PCIe with P2P
    rtx = ma.StepModel(ma.plan_rig(RIG, "RTX 4090", 8))  # PCIe without P2P
    assert h100.model.params.allreduce_alpha_s < rtx.model.params.allreduce_alpha_s
    assert l40s.model.params.allreduce_alpha_s < rtx.model.params.allreduce_alpha_s
    # one user: the 8× 4090 step is dominated by 160 all-reduces of ≈ 80 µs
    assert rtx.step_time_decode(1, 600) > 160 * 60e-6


def test_closed_loop_knee_at_max_num_seqs():
    p = ma.plan_rig(RIG, "RTX 4090", 8)
    sm = ma.StepModel(p)

    def mk():
        return Scheduler(p.num_blocks, p.max_num_seqs, p.max_num_batched_tokens, sm.step_time)

    # decode-heavy workload (128 in / 256 out): with 512-token prompts this rig saturates
    # earlier, on the prefill all-reduces over PCIe without P2P
    lv = {u: closed_loop(mk, u, 128, 256, duration_s=120, warmup_s=60) for u in (8, 32, 64, 128)}
    assert lv[8].throughput < lv[32].throughput < lv[64].throughput
    assert lv[128].throughput == pytest.approx(lv[64].throughput, rel=0.1)  # flat after 64
    assert lv[128].ttft_mean > 4 * lv[64].ttft_mean  # TTFT jumps: requests queue


def test_preemptions_when_kv_runs_out_with_long_outputs():
    cfg = RIG.model_copy(update={"max_num_seqs": 256, "gpu_memory_utilization": 0.5})
    p = ma.plan_rig(cfg, "RTX 4090", 8)
    sm = ma.StepModel(p)

    def mk():
        return Scheduler(p.num_blocks, p.max_num_seqs, p.max_num_batched_tokens, sm.step_time)

    need_blocks = 256 * (512 + 4000) // 16
    assert need_blocks > p.num_blocks  # the workload cannot all fit
    r = closed_loop(mk, 256, 512, 4000, duration_s=200, warmup_s=100)
    assert r.preemptions > 0


def test_thermal_model_heats_throttles_and_cools():
    p = ma.plan_rig(RIG, "RTX 4090", 8)
    bank = GpuBank(p, 8, cooling_factor("poor", 8), seed=3)
    bank.loaded = True
    t = 0.0
    while t < 600:  # 10 rig minutes fully busy
        t += 0.5
        bank.busy(t, 0.5)
    hot = bank.readings()
    assert all(r.temp_gpu_c > 80 for r in hot)
    assert any("thermal (software)" in r.throttle for r in hot)
    assert bank.slowdown > 1.0
    assert all(r.memory_used_bytes == hot[0].memory_used_bytes for r in hot)  # fixed reservation
    bank.advance(t + 900)  # idle for 15 min
    cool = bank.readings()
    assert all(r.temp_gpu_c < 50 and r.util_gpu_pct == 0 for r in cool)
    assert bank.slowdown == 1.0 and all("idle" in r.throttle for r in cool)


def test_good_cooling_does_not_throttle():
    p = ma.plan_rig(RIG, "RTX 4090", 8)
    bank = GpuBank(p, 8, cooling_factor("open", 8), seed=3)
    bank.busy(600.0, 600.0)
    assert bank.slowdown == 1.0
    with pytest.raises(ValueError, match="--sim-cooling"):
        cooling_factor("arctic", 4)


# ---------------------------------------------------------------------- pipeline parallelism: batches in flight
class Times:
    """A sink that keeps each token's rig time."""

    def __init__(self):
        self.t: list[float] = []
        self.done = False

    def on_token(self, r, t):
        self.t.extend([t] * (r.output - len(self.t)))

    def on_finish(self, r, t):
        self.done = True


def pp_model(pp: int = 4) -> "ma.StepModel":
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", max_model_len=8192, pipeline_parallel_size=pp)
    return ma.StepModel(ma.plan_rig(cfg, "RTX 4090", pp))


def run_core(s: Scheduler, reqs: list[tuple[int, int]], snapshots: list | None = None) -> list[Times]:
    """``reqs`` (prompt, max_tokens) all queued at rig time 0, run to the end with the
    engine-core loop the offline engine and the sim share (advance / complete_due);
    ``snapshots`` gets the batches in flight after each call."""
    sinks = []
    for i, (p, o) in enumerate(reqs):
        sinks.append(Times())
        s.add(Request(f"r{i}", p, o, 0.0, sink=sinks[-1]))
    s.advance(0.0)
    for _ in range(100000):
        if snapshots is not None:
            snapshots.append([list(b.work) for b in s.batches])
        t = s.next_due
        if t is None:
            assert all(x.done for x in sinks)
            return sinks
        s.complete_due(t)
        s.advance(t)
    raise AssertionError("engine did not drain")


def decode_rate(sinks: list[Times]) -> float:
    """Output tokens/s while every request decodes (after the last first token, before the
    first request ends)."""
    a, b = max(x.t[0] for x in sinks), min(x.t[-1] for x in sinks)
    return sum(1 for x in sinks for t in x.t if a < t <= b) / (b - a)


def test_pp_keeps_a_batch_per_stage_in_flight_and_decodes_p_times_faster_per_batch():
    """PP 4 (vLLM's batch queue: max_concurrent_batches = pipeline_parallel_size,
    vllm/config/vllm.py:577 and vllm/v1/engine/core.py:698, 0.32.0): 16 prompts of 512
    tokens under a 2048-token budget go out as 4 batches of 4 before the first returns,
    and stay 4 groups; with a batch on every stage, a batch of 4 decodes every stage-time
    (the model's interval) instead of every full pass: the decode rate is the serial
    engine's on the same batch of 4 × latency/interval (≈ P; the end stages are a little
    slower). At the same 16 users, memory-bound decode gains or loses little (within −10 …
    +30 %): each of the 4 batches reads every stage's weights, and the pipeline saves only the
    step's CPU time the stages overlap (0.7 ms with V1's defaults) against its slowest stage."""
    sm = pp_model(4)
    lat, gap = sm.engine_step_time(4, 4 * 560, 0)
    assert 3.0 < lat / gap <= 4.0
    snaps: list = []
    pp16 = decode_rate(run_core(Scheduler(10000, 64, 2048, sm.engine_step_time, max_concurrent_batches=4),
                                [(512, 96)] * 16, snaps))
    assert [len(w) for w in snaps[0]] == [4, 4, 4, 4]
    ser4 = decode_rate(run_core(Scheduler(10000, 64, 2048, sm.step_time), [(512, 96)] * 4))
    assert pp16 / ser4 == pytest.approx(lat / gap, rel=0.05)
    ser16 = decode_rate(run_core(Scheduler(10000, 64, 2048, sm.step_time), [(512, 96)] * 16))
    assert 0.9 < pp16 / ser16 < 1.3
    # a request in a batch in flight is in no other (its next token needs this one's output)
    for snap in snaps:
        ids = [id(r) for w in snap for r, _ in w]
        assert len(ids) == len(set(ids))


def test_pp_lone_request_goes_through_every_stage_once_per_token():
    """One request on PP 4: its TTFT is one pass of its prefill through all stages and
    each next token waits for the one before — the same token times as one batch at a
    time (the full-pass step model), to the float."""
    sm = pp_model(4)
    pp = run_core(Scheduler(10000, 64, 2048, sm.engine_step_time, max_concurrent_batches=4), [(512, 12)])[0].t
    ser = run_core(Scheduler(10000, 64, 2048, sm.step_time), [(512, 12)])[0].t
    assert pp == pytest.approx(ser, rel=1e-12, abs=1e-12)
    assert pp[0] == pytest.approx(sm.step_time(0, 0, 512, 512 * 256), rel=1e-12)


def test_pp_chunks_of_one_prompt_follow_each_other_through_the_stages():
    """vLLM advances a request's computed tokens when it schedules it
    (Scheduler._update_after_schedule, vllm/v1/core/sched/scheduler.py:1616, 0.32.0), so
    the next chunk of a long prompt goes into the very next batch: a 4096-token prompt
    under a 1024-token budget is 4 batches in flight at once, and its first token comes
    one pass of the last chunk after the first three chunks' stage-times."""
    sm = pp_model(4)
    snaps: list = []
    s = Scheduler(10000, 64, 1024, sm.engine_step_time, max_concurrent_batches=4)
    t = run_core(s, [(4096, 2)], snaps)[0].t
    assert [[n for _, n in w] for w in snaps[0]] == [[1024]] * 4
    want = sum(sm.engine_step_time(0, 0, 1024, 1024 * (c + 512))[1] for c in (0, 1024, 2048))
    assert t[0] == pytest.approx(want + sm.step_time(0, 0, 1024, 1024 * (3072 + 512)), rel=1e-9)
    ser = run_core(Scheduler(10000, 64, 1024, sm.step_time), [(4096, 2)])[0].t
    assert t[0] < 0.6 * ser[0]  # serially: four full passes


def test_pp_preempted_in_flight_requests_still_end_with_exact_counts():
    """A KV pool too small for the batches in flight: requests are preempted while their
    work is in the pipeline; that work is dropped when its batch ends and every request
    still gets exactly its max_tokens."""
    s = Scheduler(num_blocks=24, max_num_seqs=16, max_num_batched_tokens=128,
                  step_time=lambda b, c, n, a: (0.02 + 1e-5 * n, 0.005 + 2.5e-6 * n), max_concurrent_batches=4)
    sinks = run_core(s, [(40, 60)] * 12)
    assert s.num_preemptions > 0
    assert [len(x.t) for x in sinks] == [60] * 12
    assert s.free_blocks == s.num_blocks and not s.batches
