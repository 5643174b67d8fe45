"""Admission control against the sim and a scripted server (issue 38, item 3): the sim
refuses as vLLM 0.32.0 does (503, its body, no Retry-After, ``vllm:admission_rejections``,
counted over the data parallel ranks), and the load generator counts the refusals as
``rejected`` — apart from failures, never stopping the ramp, sending again after the wait —
so that an overloaded level is judged and the capacity search answers. The rules:
tests/unit/test_admission.py."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from app.engine.admission import REJECTED_MESSAGES
from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RunController
from tests.loadgen_server import Script, ScriptedServer
from tests.unit.test_capacity import DEMO, DEMO_RIG


def _launch(**options) -> RunController:
    ctl = RunController()
    assert ctl.launch(LaunchTarget("sim", DEMO.model_copy(update=options), sim_args=DEMO_RIG, telemetry=False)) == []
    assert ctl.wait_ready(60), ctl.failure_text
    return ctl


async def _burst(url: str, n: int, prompt: str = "hello there", max_tokens: int = 400) -> list[tuple[int, dict, dict]]:
    """``n`` streaming completions sent at once: (status, body of a refusal or {}, headers)."""
    async def one(s: aiohttp.ClientSession, i: int) -> tuple[int, dict, dict]:
        body = {"model": "llama70", "prompt": f"{prompt} {i}", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}
        async with s.post(url + "/v1/completions", json=body) as r:
            if r.status != 200:
                return r.status, await r.json(), dict(r.headers)
            await r.read()
            return 200, {}, dict(r.headers)

    async with aiohttp.ClientSession() as s:
        first = [asyncio.create_task(one(s, i)) for i in range(2)]
        await asyncio.sleep(0.3)  # the first two are in the engine before the rest arrive
        rest = [asyncio.create_task(one(s, i)) for i in range(2, n)]
        return list(await asyncio.gather(*first, *rest))


def _rejections(url: str) -> dict[str, float]:
    """``vllm:admission_rejections_total`` by reason, as /metrics exports it."""
    text = asyncio.run(_get(url + "/metrics"))
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:admission_rejections")
    return {s.labels["reason"]: s.value for s in fam.samples if s.name.endswith("_total")}


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(url) as r:
            return await r.text()


def test_the_sim_refuses_beyond_its_queue_cap_as_vllm_does():
    """--max-num-queued-reqs 2, two data parallel replicas: 2 requests in flight over both,
    the other 4 answered at once with vLLM's 503 body and no Retry-After, each counted
    under its reason in /metrics."""
    ctl = _launch(max_num_queued_reqs=2, tensor_parallel_size=4, data_parallel_size=2)
    try:
        out = asyncio.run(_burst(ctl.url, 6))
        counts = _rejections(ctl.url)
    finally:
        ctl.stop()
        ctl.close()
    refused = [o for o in out if o[0] == 503]
    assert [o[0] for o in out].count(200) == 2 and len(refused) == 4, [o[0] for o in out]
    for _, body, headers in refused:
        assert body == {"error": {"message": REJECTED_MESSAGES["max_num_queued_reqs"], "type": "Service Unavailable",
                                  "param": None, "code": 503}}
        assert "Retry-After" not in headers
    assert counts == {"max_num_queued_reqs": 4.0, "max_num_queued_tokens": 0.0}


def test_the_sim_refuses_beyond_its_prefill_backlog():
    """--max-num-queued-tokens: a backlog of long prompts still in prefill refuses the next."""
    ctl = _launch(max_num_queued_tokens=1)
    try:
        out = asyncio.run(_burst(ctl.url, 4, prompt="word " * 3000, max_tokens=8))
        counts = _rejections(ctl.url)
    finally:
        ctl.stop()
        ctl.close()
    assert any(o[0] == 503 and o[1]["error"]["message"] == REJECTED_MESSAGES["max_num_queued_tokens"] for o in out)
    assert counts["max_num_queued_tokens"] == sum(1 for o in out if o[0] == 503) and counts["max_num_queued_reqs"] == 0


def test_an_overloaded_level_reports_rejections_apart_from_failures(tmp_path):
    """`ramp` against the sim with --max-num-queued-reqs 6 and the failure-rate stop at 5 %:
    16 users are refused most of the time, yet the ramp runs to its end; the level's
    `rejected` is an int apart from `failures`, its failure rate 0; the table shows it."""
    ctl = _launch(max_num_queued_reqs=6)
    out = tmp_path / "ramp.json"
    try:
        r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", ctl.url, "--levels", "2,16",
                            "--step-seconds", "20", "--prompt-tokens", "128", "--output-tokens", "64",
                            "--max-failure-rate", "0.05", "--json", str(out), "--no-store"],
                           capture_output=True, text=True, timeout=300)
    finally:
        ctl.stop()
        ctl.close()
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    low, high = doc["steps"]
    assert low["rejected"] == 0 and isinstance(high["rejected"], int) and high["rejected"] > 0
    assert high["failures"] == {} and high["failure_rate"] == 0.0 and high["stop_reason"] == "duration"
    assert high["rejection_rate"] == high["rejected"] / high["n_measured"]
    assert doc["summary"]["status"] == "done", doc["summary"]["stop_reason"]
    assert high["server"]["ttft_count"] > 0  # the admitted requests' own figures
    # the server's own count of its refusals over the window (Δvllm:admission_rejections_total)
    assert abs(high["server"]["admission_rejections"] - high["rejected"]) <= max(3, 0.1 * high["rejected"])
    assert low["server"]["admission_rejections"] == 0
    head = next(line for line in r.stdout.splitlines() if line.startswith("level ") and " rej " in line)
    assert "fail" in head and f"{high['rejected']} rejected (HTTP 503)" in r.stdout


def test_the_capacity_search_answers_under_a_queue_cap(tmp_path):
    """With --max-num-queued-reqs 6 and --slo-rejection-rate 0.05 every level above 6 users
    is refused beyond the bound: the search answers 6 users, limited by the rejections."""
    ctl = _launch(max_num_queued_reqs=6)
    out = tmp_path / "cap.json"
    try:
        r = subprocess.run([sys.executable, "-m", "app.cli", "ramp", "--url", ctl.url, "--find-capacity",
                            "--start", "4", "--max-users", "16", "--slo-ttft-p99", "20", "--slo-rejection-rate", "0.05",
                            "--prompt-tokens", "128", "--output-tokens", "32", "--min-requests", "40",
                            "--json", str(out), "--no-store"], capture_output=True, text=True, timeout=400)
    finally:
        ctl.stop()
        ctl.close()
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    cap = doc["capacity"]
    print(r.stdout[-2000:])
    assert cap["users"] == 6 and "rejections" in cap["limited_by"], (cap["users"], cap["limited_by"])
    broke = [lv for lv in cap["levels"] if not lv["met"]]
    assert broke and all(lv["stats"]["rejected"] > 0 and lv["stats"]["failure_rate"] == 0 for lv in broke)
    assert doc["verdict"]["limited_by"] == "rejections" and "HTTP 503" in doc["verdict"]["limit"]


def test_a_refused_user_waits_and_sends_the_same_request_again():
    """One user against a server that refuses every other request: after a refusal it
    waits the Retry-After (1 s), or without one the ramp's rejected_wait_s, and sends
    the same body again; half the requests refused and the failure stop (5 %) never fires."""
    for retry_after, wait in (("1", 1.0), (None, 0.3)):
        with ScriptedServer(Script(ttft=0.02, itl=0.005, reject_fraction=0.5, retry_after=retry_after)) as srv:
            spec = RampSpec(url=srv.url, model="scripted", levels=[1], step_seconds=3.5, prompt_tokens=8,
                            output_tokens=5, length_spread=0, max_failure_rate=0.05, min_requests_for_abort=2,
                            rejected_wait_s=wait)
            res = run_ramp(spec, timeout=60)
        recs = sorted(res.records, key=lambda r: r.t_start)
        st = res.steps[0]
        assert res.status == "done" and st.stop_reason == "duration" and st.failure_rate == 0.0
        assert st.rejected >= 2 and st.rejection_rate > 0.3 and not st.failures
        for a, b in zip(recs, recs[1:]):
            if a.rejected:
                assert a.retry_after == (1.0 if retry_after else None)
                assert b.t_start - a.t_end >= wait - 0.02, (retry_after, b.t_start - a.t_end)
        bodies = srv.bodies
        for n in srv.rejected:
            if n < len(bodies):  # request n (1-based) refused: request n + 1 is the same one again
                assert bodies[n] == bodies[n - 1]


def test_a_503_error_event_before_any_output_is_a_rejection():
    """vLLM 0.32 checks admission again when it registers a request, after tokenization
    (vllm/v1/engine/async_llm.py:569): a streaming request refused there gets a 200 stream
    whose only event is the 503 error — a rejection, not a server error (seen on the CPU
    build: tests/e2e/test_admission_e2e.py). An error event after output stays a failure."""
    err = json.dumps({"error": {"message": REJECTED_MESSAGES["max_num_queued_reqs"], "type": "Service Unavailable",
                                "param": None, "code": 503}})
    tok = json.dumps({"id": "c", "object": "text_completion", "model": "scripted",
                      "choices": [{"index": 0, "text": " a", "finish_reason": None}]})
    for events, status in (([[0.01, err], [0.02, "[DONE]"]], "rejected"),
                           ([[0.01, tok], [0.02, err], [0.03, "[DONE]"]], "server_error")):
        with ScriptedServer(Script(events=events)) as srv:
            spec = RampSpec(url=srv.url, model="scripted", levels=[1], step_seconds=0.5, prompt_tokens=8,
                            output_tokens=5, length_spread=0, rejected_wait_s=0.1, max_failure_rate=1.0)
            res = run_ramp(spec, timeout=60)
        assert res.records and {r.status for r in res.records} == {status}, status
