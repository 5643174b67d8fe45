"""The process-starting half of tests/unit/test_security_secrets.py (the tier rule: tests/plugins/tiers.py)."""
from __future__ import annotations
import argparse
import os
import pytest
from app.cli.common import apply_api_key_file
from app.config import ServerConfig
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore
from tests.unit.test_security_secrets import SECRET, assert_absent


@pytest.mark.parametrize("how", ["environment", "key file", "config env"])
def test_a_key_reaches_the_server_environment_but_no_argv_and_no_stored_byte(tmp_path, monkeypatch, how):
    """The attack end to end on real processes: the sim server (which enforces the key on
    /v1) is launched through the run controller with the key from the app's environment,
    from --api-key-file, or in ServerConfig.env (the window's env box); its environ holds
    the key, /proc/<pid>/cmdline of the server and of the reaper do not; a ramp gets
    through (the load generator authenticated), and no file the run wrote holds the key."""
    monkeypatch.setenv("VLLM_API_KEY", "placeholder")
    env = {}
    if how == "environment":
        monkeypatch.setenv("VLLM_API_KEY", SECRET)
    elif how == "key file":
        f = tmp_path / "key"
        f.write_text(SECRET + "\n")
        f.chmod(0o600)
        apply_api_key_file(argparse.Namespace(api_key_file=str(f)))
    else:
        monkeypatch.delenv("VLLM_API_KEY")
        env = {"VLLM_API_KEY": SECRET}
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", max_num_seqs=8,
                       max_model_len=2048, env=env)
    rig = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "1", "--sim-time-scale", "20", "--sim-seed", "1"]
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    with RunStore(store_dir / "runs.sqlite") as store:
        ctl = RunController(store=store)
        try:
            assert ctl.launch(LaunchTarget("sim", cfg, sim_args=rig, telemetry=False, grace=5),
                              check_leftovers=False) == []
            assert ctl.wait_ready(60), ctl.failure_text
            sup = ctl.supervisor
            assert ctl.url.startswith("http://127.0.0.1:")
            for pid in (sup.server_pid, sup.pgid):
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read()
                assert SECRET.encode() not in argv, argv
            with open(f"/proc/{sup.server_pid}/environ", "rb") as fh:
                assert f"VLLM_API_KEY={SECRET}".encode() in fh.read().split(b"\0")
            spec = RampSpec(url=ctl.url, model="q7", levels=[1], step_seconds=4, prompt_tokens=32, output_tokens=8)
            out = ctl.ramp(spec, record=RecordSpec(name="attack"), timeout=120)
            assert out.status == "done" and out.steps and out.steps[0].n_ok > 0, out.stop_reason
            run = store.get_run(out.run_id)
            assert SECRET not in str(run["config"])
        finally:
            assert ctl.close() == []
    assert_absent([store_dir, os.environ["VLLM_DYNO_HOME"]], SECRET)
