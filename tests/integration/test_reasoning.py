"""The load generator reads a reasoning model's stream (issue 38, item 2): vLLM 0.32 streams
the reasoning as ``delta.reasoning`` (vllm/entrypoints/generate/base/protocol.py:359; older
versions ``reasoning_content``) before the answer's ``delta.content``; TTFT is the first
chunk of either, TTFA the first of the answer, and the reasoning tokens are counted."""
from __future__ import annotations

import json

import pytest

from app.loadgen.generator import run_ramp
from app.loadgen.spec import RampSpec
from tests.loadgen_server import Script, ScriptedServer


def _events(field: str) -> list:
    def chunk(delta: dict, finish=None) -> str:
        return json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "scripted",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    ev = [[0.01, chunk({"role": "assistant", "content": ""})]]
    ev += [[0.05 + 0.01 * i, chunk({field: f" think{i}"})] for i in range(6)]  # 6 reasoning tokens
    ev += [[0.2 + 0.01 * i, chunk({"content": f" word{i}"}, "length" if i == 3 else None)] for i in range(4)]
    ev += [[0.25, json.dumps({"id": "c", "object": "chat.completion.chunk", "model": "scripted", "choices": [],
                              "usage": {"prompt_tokens": 9, "completion_tokens": 10, "total_tokens": 19}})],
           [0.26, "[DONE]"]]
    return ev


@pytest.mark.serial  # judges the client's clocks to ±30 ms: alone, not beside three busy workers
@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_ttfa_and_reasoning_tokens_from_a_reasoning_stream(field):
    with ScriptedServer(Script(events=_events(field))) as srv:
        spec = RampSpec(url=srv.url, model="scripted", endpoint="/v1/chat/completions", levels=[1], step_seconds=1.0,
                        prompt_tokens=8, output_tokens=10, length_spread=0)
        res = run_ramp(spec, timeout=60)
    recs = [r for r in res.records if r.ok]
    assert recs
    for r in recs:
        assert r.ttft == pytest.approx(0.05, abs=0.03) and r.ttfa == pytest.approx(0.2, abs=0.03)
        assert r.reasoning_tokens == 6 and r.output_tokens == 10
    st = res.steps[0]
    assert st.ttfa_p50 > st.ttft_p50 + 0.1 and st.reasoning_tokens_mean == 6


def test_the_sim_streams_reasoning_before_the_answer():
    """``--sim-reasoning-tokens 24``: each chat completion's first 24 tokens come as
    ``delta.reasoning``, the rest as ``delta.content``; the level's TTFA is later than its
    TTFT by about 24 decode steps, and 24 reasoning tokens per request."""
    from app.run.controller import LaunchTarget, RunController
    from tests.unit.test_capacity import DEMO, DEMO_RIG

    ctl = RunController()
    try:
        assert ctl.launch(LaunchTarget("sim", DEMO, sim_args=[*DEMO_RIG, "--sim-reasoning-tokens", "24"],
                                       telemetry=False)) == []
        assert ctl.wait_ready(60), ctl.failure_text
        spec = RampSpec(url=ctl.url, model="llama70", endpoint="/v1/chat/completions", levels=[2], step_seconds=0.5,
                        prompt_tokens=64, output_tokens=40, length_spread=0)
        res = run_ramp(spec, timeout=60)
    finally:
        ctl.stop()
        ctl.close()
    recs = [r for r in res.records if r.ok]
    assert recs and all(r.reasoning_tokens == 24 and r.output_tokens == 40 for r in recs)
    st = res.steps[0]
    itl = st.itl_p50 or 0.0
    assert st.ttfa_p50 > st.ttft_p50 + 15 * itl and st.reasoning_tokens_mean == 24
