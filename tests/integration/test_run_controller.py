"""The run controller on real processes (the simulated rig through the Supervisor, a real
SQLite run store): several ramps on one launch and several launches in one session (the
tuner needs both), one run per recorded ramp with its levels written once in rig
seconds, and a failed launch diagnosed once, structured (code, evidence, fix)."""
from __future__ import annotations

import threading

import pytest

from app.config import ServerConfig
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController, RunListener, State
from app.store import RunStore

K = 10.0
RIG = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "2", "--sim-time-scale", str(K), "--sim-seed", "1"]
CFG = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", tensor_parallel_size=2, max_num_seqs=16,
                   max_model_len=4096)


class Events(RunListener):
    def __init__(self) -> None:
        self.states: list[State] = []
        self.failures: list = []
        self.levels: list = []
        self.done: list = []
        self.failed = threading.Event()

    def on_state(self, state, reason):
        self.states.append(state)

    def on_launch_failed(self, reason, diagnosis):
        self.failures.append((reason, diagnosis))
        self.failed.set()

    def on_level(self, st):
        self.levels.append(st)

    def on_ramp_done(self, outcome):
        self.done.append(outcome)


def _spec(url: str, levels) -> RampSpec:
    return RampSpec(url=url, model="q7", levels=levels, step_seconds=10, warmup_seconds=1, prompt_tokens=64,
                    output_tokens=16)


def test_several_ramps_on_one_launch_and_several_launches(tmp_path):
    ev = Events()
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store, listener=ev)
        try:
            for launch in range(2):
                assert ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG, telemetry=launch == 0)) == []
                assert ctl.wait_ready(60), ctl.failure_text
                assert ctl.time_scale == K  # asked once, from /sim/info
                outs = [ctl.ramp(_spec(ctl.url, lv), record=RecordSpec(name=f"launch {launch} ramp {i}"),
                                 timeout=120) for i, lv in enumerate(([1], [1, 2]) if launch == 0 else ([2],))]
                assert all(o.status == "done" for o in outs), [o.stop_reason for o in outs]
                with pytest.raises(RuntimeError, match="already running"):
                    ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG))
                assert ctl.stop() == []
                assert ctl.state == State.STOPPED and not ctl.ready
        finally:
            ctl.close()
        runs = sorted(store.list_runs(), key=lambda r: r["id"])
        assert [r["name"] for r in runs] == ["launch 0 ramp 0", "launch 0 ramp 1", "launch 1 ramp 0"]
        assert all(r["status"] == "done" and r["engine"] == "sim" for r in runs)
        for r, levels in zip(runs, ([1.0], [1.0, 2.0], [2.0])):
            stored = store.levels(r["id"])
            assert [d["level"] for d in stored] == levels  # once each
            assert all(8 < d["window_s"] < 12 for d in stored), stored  # rig seconds (1 s of wall time)
            run = store.get_run(r["id"])
            assert run["summary"]["time_scale"] == K and run["summary"]["gpu_count"] == 2
            assert run["config"]["argv"] and run["capacity"]["kv_cache_tokens"] > 0
        # telemetry ran on the first launch only, and its samples went to that launch's runs
        assert store.samples(runs[0]["id"]) and not store.samples(runs[2]["id"])
    assert len(ev.done) == 3 and [s.level for s in ev.levels] == [1.0, 1.0, 2.0, 2.0]
    assert ev.states.count(State.STOPPING) == 2  # once per stop (the supervisor's own news is not repeated)


def test_an_attached_sim_is_recorded_as_the_sim_with_its_cards_power(tmp_path):
    """Attach mode (``vllm-dyno ramp``) against a simulated rig: the run is the sim's,
    with its cards' telemetry (power, so J/token) from the rig's HTTP source."""
    with RunStore(tmp_path / "runs.sqlite") as store:
        rig = RunController()
        try:
            rig.launch(LaunchTarget("sim", CFG, sim_args=RIG, telemetry=False))
            assert rig.wait_ready(60), rig.failure_text
            ctl = RunController(store=store)
            try:
                ctl.launch(LaunchTarget("attach", ServerConfig(model="q7"), attach_url=rig.url, use_nvml=False,
                                        gpu_interval=0.1))
                assert ctl.time_scale == K
                out = ctl.ramp(_spec(ctl.url, [2]), record=RecordSpec(name="attached"), timeout=120)
            finally:
                ctl.close()
        finally:
            rig.close()
        assert out.status == "done", out.stop_reason
        run = store.get_run(out.run_id)
        assert run["engine"] == "sim" and run["summary"]["gpu_count"] == 2
        assert store.samples(out.run_id, name="power_w")


def test_a_failed_launch_is_diagnosed_once_with_code_evidence_and_fix():
    ev = Events()
    ctl = RunController(listener=ev)
    try:
        # the demo model holds 4096 positions; the rig refuses more, as vLLM does
        bad = CFG.model_copy(update={"max_model_len": 200000})
        ctl.launch(LaunchTarget("sim", bad, sim_args=RIG, telemetry=False))
        assert ev.failed.wait(60)
        assert not ctl.wait_ready(1) and ctl.state == State.FAILED
    finally:
        assert ctl.close() == []
    (reason, diag), = ev.failures
    assert diag is not None and diag.problem == "max_model_len_exceeds_model"
    assert diag.evidence and diag.fix.get("max_model_len")
    assert "Diagnosis: max_model_len_exceeds_model" in ctl.failure_text
    with pytest.raises(RuntimeError, match="no server is ready"):
        ctl.start_ramp(_spec("http://127.0.0.1:1", [1]))


def test_an_engine_that_dies_under_a_ramp_fails_the_run_with_the_cause_after_ready(tmp_path):
    """Issue 16 item 9: the rig's engine dies on its 3rd request (vLLM 0.32's lines, then the
    API server exits with code 0 as vLLM's does). The run is recorded as server_failed with the
    post-ready diagnosis (the CUDA error of the engine's traceback), once, and nothing is left."""
    ev = Events()
    with RunStore(tmp_path / "runs.sqlite") as store:
        ctl = RunController(store=store, listener=ev)
        try:
            ctl.launch(LaunchTarget("sim", CFG, sim_args=RIG + ["--sim-engine-dies-at-request", "3"], telemetry=False))
            assert ctl.wait_ready(60), ctl.failure_text
            out = ctl.ramp(_spec(ctl.url, [2, 4]), record=RecordSpec(name="dies"), timeout=120)
            assert ctl.state == State.FAILED
        finally:
            assert ctl.close() == []
        assert out.status == "server_failed" and not out.ok
        assert out.stop_reason.startswith("the server was ready, then exited with code 0")
        (reason, diag), = ev.failures
        assert diag.problem == "engine_runtime_error" and diag.after_ready
        assert diag.evidence[0].endswith("RuntimeError: CUDA error: an illegal memory access was encountered")
        assert "Diagnosis: engine_runtime_error — the server was ready, then the engine died on a request" \
            in out.stop_reason
        run = store.get_run(out.run_id)
        assert run["status"] == "server_failed" and run["summary"]["stop_reason"] == out.stop_reason
        assert any(not r.ok for r in out.records)


def test_a_dead_engine_behind_a_live_api_server_is_found_by_health(tmp_path):
    """With VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 the API server stays up and answers /health 503:
    the supervisor's check after ready (no ramp running) fails it and stops the server."""
    import json
    import urllib.error
    import urllib.request

    ev = Events()
    ctl = RunController(listener=ev)
    cfg = CFG.model_copy(update={"env": {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}})
    try:
        ctl.launch(LaunchTarget("sim", cfg, sim_args=RIG + ["--sim-engine-dies-at-request", "1"], telemetry=False))
        assert ctl.wait_ready(60), ctl.failure_text
        ctl.supervisor.ready_health_interval = 0.5
        req = urllib.request.Request(ctl.url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "q7", "prompt": "hello", "max_tokens": 4}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 500
        assert "EngineCore encountered an issue" in e.value.read().decode()
        assert ev.failed.wait(30)
        assert ctl.state == State.FAILED and ctl.supervisor.failure is not None
    finally:
        assert ctl.close() == []
    (reason, diag), = ev.failures
    assert reason.startswith("the server was ready, then /health answered 503")
    assert diag.problem == "engine_runtime_error" and diag.after_ready


def test_vllm_dyno_ramp_against_a_server_whose_engine_dies_says_so(capsys):
    """`vllm-dyno ramp` attaches (the server's log is not its own): the rig's engine dies on the
    4th request and its API server exits; the ramp ends as server_failed, saying the server was
    ready and then stopped answering, with what the failed requests said (vLLM's EngineDeadError
    message), and exits 1."""
    from app.cli import main

    rig = RunController()
    try:
        rig.launch(LaunchTarget("sim", CFG, sim_args=RIG + ["--sim-engine-dies-at-request", "4"], telemetry=False))
        assert rig.wait_ready(60), rig.failure_text
        url = rig.url
        rc = main(["ramp", "--url", url, "--model", "q7", "--levels", "2,4", "--step-seconds", "10",
                   "--prompt-tokens", "64", "--output-tokens", "16", "--no-store"])
    finally:
        rig.close()
    out, err = capsys.readouterr()
    assert rc == 1, (out, err)
    assert f"ramp server_failed: the server at {url} was ready, then " in out
    assert "Diagnosis: engine_dead — the server was ready, then " in out
    assert "EngineCore encountered an issue. See stack trace (above) for the root cause." in out
    assert "its engine died" in out and "vllm-dyno diagnose LOGFILE" in out
