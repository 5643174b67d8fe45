"""The simulated rig's parallel layouts, started through the real Supervisor: data
parallel replicas (``--data-parallel-size``: one HTTP API over D engines, requests
routed by vLLM's load balancer, /metrics per engine, /sim/info and the virtual GPUs per
replica, vLLM's refusal when the replicas need more cards than the rig has) and
pipeline parallel stages. No vLLM needed."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from app.config import ServerConfig
from app.engine.balance import DpBalancer
from app.sim import model_adapter as ma
from app.sim.http_api import ApiServer
from app.telemetry.gpu_source import TelemetryDocument
from app.telemetry.metrics_parse import parse_metrics
from tests.integration.test_sim_server import fails_with, sim_args, start, stop_and_check
from tests.plugins.shared import once_per_run

MODEL = "Qwen/Qwen2.5-7B-Instruct"
K = 10.0


async def _get(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url) as r:
        return await r.text()


async def _complete(s: aiohttp.ClientSession, url: str, out: int) -> int:
    body = {"prompt": list(range(64)), "max_tokens": out, "ignore_eos": True, "stream": True}
    n = 0
    async with s.post(url + "/v1/completions", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                n += 1
    return n


def _serve(users: int, dp: int, out: int = 300) -> dict:
    """``users`` concurrent streaming requests against a sim with ``dp`` replicas of one
    RTX 4090 each: output tokens, rig seconds, and /metrics, /sim/info and
    /sim/telemetry read while the requests run."""
    cfg = ServerConfig(model=MODEL, max_model_len=2048, max_num_seqs=64, data_parallel_size=dp)
    sup = start(cfg, sim_args(count=dp, k=K))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())

        async def go():
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                jobs = asyncio.gather(*(_complete(s, sup.url, out) for _ in range(users)))
                await asyncio.sleep(0.4)  # mid-run (≈ 4 rig s)
                tele = TelemetryDocument.model_validate_json(await _get(s, sup.url + "/sim/telemetry"))
                info = json.loads(await _get(s, sup.url + "/sim/info"))
                tokens = sum(await jobs)
                wall = time.monotonic() - t0
                metrics = parse_metrics(await _get(s, sup.url + "/metrics"))
                return {"tokens": tokens, "rig_s": wall * K, "tele": tele, "info": info, "metrics": metrics}

        return asyncio.run(go())
    finally:
        stop_and_check(sup)


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory):
    """One replica with 8 users and two with 16 (:func:`_serve`), served once per test run
    (tests/plugins/shared.py: the tests that read them may run on two xdist workers)."""
    return once_per_run(tmp_path_factory, "sim-parallel-one-and-two", lambda _: (_serve(8, 1), _serve(16, 2)))


def test_replicas_share_the_requests_and_add_their_throughput(one_and_two):
    """16 users on two replicas of a memory-bound 7B model: each replica runs 8, as one
    replica does with 8 users, so the output tokens/s double (within 15 %); each
    engine's /metrics series counts its half of the requests."""
    one, two = one_and_two
    assert one["tokens"] == 8 * 300 and two["tokens"] == 16 * 300
    tps1, tps2 = one["tokens"] / one["rig_s"], two["tokens"] / two["rig_s"]
    assert tps2 == pytest.approx(2 * tps1, rel=0.15), (tps1, tps2)
    m = two["metrics"]
    done = {e: v for e, v in m.counter_by_engine("request_success").items()}
    assert set(done) == {"0", "1"} and done["0"] == done["1"] == 8
    assert set(m.cache_config) == {"0", "1"} and m.num_gpu_blocks == 2 * int(m.cache_config["0"]["num_gpu_blocks"])
    assert set(one["metrics"].counter_by_engine("request_success")) == {"0"}


def test_sim_info_and_the_virtual_gpus_show_each_replica(one_and_two):
    one, two = one_and_two
    info = two["info"]
    assert info["data_parallel_size"] == 2 and one["info"]["data_parallel_size"] == 1
    assert [e["running"] for e in info["engines"]] == [8, 8] and info["engine"]["running"] == 16
    p = ma.plan_rig(ServerConfig(model=MODEL, max_model_len=2048, max_num_seqs=64), "RTX 4090", 1)
    assert info["num_gpu_blocks"] == p.num_blocks  # each replica: one card's KV cache
    cards = two["tele"].readings
    assert len(cards) == 2 and all(c.util_gpu_pct > 50 for c in cards)  # both replicas' cards busy
    assert all(c.memory_used_bytes > 0.8 * c.memory_total_bytes for c in cards)


def test_the_front_end_routes_by_the_replicas_load_with_the_offline_engines_rule():
    """The HTTP front end reads each replica's scheduler (waiting, running, KV usage) and
    picks as app.engine.balance.DpBalancer does — the rule the planner's offline engine
    routes with: the least-loaded replica, a waiting queue weighed by KV pressure."""
    from app.engine.scheduler import Request  # deferred: only this test builds requests
    from app.sim.engine import SimEngine
    from app.sim.gpus import GpuBank
    from app.sim.metrics import SimMetrics

    sp = ma.plan_rig(ServerConfig(model=MODEL, max_model_len=2048, data_parallel_size=3), "RTX 4090", 3)
    bank, metrics = GpuBank(sp, 3, 1.0), SimMetrics("m", sp.num_blocks, 0.92, 3)
    engines = [SimEngine(sp.num_blocks, 4, 2048, lambda *a: 0.01, bank, metrics, index=i) for i in range(3)]
    api = ApiServer(engines, "m", MODEL, 2048, {})
    for e, n in zip(engines, (6, 2, 3)):  # 4 running and 2 waiting, 2 running, 3 running
        for j in range(n):
            e.sched.add(Request(f"r{j}", 32, 8, 0.0))
        e.sched.schedule(0.0)
    ref = DpBalancer(3)
    counts = [(len(e.sched.waiting), len(e.sched.running), e.sched.kv_usage) for e in engines]
    assert counts == [(2, 4, counts[0][2]), (0, 2, counts[1][2]), (0, 3, counts[2][2])]
    picks = [api.route().index for _ in range(4)]
    assert picks == [ref.choose(0.0, lambda: counts) for _ in range(4)] == [1, 1, 2, 1]


def test_replicas_past_the_cards_fail_like_vllm():
    """DP 3 × TP 1 on 2 cards: vLLM 0.32's worker device check (gpu_worker.py
    init_device) in the third replica's engine core; the diagnosis offers DP 2."""
    from app.planner.diagnose import diagnose  # deferred: only this test diagnoses

    sup = fails_with(ServerConfig(model=MODEL, max_model_len=2048, data_parallel_size=3), sim_args(count=2),
                      "AssertionError: DP adjusted local rank 2 is out of bounds for 2 devices.", "not_enough_gpus")
    tail = sup.failure.log_tail
    assert any(line.startswith("(EngineCore_DP2 ") for line in tail)
    assert any("Failed core proc(s): {'EngineCore_DP2': 1}" in line for line in tail)
    assert diagnose(tail).fix == {"data_parallel_size": 2}
    # TP 2 × DP 2 on 3 cards: the second replica's second worker is past them
    fails_with(ServerConfig(model=MODEL, max_model_len=2048, tensor_parallel_size=2, data_parallel_size=2),
                sim_args(count=3), "AssertionError: DP adjusted local rank 3 is out of bounds for 3 devices.",
                "not_enough_gpus")


def test_pipeline_parallel_is_served_on_its_stages_cards():
    """PP 2 on two cards: the startup facts are the plan's, requests are served with
    exact counts, both stages' cards hold their share and are busy while it decodes —
    each for its stage's share of the pass (vLLM's batch queue has only this request's
    batch in flight) — and the per-token time is the two-stage step model's full pass."""
    cfg = ServerConfig(model=MODEL, max_model_len=2048, pipeline_parallel_size=2)
    sp = ma.plan_rig(cfg, "RTX 4090", 2)
    sup = start(cfg, sim_args(count=2, k=K))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())
        assert sup.parser.facts.kv_cache_tokens == sp.kv_tokens

        async def go():
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                job = asyncio.ensure_future(_complete(s, sup.url, 400))
                await asyncio.sleep(0.5)
                tele = TelemetryDocument.model_validate_json(await _get(s, sup.url + "/sim/telemetry"))
                n = await job
                return n, (time.monotonic() - t0) * K, tele, json.loads(await _get(s, sup.url + "/sim/info"))

        n, rig_s, tele, info = asyncio.run(go())
    finally:
        stop_and_check(sup)
    assert n == 400 and info["pipeline_parallel_size"] == 2 and info["tensor_parallel_size"] == 1
    # one request is one batch in flight: each stage's card works its stage's share of every pass (≈ half)
    assert [30 < c.util_gpu_pct < 70 for c in tele.readings] == [True, True], [c.util_gpu_pct for c in tele.readings]
    assert [c.memory_used_bytes for c in tele.readings] == [int(b) for b in sp.used_bytes_per_rank]
    step = ma.StepModel(sp).step_time_decode(1, 64 + 200)
    assert rig_s / 400 == pytest.approx(step, rel=0.1)  # one token a step, prefill and HTTP included


# ---------------------------------------------------------------------- rigs of several hosts (issue 21)
def test_pp_over_hosts_steps_slower_on_a_slower_link_offline():
    """PP 4 over 4 hosts × 1 card: the sim's step model (the planner's) sends the three
    stage boundaries over the link; on the offline step engine 16 users' time per output
    token is longer on 10 GbE than on InfiniBand HDR than on one host, by what the step
    model gives for their batch (the engine's measured ITL, not the formula)."""
    from app.engine.offline import sim_level

    cfg = ServerConfig(model=MODEL, max_model_len=2048, pipeline_parallel_size=4)
    itl, model = {}, {}
    for name, hosts, link in (("one", 1, None), ("ib", 4, "ib-hdr200"), ("eth", 4, "10gbe")):
        sp = ma.plan_rig(cfg, "RTX 4090", 4, hosts, link)
        sm = ma.StepModel(sp)
        # short prompts: the decode steps' sends dominate (a prefill chunk's activations are larger)
        itl[name] = sim_level(sp, sm, 16, 8, 128, duration_s=30.0, warmup_s=5.0).itl_mean
        model[name] = sm.step_time_decode(16, 8 + 64)
    assert itl["one"] < itl["ib"] < itl["eth"], itl
    assert itl["eth"] - itl["one"] == pytest.approx(model["eth"] - model["one"], rel=0.3), (itl, model)


def test_sim_hosts_need_a_dividing_count_and_a_known_link():
    cfg = ServerConfig(model=MODEL, max_model_len=2048, pipeline_parallel_size=4)
    with pytest.raises(ValueError, match="--sim-hosts 3 does not divide --sim-gpu-count 4"):
        ma.plan_rig(cfg, "RTX 4090", 4, 3, "10gbe")
    with pytest.raises(ValueError, match="--sim-hosts 4 needs --sim-link NAME.*ib-hdr200"):
        ma.plan_rig(cfg, "RTX 4090", 4, 4, None)
    with pytest.raises(ValueError, match="--sim-link: link 'eth' is not in the link catalog"):
        ma.plan_rig(cfg, "RTX 4090", 4, 4, "eth")
    fails_with(cfg, sim_args(count=4, extra=("--sim-hosts", "3", "--sim-link", "10gbe")),
               "--sim-hosts 3 does not divide --sim-gpu-count 4")
    # a profile's sim rig names them too (normalized; a wrong link refused naming the catalog)
    from app.profiles.model import SimRig
    assert SimRig(count=4, hosts=4, link="IB_HDR200").argv()[:6] == [
        "--sim-gpu", "RTX 4090", "--sim-gpu-count", "4", "--sim-hosts", "4"]
    assert SimRig(count=4, hosts=4, link="IB_HDR200").link == "ib-hdr200"
    with pytest.raises(ValueError, match="not in the link catalog"):
        SimRig(count=4, hosts=4, link="eth")


def test_tp_across_two_hosts_on_10gbe_is_served_at_the_models_slower_step():
    """TP 2 over 2 hosts × 1 card on 10 GbE (vLLM serves it; the plan warns): every layer
    all-reduces twice over the network, so one user's time per token is the multi-host
    step model's — well above the one-host model's — measured over HTTP."""
    cfg = ServerConfig(model=MODEL, max_model_len=2048, tensor_parallel_size=2)
    sp = ma.plan_rig(cfg, "RTX 4090", 2, 2, "10gbe")
    sup = start(cfg, sim_args(count=2, k=K, extra=("--sim-hosts", "2", "--sim-link", "10gbe")))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())

        async def go():
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                n = await _complete(s, sup.url, 300)
                return n, (time.monotonic() - t0) * K, json.loads(await _get(s, sup.url + "/sim/info"))

        n, rig_s, info = asyncio.run(go())
    finally:
        stop_and_check(sup)
    assert n == 300 and info["hosts"] == 2 and info["link"] == "10gbe"
    step = ma.StepModel(sp).step_time_decode(1, 64 + 150)
    one_host = ma.StepModel(ma.plan_rig(cfg, "RTX 4090", 2)).step_time_decode(1, 64 + 150)
    assert step > 1.2 * one_host
    assert rig_s / 300 == pytest.approx(step, rel=0.1), (rig_s / 300, step, one_host)
    assert rig_s / 300 > 1.05 * one_host


# ---------------------------------------------------------------------- PP: batches in flight over HTTP
def test_pp_sim_keeps_the_stages_busy_with_batches_in_flight():
    """PP 4 on 4 RTX 4090s, 12 requests of 2048 prompt tokens and 4 output tokens over
    HTTP, one prompt per batch (max_num_batched_tokens 2048): vLLM keeps up to
    pipeline_parallel_size batches in flight (vllm/config/vllm.py:577, vllm/v1/engine/
    core.py:698, 0.32.0), so compute-bound prefills follow each other a stage-time apart
    instead of a full pass apart. The sim serves them in about the rig time the shared
    engine loop gives with 4 batches in flight, well under the time one batch at a time
    would take (≈ 2.7× as long: the prefill batches fill the pipeline, the decodes less)."""
    from app.engine.scheduler import Request, Scheduler

    k = 2.0
    cfg = ServerConfig(model=MODEL, max_model_len=4096, pipeline_parallel_size=4, max_num_batched_tokens=2048)
    sm = ma.StepModel(ma.plan_rig(cfg, "RTX 4090", 4))

    def offline(depth: int) -> float:
        s = Scheduler(100000, 256, 2048, sm.engine_step_time if depth > 1 else sm.step_time,
                      max_concurrent_batches=depth)
        for i in range(12):
            s.add(Request(f"r{i}", 2048, 4, 0.0))
        s.advance(0.0)
        t = 0.0
        while s.next_due is not None:
            t = s.next_due
            s.complete_due(t)
            s.advance(t)
        return t

    t_pp, t_serial = offline(4), offline(1)
    assert t_serial > 2.5 * t_pp
    sup = start(cfg, sim_args(count=4, k=k))
    try:
        assert sup.wait_ready(60), "\n".join(sup.log_tail())

        async def one(s: aiohttp.ClientSession, i: int) -> int:
            prompt = [(7919 * i + j) % 30000 for j in range(2048)]  # no shared prefix to cache
            body = {"prompt": prompt, "max_tokens": 4, "ignore_eos": True, "stream": True}
            n = 0
            async with s.post(sup.url + "/v1/completions", json=body) as r:
                assert r.status == 200
                async for line in r.content:
                    n += line.startswith(b"data: {")
            return n

        async def go():
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                n = sum(await asyncio.gather(*(one(s, i) for i in range(12))))
                return n, (time.monotonic() - t0) * k

        n, rig_s = asyncio.run(go())
    finally:
        stop_and_check(sup)
    print(f"\nPP 4 over HTTP: {rig_s:.2f} rig s; engine loop {t_pp:.2f} s with 4 batches in flight, {t_serial:.2f} s one at a time")
    assert n == 48
    # HTTP, tokenization and a loaded machine only add time; the requests reach the engine a little apart
    assert 0.8 * t_pp < rig_s < 0.6 * t_serial, (rig_s, t_pp, t_serial)
