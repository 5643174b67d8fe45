"""Admission control on the real CPU build (vLLM 0.32.0, tiny model; issue 38, item 3):
the shared variant server runs with ``--max-num-queued-reqs`` (tests/conftest.py
``QUEUED_REQS``). A burst past the cap gets vLLM's own 503 — the body and headers the sim
copies (app/engine/admission.py) — counted in ``vllm:admission_rejections_total``, and a
ramp past it reports the refusals as ``rejected``, apart from failures: the HTTP 503s and
the 503 error events of streams refused by vLLM's second check, at registration (a first
run of this test counted those 6 of 111 as server errors). No launch of its own."""
from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from app.engine.admission import REJECTED_MESSAGES, REJECTED_TYPE
from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from tests.conftest import QUEUED_REQS


async def _burst(url: str, n: int) -> list[tuple[int, dict, dict]]:
    async def one(s: aiohttp.ClientSession, i: int) -> tuple[int, dict, dict]:
        body = {"model": "tiny", "prompt": f"Count slowly from {i} to one thousand:", "max_tokens": 96,
                "ignore_eos": True, "stream": True}
        async with s.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                return r.status, await r.json(content_type=None), dict(r.headers)
            await r.read()
            return 200, {}, dict(r.headers)

    async with aiohttp.ClientSession() as s:
        held = [asyncio.create_task(one(s, i)) for i in range(QUEUED_REQS)]
        await asyncio.sleep(1.0)  # the cap's requests are in the engine (tokenized) before the rest come
        more = [asyncio.create_task(one(s, i)) for i in range(QUEUED_REQS, QUEUED_REQS + 4)]
        return list(await asyncio.gather(*held, *more))


async def _rejections(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:admission_rejections")
    return {x.labels["reason"]: x.value for x in fam.samples if x.name.endswith("_total")}


def test_the_real_server_refuses_past_its_cap_as_the_sim_does(vllm_variant_server):
    url = vllm_variant_server.url
    before = asyncio.run(_rejections(url))
    out = asyncio.run(_burst(url, QUEUED_REQS + 4))
    after = asyncio.run(_rejections(url))
    refused = [o for o in out if o[0] == 503]
    print([o[0] for o in out], refused[:1])
    assert refused, [o[0] for o in out]
    for _, body, headers in refused:  # what app/engine/admission.py and the sim answer
        assert body == {"error": {"message": REJECTED_MESSAGES["max_num_queued_reqs"], "type": REJECTED_TYPE,
                                  "param": None, "code": 503}}
        assert "Retry-After" not in headers
    assert after["max_num_queued_reqs"] - before["max_num_queued_reqs"] == len(refused)
    assert after["max_num_queued_tokens"] == before["max_num_queued_tokens"]
    # the load generator: 10 users against the cap of 6 — refusals apart from failures, the ramp runs on
    spec = RampSpec(url=url, model="tiny", levels=[QUEUED_REQS + 4], step_seconds=6, output_tokens=32,
                    request_timeout=60, max_failure_rate=0.05, rejected_wait_s=0.2)
    res = run_ramp(spec, timeout=120)
    st = res.steps[0]
    print(f"{st.level:g} users: {st.n_measured} sent, {st.rejected} rejected, {st.n_ok} ok, failures {st.failures}")
    assert res.status == "done" and st.rejected > 0 and not st.failures and st.failure_rate == 0.0
    assert st.n_ok > 0 and st.max_in_flight <= QUEUED_REQS + 4
