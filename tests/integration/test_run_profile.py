"""ProfileRun (``vllm-dyno run``) through the run controller: plan → launch → ready →
ramp → record → stop, on real processes (the sim server, a scripted aiohttp server for
engine attach) and a real SQLite run store."""
from __future__ import annotations

import threading

import pytest

from app.history import export_json, profile_from_run
from app.profiles import ProfileLibrary, parse_profile
from app.loadgen.stats import to_rig_time
from app.run.profile_run import Phase, ProfileRun, RunResult
from app.store import RunStore
from tests.loadgen_server import Script, ScriptedServer

SIM = """\
schema_version: 1
name: sim small
engine: sim
sim: {gpu: RTX 4090, count: 2, time_scale: 10, seed: 1}
server:
  model: Qwen/Qwen2.5-7B-Instruct
  served-model-name: q7
  tensor-parallel-size: 2
  max-num-seqs: 16
  max-model-len: 4096
ramp: {levels: [1, 4], step_seconds: 15, prompt_tokens: 128, output_tokens: 32}
hardware: {gpu: RTX 4090, count: 2}
"""


def _attach(url: str, levels="[1, 2]", step=0.6) -> str:
    return (f"name: attached\nengine: attach\nattach_url: {url}\nserver: {{model: scripted}}\n"
            f"ramp: {{levels: {levels}, step_seconds: {step}, prompt_tokens: 16, output_tokens: 8}}\n")


@pytest.fixture
def store(tmp_path):
    with RunStore(tmp_path / "runs.sqlite") as s:
        yield s


def test_sim_session_records_everything(store):
    phases: list[Phase] = []
    levels = []
    s = ProfileRun(parse_profile(SIM), store=store, startup_timeout=120, grace=5,
                on_phase=lambda ph, msg: phases.append(ph), on_level=levels.append)
    res = s.run()
    assert res.ok, res.reason
    assert res.status == "done" and res.run_id is not None
    assert [p for p in phases if p in (Phase.PLANNING, Phase.LAUNCHING, Phase.READY, Phase.RAMPING,
                                       Phase.STOPPING, Phase.DONE)] == [
        Phase.PLANNING, Phase.LAUNCHING, Phase.READY, Phase.RAMPING, Phase.STOPPING, Phase.DONE]
    assert s.supervisor.state.value == "stopped" and s.supervisor.leftovers == []
    assert res.time_scale == 10.0
    assert [st.level for st in res.steps] == [1.0, 4.0] and len(levels) == 2
    run = store.get_run(res.run_id)
    assert run["status"] == "done" and run["engine"] == "sim"
    assert run["config"]["profile"]["name"] == "sim small" and run["config"]["argv"]
    assert run["plan"]["verdict"] in ("ok", "warn")
    assert run["capacity"]["kv_cache_tokens"] > 0
    summ = run["summary"]
    assert summ["gpu_count"] == 2 and summ["hardware"]["gpu"] == "RTX 4090" and summ["time_scale"] == 10.0
    assert summ["results"]["levels"][0]["level"] == 1.0
    # stored levels are in rig seconds, written once
    stored = store.levels(res.run_id)
    assert [d["output_tps"] for d in stored] == pytest.approx([st.output_tps for st in res.steps])
    assert len(store.requests(res.run_id)) > 0
    assert any("KV cache size" in line for _, _, line in store.log_lines(res.run_id))
    assert any(name == "power_w" for _, src, name, _ in store.samples(res.run_id))
    # the finished run becomes a profile with its results and fingerprint
    p = profile_from_run(store, res.run_id, "sim small (measured)")
    assert p.results.run_id == res.run_id and p.results.peak_output_tps > 0
    assert p.hardware.gpu == "RTX 4090" and p.hardware.recorded_at is not None
    assert p.server == parse_profile(SIM).server
    ProfileLibrary().save(p)
    assert ProfileLibrary().get("sim small (measured)").results.levels
    assert export_json(store, res.run_id)["requests"]


def test_attach_session_and_ramp_overrides(store):
    with ScriptedServer(Script(ttft=0.02, itl=0.005)) as srv:
        res = ProfileRun(parse_profile(_attach(srv.url)), store=store, ramp_overrides={"levels": [2]},
                      telemetry=False).run()
    assert res.status == "done", res.reason
    assert [st.level for st in res.steps] == [2.0]
    assert srv.max_in_flight == 2
    run = store.get_run(res.run_id)
    assert run["engine"] == "attach" and run["spec"]["levels"] == [2.0]
    assert run["summary"]["hardware"] is None


def test_abort_keeps_what_was_recorded(store):
    with ScriptedServer(Script(ttft=0.02, itl=0.01)) as srv:
        s = ProfileRun(parse_profile(_attach(srv.url, "[1, 2, 4]", 30)), store=store, telemetry=False)
        started = threading.Event()
        s.on_level_start = lambda ev: started.set()
        box: dict = {}
        t = threading.Thread(target=lambda: box.setdefault("r", s.run()))
        t.start()
        assert started.wait(30)
        s.abort()
        t.join(60)
    res: RunResult = box["r"]
    assert res.status == "aborted" and not res.ok
    assert store.get_run(res.run_id)["status"] == "aborted"


def test_launch_failure_is_recorded(store, tmp_path):
    prof = parse_profile(f"name: broken\nserver: {{model: {tmp_path}/no-such-model}}\n")
    res = ProfileRun(prof, store=store, telemetry=False).run()
    assert res.status == "launch_failed" and "does not exist" in res.reason
    run = store.get_run(res.run_id)
    assert run["status"] == "launch_failed" and run["summary"]["stop_reason"] == res.reason


def test_planner_error_refuses_before_anything_runs(store):
    prof = parse_profile("name: bad tp\nserver: {model: Qwen/Qwen2.5-7B-Instruct, tensor-parallel-size: 3}\n"
                         "hardware: {gpu: RTX 4090, count: 4}\n")
    res = ProfileRun(prof, store=store).run()
    assert res.status == "plan_error" and res.run_id is None
    assert "tensor_parallel_size 3" in res.reason
    assert store.list_runs() == []


def test_to_rig_time_scales_times_and_rates():
    from app.loadgen.stats import StepStats

    st = StepStats(idx=0, level=4, t_start=1, t_end=3, window_start=1, window_end=3, window_s=2, output_tps=1000,
                   rps=10, ttft_p99=0.05, tpot_p99=None)
    r = to_rig_time(st, 10)
    assert r.window_s == 20 and r.output_tps == 100 and r.rps == 1 and r.ttft_p99 == pytest.approx(0.5)
    assert r.tpot_p99 is None and to_rig_time(st, 1.0) is st


def test_an_slo_stop_is_reported_in_rig_seconds():
    """A sim at time scale 4 checks the SLO ÷ 4 against wall times; the user wrote and reads
    rig seconds: "ttft_p99 3.03 s > 2 s", not "0.757 s > 0.5 s"."""
    from app.loadgen.spec import SLO, slo_to_wall
    from app.loadgen.stats import StepStats, rig_stop_reason, slo_breaches, slo_stop_reason

    wall = StepStats(idx=3, level=8, t_start=1, t_end=6, window_start=1, window_end=6, window_s=5, output_tps=600,
                     rps=2, ttft_p99=0.757, tpot_p99=0.02)
    wall.slo_broken = slo_breaches(wall, slo_to_wall(SLO(ttft_p99=2.0, tpot_p99=0.1), 4.0))
    assert wall.slo_broken == ["ttft_p99 0.757 s > 0.5 s"]
    rig = to_rig_time(wall, 4.0)
    assert rig.slo_broken == ["ttft_p99 3.03 s > 2 s"]
    assert rig.slo_broken == slo_breaches(rig, SLO(ttft_p99=2.0, tpot_p99=0.1))
    reason = rig_stop_reason("slo_broken", slo_stop_reason(wall), [rig])
    assert reason == "SLO broken at level 8: ttft_p99 3.03 s > 2 s"
    assert rig_stop_reason("done", "all levels done", [rig]) == "all levels done"


def test_vllm_dyno_run_records_a_death_after_ready_as_server_failed(tmp_path, monkeypatch, capsys):
    """Issue 16 item 9: `vllm-dyno run` of a sim profile whose engine dies on the 5th request
    (the rig's --sim-engine-dies-at-request, added to the profile's rig here): status
    server_failed with the post-ready diagnosis, printed and recorded, exit 1."""
    from app.cli import main
    from app.profiles.model import SimRig

    argv = SimRig.argv
    monkeypatch.setattr(SimRig, "argv", lambda self: argv(self) + ["--sim-engine-dies-at-request", "5"])
    prof = tmp_path / "sim.yaml"
    prof.write_text(SIM)
    assert main(["run", str(prof)]) == 1
    out = capsys.readouterr().out
    assert "status: server_failed — the server was ready, then exited with code 0: its engine died" in out
    assert "Diagnosis: engine_runtime_error — the server was ready, then the engine died on a request" in out
    with RunStore() as store:
        run = store.list_runs()[0]
        assert run["status"] == "server_failed"
        assert "RuntimeError: CUDA error: an illegal memory access was encountered" in run["summary"]["stop_reason"]
