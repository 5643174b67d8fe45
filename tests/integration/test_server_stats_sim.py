"""The server's own figures per level against the simulated rig over real HTTP, time-scaled
(issue 20, item 6): the load generator reads the sim's ``/metrics`` at the edges of each
level's window; the sim's histograms are in rig seconds, the client's figures become rig
seconds in the run controller (docs/design.md, "Sim time"), and the two must agree within
the histogram's bucket resolution; the level's ``server`` object reaches the run store,
the JSON export and the CLI's table."""
from __future__ import annotations

import json

from app.cli.common import server_table
from app.config import ServerConfig
from app.loadgen import export
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore

K = 4.0
RIG = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1", "--sim-time-scale", str(K), "--sim-seed", "3"]
CFG = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", max_num_seqs=4, max_model_len=4096)


def _within(client: float, bucket: list[float], k: float) -> bool:
    """``client`` (rig s) lies in the server's bucket, widened by the client's own HTTP
    overhead: up to 15 wall milliseconds on a loaded 2-core machine (5 when idle), × k
    in rig seconds."""
    return bucket[0] - 0.015 * k <= client <= bucket[1] + 0.015 * k


def test_sim_levels_carry_the_servers_figures_in_rig_seconds(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store)
        try:
            assert ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG, telemetry=False)) == []
            assert ctl.wait_ready(60), ctl.failure_text
            assert ctl.time_scale == K
            # level 8 is twice max_num_seqs: half the users queue in the engine
            spec = RampSpec(url=ctl.url, model="q7", levels=[1, 8], step_seconds=24, warmup_seconds=2,
                            prompt_tokens=512, output_tokens=64)
            out = ctl.ramp(spec, record=RecordSpec(name="server figures"), timeout=120)
        finally:
            ctl.close()
        assert out.status == "done", out.stop_reason
        one, eight = out.steps
        for st in out.steps:
            sv = st.server
            assert sv is not None, st
            assert sv.prefix_cache_reset in (None, True)  # None while the sim offers no POST /reset_prefix_cache
            assert sv.ttft_count > 0 and sv.itl_count > 0 and sv.queue_count > 0
            # like with like: both in rig seconds (the client's wall figures × k)
            assert _within(st.ttft_p50, sv.resolution["ttft_p50"], K), (st.ttft_p50, sv.resolution, sv.ttft_p50)
            assert _within(st.itl_p50, sv.resolution["itl_p50"], K), (st.itl_p50, sv.resolution, sv.itl_p50)
            assert st.ttft_mean > sv.ttft_mean - 0.015 * K  # the client's adds HTTP: never much below
            # tokens counted by the server's rule over the same instants agree within a few steps' tokens
            assert abs(sv.client_output_tokens - sv.generation_tokens) <= 0.05 * sv.generation_tokens + 8, sv
            assert abs(sv.client_prompt_tokens - sv.prompt_tokens) <= 0.05 * sv.prompt_tokens + 512 * 2, sv
            assert sv.notes and any(n.startswith("TTFT:") for n in sv.notes)
            assert 20 < sv.scrape_end - sv.scrape_start < 26  # rig seconds: the 24 s window
        # 8 users on 4 slots: queueing is most of the server's TTFT; 1 user does not queue
        assert eight.server.queue_mean > 0.5 * eight.server.ttft_mean
        assert any(n.startswith("queueing:") for n in eight.server.notes), eight.server.notes
        assert one.server.queue_mean < 0.5 * one.server.ttft_mean
        stored = store.levels(out.run_id)
        assert [d["server"]["ttft_count"] for d in stored] == [one.server.ttft_count, eight.server.ttft_count]
        assert stored[1]["server"]["notes"] == eight.server.notes
    export.write_json(tmp_path / "r.json", out, spec, time_scale=K)
    steps = json.loads((tmp_path / "r.json").read_text())["steps"]
    for d in steps:
        assert {"prefix_cache_hit_rate", "spec_decode_acceptance_rate", "ttft_p50", "itl_p50",
                "queue_p99"} <= set(d["server"])
        assert d["server"]["spec_decode_acceptance_rate"] is None  # not speculating
        assert d["ttft_p50"] is not None  # the client's figures keep their keys at the level's top
    table = server_table(steps)
    assert "TTFT p50 ms c/s" in table and "‡" in table


def test_count_limited_and_rate_levels_read_the_window_too():
    """A level that ends at its request count is read again after its last request; a
    request-rate level's window starts after its warm-up, without settling."""
    ctl = RunController()
    try:
        assert ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG, telemetry=False)) == []
        assert ctl.wait_ready(60), ctl.failure_text
        count = ctl.ramp(RampSpec(url=ctl.url, model="q7", levels=[2], step_seconds=None, requests_per_level=12,
                                  warmup_seconds=1, prompt_tokens=128, output_tokens=32), timeout=120)
        rate = ctl.ramp(RampSpec(url=ctl.url, model="q7", mode="rate", levels=[2.0], step_seconds=16,
                                 warmup_seconds=2, prompt_tokens=128, output_tokens=32), timeout=120)
    finally:
        ctl.close()
    for out in (count, rate):
        assert out.status == "done", out.stop_reason
        (st,) = out.steps
        sv = st.server
        assert sv is not None and sv.ttft_count > 0
        # every request the client measured finished inside the server's window, give or take the edges
        assert abs(sv.requests_finished - st.n_ok) <= 3, (sv.requests_finished, st.n_ok)
        assert abs(sv.client_output_tokens - sv.generation_tokens) <= 0.05 * sv.generation_tokens + 8, sv
    assert count.steps[0].stop_reason == "count" and count.steps[0].n_measured == 12


def test_a_server_without_metrics_has_no_server_figures_and_says_so():
    """A plain OpenAI-compatible server (no /metrics, no /reset_prefix_cache): the levels
    run as before, ``server`` stays None, and the summary says it once."""
    from app.loadgen.generator import run_ramp
    from app.loadgen.server_stats import server_summary
    from tests.loadgen_server import Script, ScriptedServer

    with ScriptedServer(Script(ttft=0.02, itl=0.005)) as srv:
        res = run_ramp(RampSpec(url=srv.url, model="scripted", levels=[1, 2], step_seconds=1.5,
                                warmup_seconds=0.3, prompt_tokens=16, output_tokens=8), timeout=60)
    assert res.status == "done", res.stop_reason
    assert [st.server for st in res.steps] == [None, None] and all(st.n_ok for st in res.steps)
    assert [st.server_problem for st in res.steps] == ["GET /metrics: HTTP 404"] * 2
    assert server_summary(res.steps) == [
        "the server's /metrics did not answer (GET /metrics: HTTP 404; not vLLM?): the levels have no "
        "server-side figures"]


def test_attached_before_the_sim_answered_still_measures_in_rig_seconds():
    """``vllm-dyno ramp`` attached while the sim was still starting (``/sim/info`` refused):
    the ramp asks again, so its levels are in rig seconds and agree with the server's."""
    from app.server.launch import free_port

    port = free_port()
    ctl, rig = RunController(), RunController()
    try:
        ctl.launch(LaunchTarget("attach", ServerConfig(model="q7"), attach_url=f"http://127.0.0.1:{port}",
                                telemetry=False))
        assert ctl.time_scale == 1.0  # nothing answered yet
        assert rig.launch(LaunchTarget("sim", CFG.model_copy(update={"port": port}), sim_args=RIG,
                                       telemetry=False)) == []
        assert rig.wait_ready(60), rig.failure_text
        out = ctl.ramp(RampSpec(url=ctl.url, model="q7", levels=[2], step_seconds=12, warmup_seconds=1,
                                prompt_tokens=128, output_tokens=32), timeout=120)
    finally:
        ctl.close()
        rig.close()
    assert out.status == "done", out.stop_reason
    assert ctl.time_scale == K and out.time_scale == K
    st = out.steps[0]
    assert _within(st.ttft_p50, st.server.resolution["ttft_p50"], K), (st.ttft_p50, st.server.resolution)
